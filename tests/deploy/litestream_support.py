"""Litestream around a shard, for the replication tests and deploy/litestream/measure.py: a local
S3 server (moto), `litestream replicate` with deploy/litestream/litestream.yml, and restores with
deploy/litestream/restore.sh."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.deploy.support import DEPLOY, ROOT, free_port, port_open, wait_for

BUCKET = "sessions-backup"
CONFIG = DEPLOY / "litestream" / "litestream.yml"
RESTORE = DEPLOY / "litestream" / "restore.sh"


def litestream_binary() -> str:
    """The pinned Litestream: $LITESTREAM, else .tools/bin (go install), else PATH."""
    candidates = [os.environ.get("LITESTREAM", ""), str(ROOT / ".tools" / "bin" / "litestream")]
    candidates.append(shutil.which("litestream") or "")
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return candidate
    raise AssertionError("litestream not installed: see docs/operations.md (go install ...litestream@v0.5.18)")


def aws_env() -> dict[str, str]:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    env.pop("AWS_CA_BUNDLE", None)  # Litestream 0.5.18's S3 client refuses to start with it
    return env


class S3Server:
    """moto's S3-compatible server on a loopback port, with the bucket created."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with (self.workdir / "moto.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=aws_env(),
            )
        wait_for(lambda: port_open(self.port), timeout=60, what="moto to listen")
        self.client().create_bucket(Bucket=BUCKET)
        return self

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None


class Replicator:
    """`litestream replicate -config deploy/litestream/litestream.yml` for one shard's data dir."""

    def __init__(self, data_dir: Path, s3: S3Server, prefix: str, log_path: Path) -> None:
        self.data_dir = data_dir
        self.s3 = s3
        self.prefix = prefix
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def replica(self) -> str:
        return f"s3://{BUCKET}/{self.prefix}"

    def start(self) -> Replicator:
        env = aws_env() | {
            "SESSIONS_DATA_DIR": str(self.data_dir),
            "LITESTREAM_BUCKET": BUCKET,
            "LITESTREAM_PREFIX": self.prefix,
            "LITESTREAM_ENDPOINT": self.s3.endpoint,
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [litestream_binary(), "replicate", "-config", str(CONFIG)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        wait_for(
            lambda: b"found databases in directory" in self.log_path.read_bytes() or self.proc.poll() is not None,
            timeout=30,
            what="litestream to start",
        )
        assert self.proc.poll() is None, self.log_path.read_text(errors="replace")
        return self

    def kill(self) -> None:
        """SIGKILL: the machine is gone, nothing is flushed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


def restore(
    replica: str,
    s3: S3Server,
    data_dir: Path,
    *,
    keys: Iterable[str] = (),
    timestamp: str = "",
    jobs: int = 8,
    check: str = "none",
    skip_missing: bool = False,
) -> subprocess.CompletedProcess[str]:
    """deploy/litestream/restore.sh into `data_dir` (all objects, or `keys`)."""
    command = ["bash", str(RESTORE), "--replica", replica, "--data-dir", str(data_dir), "--endpoint", s3.endpoint]
    command += ["--jobs", str(jobs), "--integrity-check", check, "--force"]
    for key in keys:
        command += ["--object-key", key]
    if timestamp:
        command += ["--timestamp", timestamp]
    if skip_missing:
        command.append("--skip-missing")
    env = aws_env() | {"LITESTREAM": litestream_binary(), "PYTHON": sys.executable}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, f"restore.sh failed:\n{result.stdout}\n{result.stderr}"
    return result


def message_rows(path: Path) -> list[tuple[str, str, int, str]]:
    """(session_id, id, seq, content) of every message row, read-only: the stored bytes."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(conn.execute("SELECT session_id, id, seq, content FROM cf_agents_session_messages ORDER BY seq"))
    finally:
        conn.close()


def integrity(path: Path) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()
