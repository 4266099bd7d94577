"""The journal of objects moved away (storage/moved.py): what a restart reads back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from sessions_server.storage.moved import MOVED_FILE_NAME, REWRITE_SLACK_LINES, MovedObjects


def test_moves_and_returns_are_read_back_after_a_restart(tmp_path: Path) -> None:
    moved = MovedObjects(tmp_path)
    moved.record("a", "10.0.0.2:50051")
    moved.record("b/ü😀", "")
    moved.record("c", "10.0.0.3:50051")
    moved.forget("c")
    moved.forget("never moved")  # nothing to note
    again = MovedObjects(tmp_path)
    assert (again.where("a"), again.where("b/ü😀"), again.where("c")) == ("10.0.0.2:50051", "", None)
    assert len((tmp_path / MOVED_FILE_NAME).read_text(encoding="utf-8").splitlines()) == 4


def test_the_move_lock_a_delete_ended_is_kept_through_settles_compactions_and_returns(tmp_path: Path) -> None:
    moved = MovedObjects(tmp_path)
    moved.record("a", "there", "lock-a")
    moved.record("b", "elsewhere")  # a delete that named no lock
    moved.settle(["a", "b"])
    assert (MovedObjects(tmp_path).move_id("a"), MovedObjects(tmp_path).move_id("b")) == ("lock-a", "")
    for index in range(700):  # outdated lines enough for a compaction
        moved.record(f"k{index}", "x", f"lock-{index}")
        moved.forget(f"k{index}")
    moved.record("c", "far", "lock-c")
    again = MovedObjects(tmp_path)
    assert len((tmp_path / MOVED_FILE_NAME).read_text(encoding="utf-8").splitlines()) < 1_000
    assert [again.move_id(key) for key in ("a", "b", "c", "k1")] == ["lock-a", "", "lock-c", ""]
    again.forget("a")
    assert MovedObjects(tmp_path).move_id("a") == ""


def test_a_line_torn_by_a_crash_is_cut_off_and_later_records_stay_whole(tmp_path: Path) -> None:
    MovedObjects(tmp_path).record("a", "there")
    with (tmp_path / MOVED_FILE_NAME).open("ab") as out:
        out.write(b'{"key": "b", "t')  # the append a crash interrupted: never acknowledged
    after_crash = MovedObjects(tmp_path)
    assert (after_crash.where("a"), after_crash.where("b")) == ("there", None)
    after_crash.record("c", "elsewhere")
    again = MovedObjects(tmp_path)
    assert (again.where("a"), again.where("b"), again.where("c")) == ("there", None, "elsewhere")


def test_the_journal_is_compacted_once_most_of_it_is_outdated(tmp_path: Path) -> None:
    moved = MovedObjects(tmp_path)
    moved.record("stays", "there")
    for index in range(700):  # objects moved away and back: 1,400 outdated lines
        moved.record(f"k{index}", "x")
        moved.forget(f"k{index}")
    lines = (tmp_path / MOVED_FILE_NAME).read_text(encoding="utf-8").splitlines()
    assert len(lines) < 1_000
    again = MovedObjects(tmp_path)
    assert list(again) == ["stays"] and again.where("stays") == "there"


def test_a_refusal_noted_in_memory_only_is_not_kept(tmp_path: Path) -> None:
    moved = MovedObjects(tmp_path)
    moved.refuse("a", "there")
    assert moved.where("a") == "there"
    moved.refuse("a", None)
    assert moved.where("a") is None
    assert MovedObjects(tmp_path).where("a") is None


def test_a_start_looks_for_leftover_files_only_where_a_delete_may_have_been_cut_short(tmp_path: Path) -> None:
    """Every start stat'ed the file of every object ever moved away (10 s at a million). A
    delete that saw its files go notes it (`settle`); only the others are looked at again."""
    moved = MovedObjects(tmp_path)
    moved.record("done", "there")
    moved.settle(["done"])
    moved.record("cut short", "there")  # a crash before its files went
    moved.record("back", "there")
    moved.forget("back")
    again = MovedObjects(tmp_path)
    assert again.unsettled() == ["cut short"]
    assert (again.where("done"), again.where("cut short"), again.where("back")) == ("there", "there", None)
    again.settle(again.unsettled())
    assert MovedObjects(tmp_path).unsettled() == []


def test_a_lost_settle_line_means_one_more_look_and_the_record_stays(tmp_path: Path) -> None:
    moved = MovedObjects(tmp_path)
    moved.record("a", "there")
    moved.settle(["a"])
    journal = tmp_path / MOVED_FILE_NAME
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + lines[1][:-5])  # the unsynced settle line torn by a power cut
    again = MovedObjects(tmp_path)
    assert (again.where("a"), again.unsettled()) == ("there", ["a"])


def test_settled_lines_read_as_records_by_an_older_server(tmp_path: Path) -> None:
    """A server of an older version reads `{"key", "to"}` and treats a line without "to" as the
    object's return: a settle line must keep the key refused there too."""
    moved = MovedObjects(tmp_path)
    moved.record("a", "there")
    moved.settle(["a"])
    for line in (tmp_path / MOVED_FILE_NAME).read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        assert (entry["key"], entry["to"]) == ("a", "there")


