"""Three shards behind HAProxy run from deploy/haproxy/haproxy.cfg (`balance hdr(x-object-key)` +
`hash-type consistent`, end-to-end h2). HAProxy's ring is not nginx's, so the shards run without
ring files and the test checks stickiness: every call for a key reaches the same shard (its file
exists on exactly one shard, holding every message written over two connections). Large
client-streamed writes, framed reads, history streams and Subscribe pass through, and a shard
restart is survived. Needs Debian's `haproxy` (installed by .ci/run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy import scenarios
from tests.deploy.scenarios import Cluster


@pytest.fixture(scope="module")
def haproxy_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    shard_args = ("--require-routing-header", "--max-client-message-bytes", str(scenarios.CLIENT_MESSAGE_LIMIT))
    with scenarios.module_cluster(request, tmp_path_factory, "haproxy", ring=False, shard_args=shard_args) as c:
        yield c


def test_each_key_sticks_to_one_shard(haproxy_cluster: Cluster) -> None:
    scenarios.write_many_and_check_placement(haproxy_cluster)


def test_large_messages_and_history_streams(haproxy_cluster: Cluster) -> None:
    scenarios.large_message_and_history_streaming(haproxy_cluster)


def test_refusals_keep_their_status(haproxy_cluster: Cluster) -> None:
    scenarios.refusals_keep_their_status(haproxy_cluster)


def test_subscribe(haproxy_cluster: Cluster) -> None:
    scenarios.subscribe_through_proxy(haproxy_cluster)


def test_shard_restart(haproxy_cluster: Cluster) -> None:
    if not haproxy_cluster.owned:
        scenarios.write_many_and_check_placement(haproxy_cluster)
    scenarios.shard_restart_is_survived(haproxy_cluster)


def test_config_keeps_routing_rules() -> None:
    text = (Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg").read_text()
    for directive in ("balance hdr(x-object-key)", "hash-type consistent", "proto h2", "no option redispatch"):
        assert directive in text, directive
    server_lines = [line for line in text.splitlines() if line.strip().startswith("server ")]
    assert server_lines and all(" check" not in line for line in server_lines), "health checks would re-hash keys"
    ids = [line.split(" id ")[1].split()[0] for line in server_lines if " id " in line]
    assert len(ids) == len(server_lines) == len(set(ids)), "a server without its own fixed id moves others' keys"
