"""A copy of an object (`files.snapshot_object`, for exports, moves and vacuums) that fails
part way leaves nothing in scratch: VACUUM INTO writes a rollback journal beside its copy, which
a failure left behind (one per failed copy, until the next start) when only the copy was
removed. The copy fails here for the file size limit (RLIMIT_FSIZE, in a child process that
ignores SIGXFSZ), as on a full disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import os, resource, signal, sqlite3, sys
from pathlib import Path
from sessions_server.storage import files
from sessions_server.storage.rows import StorageError

source = Path(sys.argv[1])
with sqlite3.connect(source) as conn:
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.executemany("INSERT INTO t VALUES (?)", [(os.urandom(8000).hex(),) for _ in range(300)])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))
try:
    files.snapshot_object(source, Path(sys.argv[2]), 0)
except StorageError:
    print("refused")
"""


def test_a_copy_that_fails_part_way_leaves_nothing_in_scratch(tmp_path: Path) -> None:
    for limit in (64 * 1024, 1_000_000):
        case = tmp_path / str(limit)
        case.mkdir()
        scratch = case / "scratch"
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(case / "object.sqlite"), str(scratch), str(limit)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert done.stdout.strip() == "refused", done.stderr
        assert sorted(path.name for path in scratch.iterdir()) == []
