"""An object's two fan-out directories (`objects/ab/cd/`) go with the last object in them: erases
left them behind (5,745 empty directories after 6,000 keys were erased), for every listing to
walk. Made and removed under one lock, so a removal never takes a directory from under a file
about to be created in it."""

from __future__ import annotations

import itertools
from pathlib import Path

from sessions_server.storage import files
from sessions_server.storage.datadir import SCRATCH_DIR_NAME
from sessions_server.storage.paths import OBJECTS_DIR, object_file_name, object_path


def _keys_alike(digits: int) -> tuple[str, str]:
    """Two keys whose file names share their first `digits` hex digits (2: one `ab/`, then
    different `cd/`; 4: one `ab/cd/`)."""
    first_of: dict[str, str] = {}
    for index in itertools.count():
        key = f"key-{index}"
        name = object_file_name(key)
        other = first_of.setdefault(name[:digits], key)
        if other != key and (digits == 4 or object_file_name(other)[:4] != name[:4]):
            return other, key
    raise AssertionError("unreachable")


def _create(data_dir: Path, key: str) -> Path:
    path = object_path(data_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_erasing_the_last_object_of_its_directories_removes_them_and_only_them(tmp_path: Path) -> None:
    lone = _create(tmp_path, "lone")
    assert files.remove_object_files(lone, tmp_path / SCRATCH_DIR_NAME, prune=True)
    assert not lone.parent.exists() and not lone.parent.parent.exists()
    assert (tmp_path / OBJECTS_DIR).is_dir()


def test_directories_still_holding_an_object_stay(tmp_path: Path) -> None:
    same_top, other_top = (_create(tmp_path, key) for key in _keys_alike(2))  # objects/ab/, two cd/
    assert files.remove_object_files(same_top, tmp_path / SCRATCH_DIR_NAME, prune=True)
    assert not same_top.parent.exists()  # its cd/ held nothing else
    assert same_top.parent.parent.is_dir() and other_top.exists()  # ab/ still holds the other's
    first, second = (_create(tmp_path, key) for key in _keys_alike(4))  # one cd/ for both
    assert files.remove_object_files(first, prune=True)
    assert second.exists() and second.parent.is_dir()


def test_a_file_outside_an_objects_directories_is_never_pruned(tmp_path: Path) -> None:
    scratch = tmp_path / SCRATCH_DIR_NAME
    scratch.mkdir()
    partial = scratch / "partial.sqlite"
    partial.write_bytes(b"")
    files.remove_object_files(partial, prune=True)
    assert scratch.is_dir()
