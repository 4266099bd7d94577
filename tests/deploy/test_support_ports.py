"""The deployment tests' port helpers: a cluster draws all its ports before starting anything on
them, so two draws must never give one port, and a proxy must not start on a port another server
already holds (its clients would reach that server instead, as a CI run once saw: every key on
one shard, the proxy never listening)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.deploy.support import Proxy, free_port


def test_ports_drawn_in_one_process_are_all_different() -> None:
    drawn = [free_port() for _ in range(400)]
    assert len(set(drawn)) == len(drawn)


def test_a_proxy_refuses_to_start_on_a_port_a_server_holds(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        proxy = Proxy("haproxy", tmp_path / "haproxy", port, ["127.0.0.1:1"])
        with pytest.raises(AssertionError, match="already listens"):
            proxy.start()
        assert proxy.proc is None
