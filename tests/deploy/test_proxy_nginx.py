"""Three shards behind nginx run from deploy/nginx/nginx.conf (`hash $http_x_object_key
consistent` + `grpc_pass`), each shard with a ring file naming the upstreams as nginx does: every
object lands on exactly the shard our ketama ring names (no OBJECT_NOT_OWNED anywhere), large
client-streamed writes, framed reads, history streams and Subscribe pass through, and a shard
restart is survived. Needs Debian's `nginx` (installed by .ci/run)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from tests.deploy import scenarios
from tests.deploy.scenarios import Cluster
from tests.deploy.support import text_message


@pytest.fixture(scope="module")
def nginx_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    shard_args = ("--max-client-message-bytes", str(scenarios.CLIENT_MESSAGE_LIMIT))
    with scenarios.module_cluster(request, tmp_path_factory, "nginx", ring=True, shard_args=shard_args) as c:
        yield c


def test_each_object_lives_on_the_shard_our_ring_names(nginx_cluster: Cluster) -> None:
    scenarios.write_many_and_check_placement(nginx_cluster)


def test_large_messages_and_history_streams(nginx_cluster: Cluster) -> None:
    scenarios.large_message_and_history_streaming(nginx_cluster)


def test_refusals_keep_their_status(nginx_cluster: Cluster) -> None:
    scenarios.refusals_keep_their_status(nginx_cluster)


def test_subscribe(nginx_cluster: Cluster) -> None:
    scenarios.subscribe_through_proxy(nginx_cluster)


def test_shard_restart(nginx_cluster: Cluster) -> None:
    if not nginx_cluster.owned:
        scenarios.write_many_and_check_placement(nginx_cluster)
    scenarios.shard_restart_is_survived(nginx_cluster)


def test_the_modulo_scheme_is_nginx_plain_hash(tmp_path: Path) -> None:
    """Ring files of scheme "modulo" behind nginx's `hash` without `consistent`: every object on
    the shard our ring names, none refused (crc32 mod count refused 41 of 60 keys)."""
    with scenarios.cluster(tmp_path, "nginx-plain-hash", ring=True, scheme="modulo") as c:
        assert c.placement is not None and c.placement.scheme == "modulo"
        scenarios.write_many_and_check_placement(c)


@pytest.mark.parametrize(("ping_timeout", "kept"), [("1", False), ("60", True)])
def test_a_paused_reader_keeps_its_stream_while_the_shards_ping_timeout_outlasts_the_pause(
    tmp_path: Path, ping_timeout: str, kept: bool
) -> None:
    """While its client pauses reading, nginx stops reading from the shard, pings included: the
    shard's ping timeout, not nginx's send_timeout, bounds the pause (hence the manifest's hour)."""
    shard_args = ("--keepalive-seconds", "1", "--keepalive-timeout-seconds", ping_timeout)
    read: list[str] = []
    with (
        scenarios.cluster(tmp_path, "nginx", count=1, ring=False, shard_args=shard_args) as c,
        # The client's own window stays 64 KiB: grown with the link's bandwidth, it could take in
        # what is left to send before the pause ends, and the stream would not be cut for want of pings.
        SessionsClient(c.proxy.address, options=[("grpc.http2.bdp_probe", 0)]) as client,
    ):
        session = client.object("paused/reader").session()
        session.append_messages(text_message(f"m{i}", "x" * 20_000) for i in range(1_000))
        with contextlib.ExitStack() as outcome:
            if not kept:
                refused = outcome.enter_context(pytest.raises(SessionsError))
            for index, batch in enumerate(session.history_batches(batch_size=50)):
                read += [m["id"] for m in batch]
                if index == 1:  # 20 MB still to come: more than the buffers on the way hold
                    time.sleep(6)
    if kept:
        assert read == [f"m{i}" for i in range(1_000)]
    else:
        assert refused.value.code == grpc.StatusCode.INTERNAL
        assert "RST_STREAM" in str(refused.value)
        # Cut: by the time the client reads on, most of it is usually lost; on a loaded machine
        # (CI beside other work, 2026-12-06) every message had come through and only the stream's
        # end was lost to the cut.
        assert len(read) >= 100


def test_config_keeps_routing_rules() -> None:
    """The directives the routing depends on are in the shipped file."""
    text = (Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "nginx.conf").read_text()
    for directive in (
        "hash $http_x_object_key consistent;",
        "grpc_pass grpc://sessions_shards;",
        "grpc_next_upstream off;",
        "client_max_body_size 0;",
        "grpc_read_timeout 1h;",
        "grpc_send_timeout 1h;",
        "max_fails=0;",
    ):
        assert directive in text, directive
