"""The journal of objects moved away (storage/moved.py): what a restart reads back."""

from __future__ import annotations

from pathlib import Path

from sessions_server.storage.moved import MOVED_FILE_NAME, MovedObjects


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