def test_a_journal_of_an_older_version_is_looked_at_once_then_compacted(tmp_path: Path) -> None:
    count = REWRITE_SLACK_LINES + 10
    journal = _write_journal(tmp_path, [{"key": f"k{i}", "to": "x"} for i in range(count)])
    first = MovedObjects(tmp_path)
    assert len(first.unsettled()) == count
    first.settle(first.unsettled())
    assert len(journal.read_text(encoding="utf-8").splitlines()) == count  # rewritten, not doubled
    again = MovedObjects(tmp_path)
    assert again.unsettled() == [] and len(list(again)) == count


def test_a_compaction_while_the_event_loop_notes_refusals_keeps_them_all(tmp_path: Path) -> None:
    """The event loop's thread notes a refusal (`refuse`) while a worker thread's record may be
    compacting the journal: the compaction iterated the live table and could fail mid-way. (It
    now writes only what was recorded, a table changed under the journal's lock.)"""
    _write_journal(
        tmp_path, [entry for i in range(30_000) for entry in ({"key": f"k{i}", "to": "x"}, {"key": f"k{i}"})]
    )
    moved = MovedObjects(tmp_path)
    for index in range(20_000):  # refused ones for the compaction to go through
        moved.refuse(f"earlier{index}", "y")
    busy, stop = threading.Event(), threading.Event()

    def refuse_meanwhile() -> None:
        index = 0
        while not stop.is_set():
            moved.refuse(f"loop{index}", "y")
            index += 1
            busy.set()

    thread = threading.Thread(target=refuse_meanwhile)
    thread.start()
    try:
        busy.wait()
        moved.record("stays", "there")  # compacts first
    finally:
        stop.set()
        thread.join()
    assert MovedObjects(tmp_path).where("stays") == "there"


def _write_journal(data_dir: Path, entries: list[dict[str, str]]) -> Path:
    journal = data_dir / MOVED_FILE_NAME
    journal.write_text("".join(json.dumps(entry) + "\n" for entry in entries), encoding="utf-8")
    return journal


# A full disk, for real: the child process may not grow a file past its RLIMIT_FSIZE (EFBIG,
# which is told apart as out of space as ENOSPC is). A child of its own, as the limit is the
# whole process's.
_CAPPED = """
import resource, signal, sys
from pathlib import Path
from sessions_server.storage.moved import MOVED_FILE_NAME, MovedObjects, _line

data_dir = Path(sys.argv[1])
moved = MovedObjects(data_dir)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

def capped(limit, call):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        call()
        return "recorded"
    except OSError as exc:
        return f"refused: {exc.strerror}"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
"""


def _run_capped(data_dir: Path, scenario: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _CAPPED + textwrap.dedent(scenario), str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_an_append_the_disk_cut_short_is_cut_off_and_the_next_record_stays_readable(tmp_path: Path) -> None:
    """A record refused part-way (its delete answered "nothing was deleted") left its first bytes
    at the journal's end while the server ran on; the next record was glued to them, and the
    next start skipped that line as not a record: it forgot a move it had acknowledged."""
    printed = _run_capped(
        tmp_path,
        """
        moved.record("a", "there")
        size = (data_dir / MOVED_FILE_NAME).stat().st_size
        print(capped(size + 7, lambda: moved.record("b", "there")))  # 7 bytes of its line fit
        moved.record("c", "elsewhere")
        """,
    )
    assert printed == ["refused: File too large"]
    lines = (tmp_path / MOVED_FILE_NAME).read_bytes().splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["a", "c"]
    again = MovedObjects(tmp_path)
    assert (again.where("a"), again.where("b"), again.where("c")) == ("there", None, "elsewhere")


def test_a_compaction_writes_only_recorded_moves_not_a_refusal_whose_record_fails(tmp_path: Path) -> None:
    """A delete notes its refusal in memory, then records it. When that record compacted the
    journal first, the compacted file took the refusal from memory, durably; the append after
    it failed and the delete answered "nothing was deleted", yet the next start refused the
    object (its data still here) as moved away. Whatever a record answers, the journal says."""
    outdated = [entry for i in range(REWRITE_SLACK_LINES) for entry in ({"key": f"k{i}", "to": "x"}, {"key": f"k{i}"})]
    _write_journal(tmp_path, [{"key": "stays", "to": "there"}, *outdated])
    printed = _run_capped(
        tmp_path,
        """
        line = len(_line({"key": "K", "to": "B"}))
        compacted = len(_line({"key": "stays", "to": "there"}))
        compacted_with_k = compacted + len(_line({"key": "K", "to": "B", "gone": True}))
        moved.refuse("K", "B")  # as a delete does before its record
        # Room for a compaction that took K in from memory, not for K's line after it.
        print(capped(compacted_with_k + line - 1, lambda: moved.record("K", "B")))
        """,
    )
    (answer,) = printed
    again = MovedObjects(tmp_path)
    assert again.where("stays") == "there"
    assert again.where("K") == ("B" if answer == "recorded" else None), answer
