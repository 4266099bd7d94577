"""The removal procedure of docs/operations.md ("Removing a shard"), run end to end behind nginx
while a background writer keeps appending: three shards, then two. The remaining shards restart
with the new ring first, the departing shard's objects move to their new owners (deploy/reshard.py
--execute, run again right before the reload for objects created meanwhile), nginx drops the
departing shard, and the departing shard is stopped once it holds nothing. Every object reads back
through the proxy from its new owner and no acknowledged write is lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_server.domain.placement import KetamaRing, routing_key
from tests.deploy.resharding import (
    RETRYABLE_CODES,
    RETRYABLE_REASONS,
    Writer,
    holders,
    run_reshard,
    until_routed_to_its_owner,
)
from tests.deploy.support import DEPLOY, Proxy, Shard, free_port, text_message, wait_for, write_ring


def _children(pid: int) -> set[int]:
    """Live child processes of `pid` (nginx's workers, for its master)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:  # gone meanwhile
            continue
        if int(ppid) == pid and state != "Z":
            found.add(int(stat.parent.name))
    return found


def _acknowledged(writer: Writer) -> int:
    return sum(len(ids) for ids in writer.acknowledged.values())


def test_removing_a_shard_under_write_load(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    names = [f"127.0.0.1:{port}" for port in ports]
    old, new = names, names[:2]
    departing = names[2]
    shards = [
        Shard(
            f"shard{i}",
            tmp_path / f"shard{i}",
            port,
            "--ring-file",
            str(write_ring(tmp_path / f"old{i}.json", old, name)),
        )
        for i, (port, name) in enumerate(zip(ports, names, strict=True))
    ]
    old_ring, new_ring = KetamaRing.of(old), KetamaRing.of(new)
    keys = [f"tenant/{i}" for i in range(48)]
    moving = [k for k in keys if old_ring.owner(routing_key(k)) == departing]
    staying = {name: [k for k in keys if old_ring.owner(routing_key(k)) == name] for name in new}
    assert 2 <= len(moving) <= 36, "the departing shard holds about a third of the keys"
    # What the procedure rests on: without the departing shard, no other key changes owner.
    assert all(new_ring.owner(routing_key(k)) == name for name, ks in staying.items() for k in ks)
    proxy = Proxy("nginx", tmp_path / "nginx", free_port(), old)
    # The writer hits objects that move and objects on both remaining shards (which restart).
    writer = Writer(proxy.address, moving[:6] + staying[names[0]][:2] + staying[names[1]][:2])
    try:
        for shard in shards:
            shard.start()
        proxy.start()
        with SessionsClient(proxy.address) as client:
            for key in keys:
                client.object(key).session().append_messages(text_message(f"m{i}", f"{key} {i}") for i in range(3))
        assert all(holders(shards, key) == [departing] for key in moving)
        writer.start()
        wait_for(lambda: _acknowledged(writer) >= 30 or not writer.is_alive(), timeout=60, what="first writes")

        # 1. The remaining shards restart with the new ring, one at a time; they keep every key
        #    they own, and now also own the departing shard's. nginx and the departing shard keep
        #    the old ring, so the departing shard still serves its objects.
        for i, shard in enumerate(shards[:2]):
            shard.restart("--ring-file", str(write_ring(tmp_path / f"new{i}.json", new, names[i])))
        # 2. The departing shard's objects move to their new owners.
        moved = run_reshard(old, new)
        assert moved.returncode == 0, moved
        assert {f"{len(moving)} objects change owner", f"all {len(moving)} moves done"} <= set(
            moved.stdout.splitlines()
        )
        # Until nginx is reloaded, the departing shard refuses what it handed over, naming the owner.
        with SessionsClient(departing, retry=None) as direct, pytest.raises(SessionsError) as refused:
            direct.object(moving[0]).session().append_message(text_message("stray", "to the old owner"))
        assert refused.value.reason == "OBJECT_NOT_OWNED"
        assert refused.value.metadata.get("owner") == new_ring.owner(routing_key(moving[0])), refused.value.metadata
        # An object created on the departing shard after that listing (nginx still routes its key
        # there) is left behind by that run: the run right before the reload moves it.
        late = next(f"late/{i}" for i in range(10_000) if old_ring.owner(routing_key(f"late/{i}")) == departing)
        with SessionsClient(proxy.address) as client:
            client.object(late).session().append_message(text_message("m0", late))
        assert holders(shards, late) == [departing]
        again = run_reshard(old, new)
        assert again.returncode == 0, again
        assert f"{departing} -> {new_ring.owner(routing_key(late))}: 1 objects" in again.stdout.splitlines()
        assert {"1 objects change owner", "all 1 moves done"} <= set(again.stdout.splitlines())
        # 3. nginx drops the departing shard.
        assert proxy.proc is not None
        master = proxy.proc.pid
        old_workers = _children(master)
        proxy.reload(new)
        until_routed_to_its_owner(proxy.address, moving[0])
        # 4. Once nginx's old workers are gone, nothing reaches the departing shard: it must hold
        #    nothing (a listing finds no object to move), and it stops.
        wait_for(lambda: not old_workers & _children(master), timeout=35, what="nginx's old workers to exit")
        listing = subprocess.run(
            [sys.executable, str(DEPLOY / "reshard.py"), "--old", ",".join(old), "--new", ",".join(new)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert listing.stdout.splitlines() == ["0 objects change owner"], listing.stdout
        shards[2].stop()
        objects = shards[2].data_dir / "objects"
        assert objects.is_dir() and not list(objects.rglob("*.sqlite")), "the departing shard holds no object"
        # Some writes after the procedure (they would fail if nginx still routed to the stopped
        # shard), then stop the writer.
        settled = _acknowledged(writer)
        wait_for(lambda: _acknowledged(writer) >= settled + 30 or not writer.is_alive(), timeout=60, what="writes")
        writer.stop_event.set()
        writer.join(timeout=90)
        assert writer.error is None, writer.error
        print(f"writer: {_acknowledged(writer)} acknowledged, refusals {writer.refusals}")
        assert set(writer.refusals) <= RETRYABLE_REASONS | {code.name for code in RETRYABLE_CODES}, writer.refusals

        with SessionsClient(proxy.address) as client:
            for key in keys:
                ids = [m["id"] for m in client.object(key).session().get_history()]
                assert ids[:3] == ["m0", "m1", "m2"], key
                assert ids[3:] == writer.acknowledged.get(key, []), f"{key}: acknowledged writes lost or reordered"
                assert holders(shards, key) == [new_ring.owner(routing_key(key))], key
            assert client.object(late).session().get_history() == [text_message("m0", late)]
        assert holders(shards, late) == [new_ring.owner(routing_key(late))]
    finally:
        writer.stop_event.set()
        if writer.is_alive():
            writer.join(timeout=30)
        proxy.stop()
        for shard in shards:
            shard.stop()
