"""The move holds kept on disk (storage/move_holds.py): a write that fails changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessions_server.storage import move_holds
from sessions_server.storage.move_holds import DEPARTING_FILE_NAME, Arrival, Arrivals, Departure, Departures


def test_a_hold_whose_write_failed_is_not_written_with_the_next_change(tmp_path: Path) -> None:
    """The entry was noted in memory before the file was written, and stayed there when the
    write failed: the next change of another key wrote it to disk, and a restart found a lock on
    an object whose move had failed."""
    departures = Departures(tmp_path)
    departures.hold("kept", Departure("lock-kept", 2e9))
    staged = tmp_path / (DEPARTING_FILE_NAME + ".new")
    staged.mkdir()  # where the file is staged: every write fails
    with pytest.raises(OSError):
        departures.hold("failed", Departure("lock-failed", 2e9))
    with pytest.raises(OSError):
        departures.end("kept", "lock-kept")
    assert set(departures.held()) == {"kept"}
    staged.rmdir()
    departures.hold("next", Departure("lock-next", 2e9))
    assert set(Departures(tmp_path).held()) == {"kept", "next"}


def test_an_arrival_whose_end_failed_is_still_held(tmp_path: Path) -> None:
    arrivals = Arrivals(tmp_path)
    arrivals.hold("k", Arrival("hold-1", None))
    (tmp_path / "ARRIVING.new").mkdir()
    with pytest.raises(OSError):
        arrivals.end("k")
    assert arrivals.held() == {"k": Arrival("hold-1", None)}
    assert Arrivals(tmp_path).held() == {"k": Arrival("hold-1", None)}


def test_a_hold_whose_directory_sync_failed_is_not_held_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was replaced but its name not made durable: the entry was held in memory all
    the same, and went to disk (durably) with the next change of another key."""
    departures = Departures(tmp_path)

    def failing_sync(directory: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(move_holds, "sync_directory", failing_sync)
    with pytest.raises(OSError):
        departures.hold("failed", Departure("lock-failed", 2e9))
    monkeypatch.undo()
    departures.hold("next", Departure("lock-next", 2e9))
    assert set(Departures(tmp_path).held()) == {"next"}
