"""Traffic through a proxy in front of shards, and what must hold afterwards; shared by the nginx and
HAProxy tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from sessions_client import RetryNotice, SessionsClient, SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.placement import Placement
from sessions_server.storage.paths import object_path
from tests.conftest import removed_after_passing
from tests.deploy.support import Proxy, Shard, free_port, retry_transient, text_message, write_ring

# Keys whose percent-encoding differs from the key (space, '/', '+', '&', non-ASCII, emoji).
KEYS = [f"tenant-{i % 4}/chat {i}" for i in range(36)]
KEYS += [f"чат/{i}" for i in range(8)] + [f"a+b&c=d/{i}" for i in range(8)] + [f"💬 {i}" for i in range(8)]
MESSAGES_PER_KEY = 4
LARGE_BYTES = 20 * 1024 * 1024


@dataclass
class Cluster:
    shards: list[Shard]
    proxy: Proxy
    placement: Placement | None
    owned: dict[str, list[str]] = field(default_factory=dict)  # shard address -> keys

    def shard_of(self, address: str) -> Shard:
        return next(shard for shard in self.shards if shard.address == address)

    def holders(self, key: str) -> list[Shard]:
        return [shard for shard in self.shards if object_path(shard.data_dir, key).exists()]


@contextmanager
def module_cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    kind: str,
    *,
    ring: bool,
    shard_args: tuple[str, ...] = (),
) -> Iterator[Cluster]:
    """A test module's `cluster`, its files removed after it unless one of its tests failed."""
    with (
        removed_after_passing(request, tmp_path_factory.mktemp(kind)) as base,
        cluster(base, kind, ring=ring, shard_args=shard_args) as made,
    ):
        yield made


@contextmanager
def cluster(
    tmp_path: Path,
    kind: str,
    *,
    count: int = 3,
    ring: bool,
    scheme: str = "nginx-ketama",
    shard_args: tuple[str, ...] = (),
) -> Iterator[Cluster]:
    """`count` shards (with ring files of `scheme` naming them as the proxy does, when `ring`,
    and `shard_args`) behind a proxy."""
    ports = [free_port() for _ in range(count)]
    names = [f"127.0.0.1:{port}" for port in ports]
    shards: list[Shard] = []
    proxy = Proxy(kind, tmp_path / kind, free_port(), names)
    try:
        for index, (port, name) in enumerate(zip(ports, names, strict=True)):
            extra: list[str] = list(shard_args)
            if ring:
                ring_file = write_ring(tmp_path / f"ring-{index}.json", names, name, scheme)
                extra += ["--ring-file", str(ring_file)]
            shards.append(Shard(f"shard{index}", tmp_path / f"shard{index}", port, *extra).start())
        proxy.start()
        placement = Placement.from_ring_file(tmp_path / "ring-0.json") if ring else None
        yield Cluster(shards, proxy, placement)
    finally:
        proxy.stop()
        for shard in shards:
            shard.stop()


def write_many_and_check_placement(c: Cluster) -> None:
    """Appends to every key through the proxy, on two connections, interleaved; each object must
    then live on exactly one shard (its owner by the ring, when there is one) with all its
    messages, and no call may be refused."""
    with SessionsClient(c.proxy.address) as first, SessionsClient(c.proxy.address) as second:
        for index in range(MESSAGES_PER_KEY):
            client = first if index % 2 == 0 else second
            for key in KEYS:
                client.object(key).session().append_message(text_message(f"m{index}", f"{key} #{index}"))
        for key in KEYS:
            history = second.object(key).session().get_history()
            assert [m["id"] for m in history] == [f"m{i}" for i in range(MESSAGES_PER_KEY)], key
            assert history[-1] == text_message(f"m{MESSAGES_PER_KEY - 1}", f"{key} #{MESSAGES_PER_KEY - 1}")
    for key in KEYS:
        holders = c.holders(key)
        assert len(holders) == 1, f"{key!r} is on {[h.name for h in holders]}"
        if c.placement is not None:
            assert holders[0].address == c.placement.owner(key), f"{key!r}: nginx and our ring disagree"
        c.owned.setdefault(holders[0].address, []).append(key)
    assert len(c.owned) == len(c.shards), f"some shard got no keys: {c.owned.keys()}"
    if c.placement is not None:  # the guard is live: a shard that does not own a key refuses it
        key = KEYS[0]
        wrong = next(shard for shard in c.shards if shard.address != c.placement.owner(key))
        with SessionsClient(wrong.address, retry=None) as direct, pytest.raises(SessionsError) as refused:
            direct.object(key).session().get_history()
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_NOT_OWNED")


