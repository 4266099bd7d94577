"""Listing object files a page at a time (ListObjects): every file once, in name order, and a
page costs its own files, not the store's (a shard holds millions of objects)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sessions_server.storage import files
from sessions_server.storage.paths import object_path


@pytest.fixture
def tree(tmp_path: Path) -> list[Path]:
    made = []
    for i in range(3_000):
        path = object_path(tmp_path, f"key-{i}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        made.append(path)
    (made[0].parent / "stray.txt").touch()  # not an object file
    return sorted(made)


def test_pages_list_every_file_once_in_name_order(tmp_path: Path, tree: list[Path]) -> None:
    listed: list[Path] = []
    after = ""
    while page := files.list_object_files(tmp_path, after, 250):
        assert len(page) <= 250
        listed += page
        after = page[-1].name
    assert listed == tree
    assert files.list_object_files(tmp_path, tree[-1].name, 10) == []
    # Any string is a token: one that falls between names starts at the next name.
    assert (
        files.list_object_files(tmp_path, tree[100].name[:5], 1) == [p for p in tree if p.name > tree[100].name[:5]][:1]
    )
    assert files.list_object_files(tmp_path / "nothing-here", "", 10) == []


def test_a_page_reads_only_the_directories_it_takes_files_from(
    tmp_path: Path, tree: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    scanned: list[str] = []
    scandir = os.scandir

    def counted(path: Any) -> Any:
        scanned.append(str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    middle = tree[1_500].name
    page = files.list_object_files(tmp_path, middle, 10)

    assert page == [p for p in tree if p.name > middle][:10]
    leaves = {str(p.parent) for p in page}
    # The root, a top directory or two, and the leaves the page came from (or one beside them).
    assert len(scanned) <= 2 + 2 * 2 + len(leaves) + 1, scanned
