"""What the re-shard tests share: a writer that keeps appending through the proxy, the planner
run as an operator runs it, and where an object's file lies."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import grpc

from sessions_client import SessionsClient, SessionsError
from sessions_server.storage.paths import object_path
from tests.deploy.support import DEPLOY, Shard, text_message

RETRYABLE_REASONS = {"OBJECT_MOVING", "OBJECT_NOT_OWNED"}
# A shard restarting refuses calls (UNAVAILABLE). A call in flight while nginx reloads or a shard
# restarts can also have its stream reset, which the client sees as CANCELLED (2 of 4 full runs
# of tests/deploy on one day; nginx resets streams its old workers still carry). Neither write
# was acknowledged, and the retry carries the same message id.
RETRYABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


class Writer(threading.Thread):
    """Appends to a set of objects through the proxy until stopped; a refused write (moving, not
    owned here any more, shard restarting) is retried with the same message id, as a client
    during a re-shard would. Records what was acknowledged."""

    def __init__(self, address: str, keys: list[str]) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.keys = keys
        self.acknowledged: dict[str, list[str]] = {key: [] for key in keys}
        self.refusals: dict[str, int] = {}
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with SessionsClient(self.address, timeout=30) as client:
                index = 0
                while not self.stop_event.is_set():
                    key = self.keys[index % len(self.keys)]
                    message_id = f"w{index}"
                    self._append_until_acknowledged(client, key, message_id)
                    self.acknowledged[key].append(message_id)
                    index += 1
        except BaseException as error:
            self.error = error

    def _append_until_acknowledged(self, client: SessionsClient, key: str, message_id: str) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                client.object(key).session().append_message(text_message(message_id, f"{key} {message_id}"))
                return
            except SessionsError as error:
                retryable = error.reason in RETRYABLE_REASONS or error.code in RETRYABLE_CODES
                if not retryable or time.monotonic() > deadline:
                    raise
                label = error.reason or error.code.name
                self.refusals[label] = self.refusals.get(label, 0) + 1
                time.sleep(0.02)


def run_reshard(old: list[str], new: list[str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(DEPLOY / "reshard.py"), "--old", ",".join(old), "--new", ",".join(new)]
    return subprocess.run([*command, "--execute"], capture_output=True, text=True, check=False, timeout=240)


def holders(shards: list[Shard], key: str) -> list[str]:
    return [shard.address for shard in shards if object_path(shard.data_dir, key).exists()]


def until_routed_to_its_owner(proxy_address: str, key: str, timeout: float = 30.0) -> None:
    """Waits until a fresh connection through the proxy reaches the owner of `key` on the
    reloaded upstream list: nginx's old workers keep the connections they had."""
    with SessionsClient(proxy_address) as probe:
        deadline = time.monotonic() + timeout
        while True:
            try:
                probe.object(key).session().get_history()
                return
            except SessionsError as error:
                if error.reason != "OBJECT_NOT_OWNED" or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
