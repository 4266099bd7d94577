"""restore.sh's decision for a point in time Litestream refuses (a time before an object's first
replicated file, and one after its newest): which transaction the object had reached by then,
or that it did not exist yet. Litestream lists a file's time to the second; the file's header
holds its newest transaction's time in milliseconds. Here the replica is a directory of LTX
files whose headers hold chosen times, laid out as Litestream's file replica lays them out."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

RESTORE = Path(__file__).resolve().parents[2] / "deploy" / "litestream" / "restore.sh"
BASE = datetime(2026, 12, 5, 21, 9, 14, tzinfo=UTC)


def _state_at_program() -> str:
    """The Python that restore.sh runs to decide (its STATE_AT variable)."""
    found = re.search(r"^STATE_AT='\n(.*?)^'$", RESTORE.read_text(), re.S | re.M)
    assert found is not None
    return found.group(1)


File = tuple[int, int, int, float] | tuple[int, int, int, float, float]


def _replica(root: Path, files: list[File]) -> str:
    """LTX files (level, first txid, last txid, seconds after BASE of the last transaction, and
    of the file's upload when later: S3 lists that) under `root`; returns their listing as
    `litestream ltx -json` prints it."""
    listing = []
    for level, first, last, seconds, *uploaded in files:
        written = BASE + timedelta(seconds=seconds)
        listed = BASE + timedelta(seconds=uploaded[0] if uploaded else seconds)
        path = root / "ltx" / str(level) / f"{first:016x}-{last:016x}.ltx"
        path.parent.mkdir(parents=True, exist_ok=True)
        header = b"LTX1" + bytes(28) + int(written.timestamp() * 1000).to_bytes(8, "big")
        path.write_bytes(header + bytes(60))
        stamp = listed.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
        listing.append(
            {"level": level, "min_txid": f"{first:016x}", "max_txid": f"{last:016x}", "size": 100, "timestamp": stamp}
        )
    return json.dumps(listing)


def _decide(root: Path, files: list[File], seconds: float, *, let_go: int | None = None) -> str:
    """The decision for a time `seconds` after BASE; `let_go`: the index of a listed file that
    the replicator removed before the decision read it."""
    at = (BASE + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    listing = _replica(root, files)
    if let_go is not None:
        level, first, last, *_ = files[let_go]
        (root / "ltx" / str(level) / f"{first:016x}-{last:016x}.ltx").unlink()
    done = subprocess.run(
        [sys.executable, "-c", _state_at_program(), at, str(root), "", "us-east-1"],
        input=listing,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


# Two L0 files: txid 1 written at +0.239 s, txid 2 at +4.233 s.
TWO: list[File] = [(0, 1, 1, 0.239), (0, 2, 2, 4.233)]


@pytest.mark.parametrize(
    ("seconds", "state"),
    [
        (-0.1, "none"),  # before the object's first transaction
        (0.2, "none"),  # in its first file's second, before its header's time
        (0.3, "txid 0000000000000001"),  # in that second, after it
        (4.1, "txid 0000000000000001"),  # in the newest file's second, before it
        (4.25, "txid 0000000000000002"),
        (60, "txid 0000000000000002"),  # long after: unchanged since (Litestream refuses it)
    ],
)
def test_the_state_at_a_time_is_the_newest_transaction_made_by_then(tmp_path: Path, seconds: float, state: str) -> None:
    assert _decide(tmp_path, TWO, seconds) == state


def test_a_file_written_after_the_time_is_not_counted_though_listed_in_its_second(tmp_path: Path) -> None:
    """A replicator still running adds files between Litestream's refusal and the listing: one
    written after the time does not turn an unchanged object into one "created after"."""
    assert _decide(tmp_path, [*TWO, (0, 3, 3, 60.5)], 60.2) == "txid 0000000000000002"


def test_an_object_whose_first_transaction_only_a_snapshot_holds_is_not_skipped(tmp_path: Path) -> None:
    """A snapshot's time is when it was taken: an object older than every file left by retention
    may have existed at the time, so restore.sh fails rather than leaves it out."""
    state = _decide(tmp_path, [(9, 1, 5, 3_600), (0, 6, 6, 3_700)], 10)
    assert state.startswith("its replica holds no state of it from before 2026-12-05T22:09:14Z")


def test_compacted_files_count_by_their_newest_transaction(tmp_path: Path) -> None:
    """A level-1 file holds transactions 1-4, its header the time of the fourth, and their L0
    files are gone: a time between them is told only to that level's precision (documented),
    the object taken as created after it."""
    files = [(1, 1, 4, 20), (0, 5, 5, 25.5)]
    assert _decide(tmp_path, files, 21) == "txid 0000000000000004"
    assert _decide(tmp_path, files, 19) == "none"
    assert _decide(tmp_path, files, 26) == "txid 0000000000000005"


def test_a_replica_with_no_files_holds_nothing_to_restore(tmp_path: Path) -> None:
    assert _decide(tmp_path, [], 0) == "its replica holds no files"


def test_a_compacted_file_uploaded_long_after_its_transactions_counts_by_them(tmp_path: Path) -> None:
    """The PITR audit, S3: the object's only file left for its first transaction was a level-1
    file compacted (and listed) 16 s after it; a time 10 s after the transaction was taken for
    one before the object existed, and the object skipped."""
    files: list[File] = [(1, 1, 1, 3.684, 20), (0, 2, 2, 62)]
    assert _decide(tmp_path, files, 13.4) == "txid 0000000000000001"
    assert _decide(tmp_path, files, 3.6) == "none"


def test_the_last_file_made_by_a_time_is_found_among_many(tmp_path: Path) -> None:
    files: list[File] = [(0, n, n, n + 0.2) for n in range(1, 200)]
    files += [(1, 1, 30, 30.2, 45), (1, 31, 60, 60.2, 75), (2, 1, 60, 60.2, 300)]
    for seconds, txid in ((0.5, 0), (25.5, 25), (30.1, 29), (61, 60), (150.3, 150), (500, 199)):
        assert _decide(tmp_path, files, seconds) == (f"txid {txid:016x}" if txid else "none"), seconds


def test_a_file_let_go_while_the_decision_reads_it_asks_for_a_new_listing(tmp_path: Path) -> None:
    """A replicator still running lets expired files go: the header read failed and the object
    with it. The decision now says so, and restore.sh lists the replica again (three times)."""
    assert _decide(tmp_path, TWO, 0.3, let_go=0).startswith("listed file gone: ")