def large_message_and_history_streaming(c: Cluster) -> None:
    """A 20 MB message goes up as a client stream (UploadMessage) and comes back in ≤ 4 MiB frames;
    a long history streams in batches, all through the proxy."""
    big_text = ("0123456789abcdef" * (LARGE_BYTES // 16 + 1))[: LARGE_BYTES - 1] + "é"
    big = text_message("big", big_text)
    with SessionsClient(c.proxy.address) as client:
        session = client.object("large/one").session()
        session.append_message(text_message("before", "small"))
        session.append_message(big)
        session.append_message(text_message("after", "small"))
        assert session.get_message("big") == big
        assert [m["id"] for m in session.get_history()] == ["before", "big", "after"]

        long = client.object("large/history").session("s")
        long.append_messages(text_message(f"h{i}", f"line {i} " * 50) for i in range(300))
        batches = list(long.history_batches(batch_size=64))
        assert [len(b) for b in batches] == [64, 64, 64, 64, 44]
        assert [m["id"] for b in batches for m in b] == [f"h{i}" for i in range(300)]
        newest = list(long.history(newest_first=True))
        assert [m["id"] for m in newest] == [f"h{i}" for i in reversed(range(300))]
    for key in ("large/one", "large/history"):
        assert len(c.holders(key)) == 1


def subscribe_through_proxy(c: Cluster) -> None:
    """A Subscribe stream through the proxy delivers the object's appends in commit order. The
    stream's first event, a progress event, comes once the subscription is registered on the
    shard: every write after it is delivered."""
    seen: list[str] = []
    first: list[str] = []
    failure: list[BaseException] = []
    enough = 10
    with SessionsClient(c.proxy.address) as listener, SessionsClient(c.proxy.address) as writer:
        events = listener.object("feed/proxy").subscribe(session_id="", include_progress=True)
        subscribed = threading.Event()

        def listen() -> None:
            try:
                for event in events:
                    if not first:
                        first.append(event.type)
                        subscribed.set()
                    if event.type == "append":
                        assert event.message is not None
                        seen.append(str(event.message["id"]))
                        if len(seen) >= enough:
                            return
            except BaseException as error:  # reported in the main thread
                failure.append(error)
            finally:
                subscribed.set()  # the main thread stops waiting: `first` and `failure` say why

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        try:
            assert subscribed.wait(30), "the subscription sent nothing within 30 s"
            assert not failure, failure
            assert first == ["progress"], first
            session = writer.object("feed/proxy").session()
            written = [f"e{index}" for index in range(enough)]
            for message_id in written:
                session.append_message(text_message(message_id, "event"))
            thread.join(timeout=30)
            assert not thread.is_alive(), f"the feed delivered {seen} of {written} within 30 s"
        finally:
            if not thread.is_alive():  # else closing the listener's client ends the stream
                events.close()
    assert not failure, failure
    assert seen == written, "events missing or out of commit order"


def shard_restart_is_survived(c: Cluster) -> None:
    """One shard stops: its objects answer UNAVAILABLE through the proxy (never another shard),
    the others keep working; it restarts on the same port and data directory and its objects
    read back through the proxy. An append made while it is down lands once it is back: the
    client tries it again (the shard is started from the client's retry notice)."""
    victim = c.shards[1]
    own_keys = c.owned[victim.address]
    other_key = c.owned[c.shards[0].address][0]
    with SessionsClient(c.proxy.address) as client:
        expected = {key: client.object(key).session().get_history() for key in own_keys}
        victim.stop()
        with SessionsClient(c.proxy.address, retry=None) as impatient, pytest.raises(SessionsError) as down:
            impatient.object(own_keys[0]).session().get_history()
        assert down.value.code == grpc.StatusCode.UNAVAILABLE, down.value
        # An upload still being sent when the proxy finds the shard down: nginx answered its own
        # 502 page and reset the stream, which gRPC reports as INTERNAL, not tried again (27 of
        # 30 such appends in a proxy audit). It is UNAVAILABLE, as for any call to a down shard.
        # Timing decides how often (none in some runs): twenty tries, each on a new connection
        # (HAProxy answers 503 after its own three tries to connect, about 3 s: two there).
        for attempt in range(20 if c.proxy.kind == "nginx" else 2):
            with (
                SessionsClient(c.proxy.address, retry=None, timeout=20) as impatient,
                pytest.raises(SessionsError) as cut,
            ):
                impatient.object(own_keys[0]).session().append_message(
                    text_message(f"large-{attempt}", "u" * (8 * 1024 * 1024))
                )
            assert cut.value.code == grpc.StatusCode.UNAVAILABLE, cut.value
        client.object(other_key).session().append_message(text_message("while-down", "x"))
        notices: list[RetryNotice] = []

        def restart(notice: RetryNotice) -> None:
            if not notices:
                victim.start()
            notices.append(notice)

        with SessionsClient(c.proxy.address, on_retry=restart) as patient:
            landed = patient.object(own_keys[0]).session().append_message(text_message("during", "z"))
        assert landed.inserted
        assert (notices[0].method, notices[0].error.code) == ("AppendMessage", grpc.StatusCode.UNAVAILABLE)
        expected[own_keys[0]].append(text_message("during", "z"))
        for key in own_keys:
            assert retry_transient(lambda key=key: client.object(key).session().get_history()) == expected[key]
        retry_transient(lambda: client.object(own_keys[0]).session().append_message(text_message("after", "y")))
    for key in [*own_keys, other_key]:
        assert len(c.holders(key)) == 1, key


CLIENT_MESSAGE_LIMIT = 4 * 1024 * 1024  # the shards' --max-client-message-bytes in the proxy tests


def refusals_keep_their_status(c: Cluster) -> None:
    """A refusal sent while the client still streams (a message from a client past the limit,
    sent in pieces) reaches the caller with its status and reason: HAProxy turned the reset that
    followed an early answer into CANCELLED, the reason lost. And a call without the routing
    header is refused, not balanced to any shard."""
    with SessionsClient(c.proxy.address, retry=None) as client, pytest.raises(SessionsError) as refused:
        client.object("too large").session().append_message(
            text_message("big", "v" * (6 * CLIENT_MESSAGE_LIMIT)), source="client"
        )
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert not c.holders("too large")
    with grpc.insecure_channel(c.proxy.address) as channel, pytest.raises(grpc.RpcError) as unrouted:
        list(
            pb_grpc.SessionServiceStub(channel).GetLatestLeaf(
                pb.GetLatestLeafRequest(object_key="unrouted"), timeout=30
            )
        )
    assert unrouted.value.code() == grpc.StatusCode.INVALID_ARGUMENT, unrouted.value.details()
    assert not c.holders("unrouted")
