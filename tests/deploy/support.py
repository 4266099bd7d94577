"""Processes for the deployment tests: shards (`sessions-server serve`), nginx and HAProxy run
from the shipped configurations (deploy/), each on loopback ports in a temporary directory."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import grpc

from sessions_client import SessionsError

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
LISTENING = re.compile(r"listening on (\S+)")
T = TypeVar("T")

# Errors a client may see while a shard restarts or the proxy reconnects to it.
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE})


def _ephemeral_ports() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


# Every port free_port has returned in this process: a test often draws several ports before it
# starts anything on them, and two draws of one port then put two servers on it (HAProxy binds
# with SO_REUSEPORT; one that could not bind left the proxy's clients talking to a shard).
_HANDED_OUT: set[int] = set()
_HANDING_OUT = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that no earlier call in this
    process returned, for a server started next.

    It is drawn outside the kernel's ephemeral range: a port the kernel hands out (to a client's
    connection, to a bind to port 0) could be taken between this check and the server's bind,
    which a port outside that range cannot, except by another process drawing ports this way.
    A machine whose ephemeral range leaves no port from 20000 up gets one the kernel picks."""
    ephemeral = _ephemeral_ports()
    with _HANDING_OUT:
        candidates = [port for port in range(20000, 65536) if port not in ephemeral and port not in _HANDED_OUT]
        for port in random.sample(candidates, min(200, len(candidates))):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
        if candidates:
            raise AssertionError("no free port found outside the ephemeral range from 20000")
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


def wait_for(predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05) -> None:
    """Polls `predicate` until it holds, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def retry_transient(call: Callable[[], T], *, timeout: float = 30.0) -> T:
    """Runs `call`, retrying UNAVAILABLE (a shard restarting behind the proxy) until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except SessionsError as error:
            if error.code not in TRANSIENT or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def write_ring(path: Path, shards: Iterable[str], me: str, scheme: str = "nginx-ketama") -> Path:
    path.write_text(json.dumps({"scheme": scheme, "shards": list(shards), "self": me}), encoding="utf-8")
    return path


class Shard:
    """A `sessions-server serve` child on a fixed loopback port; its output goes to a log file."""

    def __init__(self, name: str, data_dir: Path, port: int, *extra: str) -> None:
        self.name = name
        self.data_dir = data_dir
        self.port = port
        self.extra = list(extra)
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = data_dir.parent / f"{name}.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Shard:
        command = [sys.executable, "-m", "sessions_server.cli", "serve", "--listen", self.address]
        command += ["--data-dir", str(self.data_dir), *self.extra]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ}
        )
        assert self.proc.stdout is not None
        log = self.log_path.open("a", encoding="utf-8")
        for line in self.proc.stdout:  # until the server prints its address (or dies)
            log.write(line)
            if LISTENING.search(line):
                break
        else:
            log.close()
            raise RuntimeError(f"shard {self.name} exited before listening: {self.log_path.read_text()}")
        stream = self.proc.stdout

        def drain() -> None:  # keep reading so the server never blocks on a full pipe
            with log:
                for line in stream:
                    log.write(line)
                    log.flush()

        threading.Thread(target=drain, daemon=True).start()
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def restart(self, *extra: str) -> Shard:
        self.stop()
        if extra:
            self.extra = list(extra)
        return self.start()


def replace_once(pattern: str, replacement: str, text: str, flags: int = re.MULTILINE) -> str:
    new, count = re.subn(pattern, lambda _m: replacement, text, count=0, flags=flags)
    assert count == 1, f"expected one match of {pattern!r} in the shipped config, found {count}"
    return new


