"""Three shards behind nginx run from deploy/nginx/nginx.conf (`hash $http_x_object_key
consistent` + `grpc_pass`), each shard with a ring file naming the upstreams as nginx does: every
object lands on exactly the shard our ketama ring names (no OBJECT_NOT_OWNED anywhere), large
client-streamed writes, framed reads, history streams and Subscribe pass through, and a shard
restart is survived. Needs Debian's `nginx` (installed by .ci/run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy import scenarios
from tests.deploy.scenarios import Cluster


@pytest.fixture(scope="module")
def nginx_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with scenarios.cluster(
        tmp_path_factory.mktemp("nginx"),
        "nginx",
        ring=True,
        shard_args=("--max-client-message-bytes", str(scenarios.CLIENT_MESSAGE_LIMIT)),
    ) as c:
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