def render_nginx(listen_port: int, servers: list[str], workdir: Path, *, consistent: bool = True) -> str:
    """The shipped deploy/nginx/nginx.conf with this test's listen port, upstream servers, and
    pid/log files in `workdir`; every other directive is used as shipped (but `consistent`, when
    not: nginx's plain hash)."""
    text = (DEPLOY / "nginx" / "nginx.conf").read_text(encoding="utf-8")
    text = replace_once(r"^pid .*;$", f"pid {workdir / 'nginx.pid'};", text)
    text = replace_once(r"^error_log .*;$", f"error_log {workdir / 'error.log'} info;", text)
    text = replace_once(r"^(\s*)access_log .*;$", f"    access_log {workdir / 'access.log'};", text)
    text = replace_once(r"^(\s*)listen \S+ http2;$", f"        listen 127.0.0.1:{listen_port} http2;", text)
    lines = "".join(f"        server {server} max_fails=0;\n" for server in servers)
    text, count = re.subn(r"^        server \S+ max_fails=0;\n", "", text, flags=re.MULTILINE)
    assert count >= 1, "the shipped upstream block has no `server ... max_fails=0;` lines"
    text = replace_once(
        r"^        hash \$http_x_object_key consistent;\n",
        ("        hash $http_x_object_key consistent;\n" if consistent else "        hash $http_x_object_key;\n")
        + lines,
        text,
    )
    # Temp paths in the work directory, so the test needs no write access to /var/lib/nginx.
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        text = text.replace("http {\n", f"http {{\n    {kind}_temp_path {workdir / ('tmp_' + kind)};\n", 1)
    return text


def render_haproxy(listen_port: int, servers: list[str]) -> str:
    """The shipped deploy/haproxy/haproxy.cfg with this test's bind port and servers."""
    text = (DEPLOY / "haproxy" / "haproxy.cfg").read_text(encoding="utf-8")
    text = replace_once(r"^    bind \S+ proto h2$", f"    bind 127.0.0.1:{listen_port} proto h2", text)
    lines = "".join(f"    server shard{i} {server} id {i + 1} proto h2\n" for i, server in enumerate(servers))
    text, count = re.subn(r"^    server shard\d+ \S+ id \d+ proto h2\n", "", text, flags=re.MULTILINE)
    assert count >= 1, "the shipped backend has no `server shardN ADDRESS id N proto h2` lines"
    return text.rstrip("\n") + "\n" + lines


class Proxy:
    """A proxy process (nginx or HAProxy) in the foreground, stopped by its PID."""

    def __init__(self, kind: str, workdir: Path, listen_port: int, servers: list[str]) -> None:
        self.kind = kind
        self.workdir = workdir
        self.port = listen_port
        self.servers = servers
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / ("haproxy.cfg" if kind == "haproxy" else "nginx.conf")
        self.log = workdir / f"{kind}.out"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_conf(self, servers: list[str]) -> None:
        if self.kind in ("nginx", "nginx-plain-hash"):
            consistent = self.kind == "nginx"
            self.conf.write_text(
                render_nginx(self.port, servers, self.workdir, consistent=consistent), encoding="utf-8"
            )
        else:
            self.conf.write_text(render_haproxy(self.port, servers), encoding="utf-8")
        self.servers = servers
        check = subprocess.run(self._command(check=True), capture_output=True, text=True, check=False)
        assert check.returncode == 0, f"{self.kind} rejects its config:\n{check.stdout}\n{check.stderr}"

    def _command(self, *, check: bool = False) -> list[str]:
        if self.kind != "haproxy":
            binary = shutil.which("nginx") or "/usr/sbin/nginx"
            command = [binary, "-p", str(self.workdir), "-c", str(self.conf), "-g", "daemon off;"]
            return [*command, "-t"] if check else command
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        return [binary, "-c", "-f", str(self.conf)] if check else [binary, "-W", "-db", "-f", str(self.conf)]

    def start(self) -> Proxy:
        # Otherwise the wait below would take that listener for the proxy, and a proxy that could
        # not bind would leave its clients talking to whatever holds the port.
        if port_open(self.port):
            raise AssertionError(f"something already listens on {self.kind}'s port {self.port}")
        self._write_conf(self.servers)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self._command(), stdout=out, stderr=subprocess.STDOUT)
        wait_for(
            lambda: port_open(self.port) or self.proc is None or self.proc.poll() is not None,
            timeout=30,
            what=f"{self.kind} to listen",
        )
        assert self.proc.poll() is None, f"{self.kind} exited: {self.log.read_text(errors='replace')}"
        return self

    def reload(self, servers: list[str]) -> None:
        """New configuration, then SIGHUP to the master (nginx -s reload / HAProxy -W reload)."""
        assert self.proc is not None
        self._write_conf(servers)
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # fast shutdown (both proxies)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None


def text_message(message_id: str, text: str) -> dict[str, object]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}
