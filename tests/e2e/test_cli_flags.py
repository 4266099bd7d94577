"""`sessions-server` command lines an operator gets wrong, and the admin commands over TLS.

A flag given a value it cannot take is refused before anything starts (exit 2) with a line
naming the flag, the value and what it takes; a start the machine refuses (a port taken, a file
where the data directory goes) exits 1 with a line naming the flag. Neither prints a traceback.
`move-object`, `abort-move` and `import-store --to` reach servers that speak TLS or mTLS.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessions_client import SessionsClient, SessionsError, TlsConfig
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.cli import parse_arguments
from sessions_server.config import ServerConfig
from sessions_server.storage.paths import object_path
from tests.e2e.conftest import ServerProcess
from tests.security.test_auth_tls import pki as pki  # the CA and certificates: a fixture, used by its name

pytestmark = pytest.mark.long  # about 50 s: started first (see tests/conftest.py)

# Numeric flags whose help gives 0 a meaning of its own; every other one takes only more than 0.
ZERO_ALLOWED = {
    "--message-memo-bytes",
    "--idle-seconds",
    "--max-client-message-bytes",
    "--max-streams-per-token",
    "--drain-seconds",
    "--max-connection-idle-seconds",
    "--max-connection-age-seconds",
}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessions_server.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _refusal(done: subprocess.CompletedProcess[str], code: int, prefix: str) -> str:
    """The one line starting with `prefix` that says why the command failed with `code`."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, done.stderr
    return lines[0]


def _parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line of a command line refused at parsing, run in-process (nothing starts)."""
    with pytest.raises(SystemExit) as exit_info:
        parse_arguments(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("usage: "), lines  # the usage, then the reason
    return lines[-1]


@contextlib.contextmanager
def _port_taken() -> Iterator[int]:
    """A loopback port another program listens on for as long as the block runs."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


# -- serve: addresses, log level -------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--listen", "127.0.0.1", "the port is missing; expected HOST:PORT, PORT from 0 to 65535"),  # was port 443
        ("--listen", "127.0.0.1:99999", "the port '99999' is not a number from 0 to 65535"),  # was 99999 % 65536
        ("--listen", "nonsense", "the port is missing"),  # was "refusing plaintext on ... nonsense"
        ("--listen", "::1:50051", "an IPv6 address goes in brackets, as [::1]:PORT"),
        ("--listen", "300.1.1.1:50051", "300.1.1.1 is not an IPv4 address"),
        ("--listen", ":50051", "the host is missing"),
        ("--metrics-listen", "127.0.0.1", "the port is missing; expected HOST:PORT, PORT from 1 to 65535"),
        ("--metrics-listen", "127.0.0.1:0", "port 0 would pick a port nobody is told"),
        ("--probe-listen", "127.0.0.1", "the port is missing; expected HOST:PORT, PORT from 0 to 65535"),
    ],
)
def test_an_address_that_is_not_host_and_port_is_refused_at_start(
    tmp_path: Path, flag: str, value: str, expected: str
) -> None:
    done = _cli("serve", "--data-dir", str(tmp_path / "data"), flag, value)
    line = _refusal(done, 2, "sessions-server serve: error: ")
    assert line.startswith(f"sessions-server serve: error: argument {flag}: {value!r}: "), line
    assert expected in line
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_addresses_of_every_form_are_taken(capsys: pytest.CaptureFixture[str]) -> None:
    for host in ("127.0.0.1", "0.0.0.0", "[::1]", "[::]", "localhost", "shard-3.internal"):
        for port in (0, 1, 65535):
            assert parse_arguments(["serve", "--listen", f"{host}:{port}"]).listen == f"{host}:{port}"
        assert parse_arguments(["serve", "--metrics-listen", f"{host}:9100"]).metrics_listen == f"{host}:9100"
        assert parse_arguments(["serve", "--probe-listen", f"{host}:50052"]).probe_listen == f"{host}:50052"
    assert capsys.readouterr().err == ""


def test_a_hostname_with_port_zero_listens_on_the_port_it_prints(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", "--listen", "localhost:0").start()
    try:
        host, port = server.address.rsplit(":", 1)
        assert host == "localhost" and int(port) > 0
        with SessionsClient(server.address) as client:
            assert client.object("k").session().append_message({"id": "m1", "role": "user", "parts": []}).inserted
    finally:
        server.stop()


def test_an_unknown_log_level_is_refused_and_any_case_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = _cli("serve", "--data-dir", str(tmp_path / "data"), "--log-level", "LOUD")  # was a ValueError traceback
    line = _refusal(done, 2, "sessions-server serve: error: ")
    assert "argument --log-level: invalid choice: 'LOUD' (choose from" in line
    assert "'WARNING'" in line
    assert parse_arguments(["serve", "--log-level", "info"]).log_level == "INFO"


# -- serve: numeric flags --------------------------------------------------------------------


def _numeric_flags() -> list[argparse.Action]:
    """Every numeric flag `serve --help` shows (argparse lists them only in `_actions`)."""
    serve: argparse.ArgumentParser = parse_arguments(["serve"]).command_parser
    return [
        action
        for action in serve._actions
        if action.type in (int, float) and action.help != argparse.SUPPRESS and action.option_strings
    ]


def test_every_numeric_flag_refuses_values_out_of_its_range(capsys: pytest.CaptureFixture[str]) -> None:
    flags = _numeric_flags()
    assert len(flags) >= 20  # the listing found them
    assert {action.option_strings[0] for action in flags} >= ZERO_ALLOWED
    for action in flags:
        flag = action.option_strings[0]
        # A summarizer setting alone is refused for want of the URL, the age's grace for want of the
        # age (test_startup_refusals).
        serve = ["serve"]
        if flag.startswith("--summarizer-"):
            serve += ["--summarizer-url", "https://llm.example/v1"]
        elif flag == "--max-connection-age-grace-seconds":
            serve += ["--max-connection-age-seconds", "60"]
        default = getattr(ServerConfig, action.dest) if action.default is None else action.default
        assert (flag in ZERO_ALLOWED) == ("; 0 " in (action.help or "")), (flag, action.help)  # as --help says
        assert "-1" in _parse_error([*serve, flag, "-1"], capsys), flag
        assert flag in _parse_error([*serve, flag, "-1"], capsys), flag
        if action.type is float:
            assert f"{flag} must be a finite number, not nan" in _parse_error([*serve, flag, "nan"], capsys)
            assert f"{flag} must be a finite number, not inf" in _parse_error([*serve, flag, "inf"], capsys)
        if flag in ZERO_ALLOWED:
            assert getattr(parse_arguments([*serve, flag, "0"]), action.dest) == 0
            assert f"{flag} must be 0 (" in _parse_error([*serve, flag, "-1"], capsys)
        else:
            assert f"{flag} must be greater than 0, not 0" in _parse_error([*serve, flag, "0"], capsys)
        # The default stays a value the flag takes.
        assert getattr(parse_arguments([*serve, flag, str(default)]), action.dest) == default


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--max-open-objects", "-1", "--max-open-objects must be greater than 0, not -1"),  # was accepted
        ("--max-request-bytes", "0", "--max-request-bytes must be greater than 0, not 0"),  # was accepted
        ("--max-request-bytes", str(2**31), "--max-request-bytes must be at most 2147483647"),  # was OverflowError
        ("--keepalive-seconds", "1e10", "--keepalive-seconds must be at most 2147483"),  # was OverflowError
        ("--keepalive-seconds", "0.0001", "--keepalive-seconds must be at least 0.001"),  # would turn pings off
        # Stored, then unsendable: a summary past a response's payload, an id beside every piece.
        ("--max-summary-bytes", str(8 << 20), "--max-summary-bytes must be at most 3145728"),
        ("--max-message-id-bytes", "3000000", "--max-message-id-bytes must be at most 131072"),
        ("--max-role-bytes", "131073", "--max-role-bytes must be at most 131072"),
        ("--max-object-key-bytes", "65537", "--max-object-key-bytes must be at most 65536"),
        ("--max-concurrent-streams", "x", "argument --max-concurrent-streams: invalid int value: 'x'"),
    ],
)
def test_a_numeric_flag_out_of_range_is_refused_by_the_command(
    tmp_path: Path, flag: str, value: str, expected: str
) -> None:
    done = _cli("serve", "--data-dir", str(tmp_path / "data"), flag, value)
    assert expected in _refusal(done, 2, "sessions-server serve: error: ")
    assert done.stderr.startswith("usage: sessions-server serve [--listen HOST:PORT]")


@pytest.mark.parametrize(
    ("key", "flags", "expected"),
    [
        ("", [], "--object-key: object_key must not be empty"),
        ("bad\nkey", [], "--object-key: object_key holds a control character (U+000A) at index 3"),
        ("k" * 2_000, [], "--object-key: object_key is 2000 bytes"),
        ("k" * 2_000, ["--max-object-key-bytes", "65537"], "--max-object-key-bytes must be at most 65536"),
    ],
    ids=["empty", "control-character", "too-long", "limit-past-its-most"],
)
def test_import_store_refuses_a_key_no_call_could_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, flags: list[str], expected: str
) -> None:
    """import-store installed such objects and exited 0: listed by ListObjects, then refused by
    every call that names them (INVALID_OBJECT_KEY), so they could be neither read, moved nor
    erased. A key past the default limit is taken where the limit is raised."""
    argv = ["import-store", str(tmp_path / "store.sqlite"), "--object-key", key, "--data-dir", str(tmp_path / "d")]
    assert _parse_error([*argv, *flags], capsys).startswith(f"sessions-server import-store: error: {expected}")
    if key == "k" * 2_000:
        assert parse_arguments([*argv, "--max-object-key-bytes", "4096"]).object_key == key


def test_move_object_refuses_one_server_as_both_ends(capsys: pytest.CaptureFixture[str]) -> None:
    """The destination refused the import as the source it was (OBJECT_MOVING, its lock this
    very move's), and the advice given, abort-move then move again, led back to it."""
    argv = ["move-object", "--object-key", "k", "--from", "127.0.0.1:7000", "--to", "127.0.0.1:7000"]
    assert _parse_error(argv, capsys) == (
        "sessions-server move-object: error: --from and --to name the same server (127.0.0.1:7000): "
        "an object moves between two servers"
    )


# -- serve: what the machine refuses ---------------------------------------------------------


def test_a_listen_port_in_use_is_named(tmp_path: Path) -> None:
    with _port_taken() as port:
        done = _cli("serve", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}")
    line = _refusal(done, 1, "sessions-server: ")
    assert line == f"sessions-server: could not listen on 127.0.0.1:{port} (--listen): Address already in use"
    assert "listening on" not in done.stdout


@pytest.mark.parametrize(
    ("flag", "reason"),
    [("--metrics-listen", "Address already in use"), ("--probe-listen", "Address already in use")],
)
def test_a_second_port_in_use_is_named(tmp_path: Path, flag: str, reason: str) -> None:
    with _port_taken() as port:
        done = _cli("serve", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", flag, f"127.0.0.1:{port}")
    line = _refusal(done, 1, "sessions-server: ")
    assert line == f"sessions-server: could not listen on 127.0.0.1:{port} ({flag}): {reason}"
    assert "listening on" not in done.stdout
    # It gave the data directory and the main port back: a server started on it now runs.
    ServerProcess(tmp_path / "data").start().stop()


def test_the_probe_port_is_printed_and_answers_health(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", "--probe-listen", "127.0.0.1:0").start()
    try:
        match = re.search(r"probes: (127\.0\.0\.1:\d+)\)", server.banner)
        assert match is not None, server.banner
        assert match.group(1) != server.address
        with grpc.insecure_channel(match.group(1)) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop()


def test_a_data_directory_that_is_a_file_is_named(tmp_path: Path) -> None:
    a_file = tmp_path / "data"
    a_file.write_text("not a directory")
    done = _cli("serve", "--data-dir", str(a_file), "--listen", "127.0.0.1:0")  # was "[Errno 17] File exists"
    line = _refusal(done, 1, "sessions-server: ")
    assert line.startswith(f"sessions-server: --data-dir {a_file} is a file; expected a directory")

    below = a_file / "objects"
    done = _cli("serve", "--data-dir", str(below), "--listen", "127.0.0.1:0")
    line = _refusal(done, 1, "sessions-server: ")
    assert line.startswith(f"sessions-server: --data-dir {below} (its parent {a_file}) is a file")

    done = _cli("import-store", str(tmp_path / "upstream.sqlite"), "--object-key", "k", "--data-dir", str(a_file))
    line = _refusal(done, 1, "sessions-server import-store: ")
    assert line.startswith(f"sessions-server import-store: --data-dir {a_file} is a file")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (("server.pem", "client.key", None), "are no certificate chain and matching private key in PEM"),
        (("server.pem", "server.key", "san.ext"), "--tls-client-ca san.ext holds no CA certificates in PEM"),
        (("server.pem", "missing.key", None), "could not read --tls-key missing.key: No such file or directory"),
    ],
    ids=["key-of-another-certificate", "client-ca-not-pem", "key-missing"],
)
def test_serve_refuses_tls_files_that_do_not_load(
    tmp_path: Path, pki: Path, files: tuple[str, str, str | None], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(pki)
    cert, key, client_ca = files
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--tls-cert", cert]
    argv += ["--tls-key", key, *(["--tls-client-ca", client_ca] if client_ca else [])]
    line = _refusal(_cli(*argv), 1, "sessions-server: ")
    assert expected in line


# -- admin commands over TLS -----------------------------------------------------------------


def _tls_server(data_dir: Path, pki: Path, *extra: str) -> ServerProcess:
    return ServerProcess(
        data_dir, "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"), *extra
    ).start()


def _trusting(pki: Path, *, client_certificate: bool = False) -> TlsConfig:
    if not client_certificate:
        return TlsConfig(root_certificates=(pki / "ca.pem").read_bytes())
    return TlsConfig(
        root_certificates=(pki / "ca.pem").read_bytes(),
        certificate_chain=(pki / "client.pem").read_bytes(),
        private_key=(pki / "client.key").read_bytes(),
    )


def _lock_as_a_cut_short_move(client: SessionsClient, key: str) -> None:
    """What a mover killed after its locked export leaves: the lock, for its lease (an hour)."""
    client.object(key).session().append_message({"id": "m1", "role": "user", "parts": []})
    request = pb.ExportObjectRequest(object_key=key, lock_for_move=True, lease_seconds=3600)
    assert list(client._stub.ExportObject(request, metadata=routing_metadata(key)))[-1].sha256


def _takes_writes(client: SessionsClient, key: str) -> bool:
    try:
        client.object(key).session().append_message({"id": "probe", "role": "user", "parts": []})
    except SessionsError as error:
        assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING"), error
        return False
    return True


def test_abort_move_reaches_a_tls_server_with_tls_ca(tmp_path: Path, pki: Path) -> None:
    server = _tls_server(tmp_path / "data", pki)
    try:
        with SessionsClient(server.address, tls=_trusting(pki), retry=None) as client:
            _lock_as_a_cut_short_move(client, "locked")

            plaintext = _cli("abort-move", "--from", server.address, "--object-key", "locked")
            line = _refusal(plaintext, 1, "sessions-server abort-move: ")
            assert line.startswith(f"sessions-server abort-move: 'locked' on {server.address}: UNAVAILABLE: ")
            assert "it may speak TLS alone (a server run with --tls-cert does: give --tls-ca PEM, or --tls for" in line
            assert not _takes_writes(client, "locked")

            # The system's roots do not hold the suite's CA: TLS is spoken, the certificate refused,
            # and the hint is the CA's, not a client certificate's (an audit found the latter).
            system_roots = _cli("abort-move", "--from", server.address, "--object-key", "locked", "--tls")
            line = _refusal(system_roots, 1, "sessions-server abort-move: ")
            assert "CERTIFICATE_VERIFY_FAILED" in line
            assert line.endswith("(the server's certificate is not trusted: give --tls-ca with the CA that issued it)")
            assert not _takes_writes(client, "locked")

            done = _cli(
                "abort-move", "--from", server.address, "--object-key", "locked", "--tls-ca", str(pki / "ca.pem")
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout == f"released the move lock of 'locked' on {server.address}: it takes writes again\n"
            assert _takes_writes(client, "locked")
    finally:
        server.stop()


def test_abort_move_presents_a_client_certificate_to_an_mtls_server(tmp_path: Path, pki: Path) -> None:
    server = _tls_server(tmp_path / "data", pki, "--tls-client-ca", str(pki / "ca.pem"))
    command = ["abort-move", "--from", server.address, "--object-key", "locked", "--tls-ca", str(pki / "ca.pem")]
    try:
        with SessionsClient(server.address, tls=_trusting(pki, client_certificate=True), retry=None) as client:
            _lock_as_a_cut_short_move(client, "locked")

            anonymous = _cli(*command)
            assert _refusal(anonymous, 1, "sessions-server abort-move: ").startswith(
                f"sessions-server abort-move: 'locked' on {server.address}: UNAVAILABLE: "
            )
            assert not _takes_writes(client, "locked")

            done = _cli(*command, "--tls-cert", str(pki / "client.pem"), "--tls-key", str(pki / "client.key"))
            assert done.returncode == 0, done.stderr
            assert "released the move lock of 'locked'" in done.stdout
            assert _takes_writes(client, "locked")
    finally:
        server.stop()


def test_move_object_between_tls_servers_and_import_store_to_one(tmp_path: Path, pki: Path) -> None:
    source = _tls_server(tmp_path / "a", pki)
    destination = _tls_server(tmp_path / "b", pki)
    tls_ca = ["--tls-ca", str(pki / "ca.pem")]
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "over TLS"}]}
    try:
        with (
            SessionsClient(source.address, tls=_trusting(pki)) as a,
            SessionsClient(destination.address, tls=_trusting(pki)) as b,
        ):
            a.object("travels").session().append_message(message)
            moved = _cli(
                "move-object", "--from", source.address, "--to", destination.address, "--object-key", "travels", *tls_ca
            )
            assert moved.returncode == 0, moved.stderr
            assert "moved 'travels'" in moved.stdout
            assert b.object("travels").session().get_history() == [message]
            assert not object_path(source.data_dir, "travels").exists()

            # A store file of the object (as a server writes it), sent to the other server.
            store = tmp_path / "upstream.sqlite"
            live = sqlite3.connect(object_path(destination.data_dir, "travels"))
            with contextlib.closing(live), contextlib.closing(sqlite3.connect(store)) as copy:
                live.backup(copy)
            sent = _cli("import-store", str(store), "--object-key", "imported", "--to", source.address, *tls_ca)
            assert sent.returncode == 0, sent.stderr
            assert f"imported {store} as object 'imported' on {source.address}: 1 messages" in sent.stdout
            assert a.object("imported").session().get_history() == [message]
    finally:
        source.stop()
        destination.stop()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tls-cert", "client.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-key", "client.key"], "--tls-cert and --tls-key go together"),
        (["--tls-ca", "missing.pem"], "--tls-ca missing.pem: cannot read it (No such file or directory)"),
        (["--tls-ca", "san.ext"], "--tls-ca san.ext: not a PEM file; expected CA certificates"),
        (
            ["--tls-cert", "client.pem", "--tls-key", "server.key"],
            "--tls-cert client.pem and --tls-key server.key are no certificate chain and matching private key",
        ),
    ],
)
def test_tls_flags_that_cannot_work_are_refused(
    pki: Path,
    argv: list[str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(pki)
    for command in (
        ["abort-move", "--from", "127.0.0.1:1", "--object-key", "k"],
        ["move-object", "--from", "127.0.0.1:1", "--to", "127.0.0.1:2", "--object-key", "k"],
        ["import-store", "store.sqlite", "--object-key", "k", "--to", "127.0.0.1:1"],
        ["export-store", "saved.sqlite", "--object-key", "k", "--from", "127.0.0.1:1"],
    ):
        line = _parse_error([*command, *argv], capsys)
        assert line.startswith(f"sessions-server {command[0]}: error: {expected}"), line


def test_import_store_into_a_data_directory_takes_no_tls_flags(capsys: pytest.CaptureFixture[str]) -> None:
    line = _parse_error(["import-store", "store.sqlite", "--object-key", "k", "--data-dir", "data", "--tls"], capsys)
    assert line.endswith("--tls, --tls-ca, --tls-cert and --tls-key are for --to ADDRESS (a running server)")


def test_the_version_is_printed() -> None:
    result = _cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("sessions-server "), result
    assert result.stdout.split()[1][0].isdigit()


def test_move_object_takes_a_lease_within_what_servers_take(capsys: pytest.CaptureFixture[str]) -> None:
    """The lease was fixed at 600 s: an object whose move takes longer could never move (its
    delete is refused once the lock has expired)."""
    from sessions_client.admin import MOVE_LEASE_SECONDS
    from sessions_server import cli

    move = ["move-object", "--from", "a:1", "--to", "b:2", "--object-key", "k"]
    assert parse_arguments(move).lease_seconds == cli.MOVE_LEASE_SECONDS == MOVE_LEASE_SECONDS
    assert parse_arguments([*move, "--lease-seconds", "86400"]).lease_seconds == 86_400
    for value in ("0", "86401", "1.5"):
        assert "argument --lease-seconds:" in _parse_error([*move, "--lease-seconds", value], capsys)


def test_a_connection_refused_over_tls_without_a_client_certificate_names_the_flags() -> None:
    """A server asking for client certificates closes the connection ("Socket closed"), as one
    refusing plaintext does: the admin commands name the flags that may be missing either way."""
    from sessions_client import TlsConfig
    from sessions_server.cli import _call_failure

    closed = SessionsError(
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Socket closed",
        None,
        {},
    )
    anonymous = _call_failure(closed, tls=TlsConfig(root_certificates=b"ca"))
    assert anonymous.endswith("(if the server asks for client certificates, give --tls-cert PEM --tls-key PEM)")
    identified = TlsConfig(root_certificates=b"ca", certificate_chain=b"chain", private_key=b"key")
    assert "--tls-cert" not in _call_failure(closed, tls=identified)
    assert _call_failure(closed, tls=None).endswith("give --tls-ca PEM, or --tls for the system's roots)")


def test_tls_flags_given_to_a_plaintext_server_are_named(tmp_path: Path, pki: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        speaking_tls = _cli(
            "abort-move", "--from", server.address, "--object-key", "k", "--tls-ca", str(pki / "ca.pem")
        )
        line = _refusal(speaking_tls, 1, "sessions-server abort-move: ")
        assert "WRONG_VERSION_NUMBER" in line
        assert line.endswith("(the server speaks plaintext: leave out --tls, --tls-ca, --tls-cert and --tls-key)")
    finally:
        server.stop()


def test_a_client_certificate_the_server_refused_is_told_in_the_commands_flags() -> None:
    """The client's reading of a connection closed after the handshake named its Python fields
    ("set TlsConfig's certificate_chain and private_key") to a command's user; so would its
    reading of a plaintext one closed before HTTP/2 ("tls=TlsConfig(...)")."""
    from sessions_client import TlsConfig
    from sessions_client._retry import closed_before_http2
    from sessions_server.cli import _call_failure

    closed = SessionsError(
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Socket closed",
        None,
        {},
    )
    line = _call_failure(closed_before_http2(closed, tls=True), tls=TlsConfig(root_certificates=b"ca"))
    assert "TlsConfig" not in line and "give --tls-cert PEM --tls-key PEM of a CA it trusts" in line
    plaintext = _call_failure(closed_before_http2(closed, tls=False), tls=None)
    assert "TlsConfig" not in plaintext and "it may speak TLS alone" in plaintext
    assert "give --tls-ca PEM, or --tls for the system's roots" in plaintext


def test_a_connection_nothing_listens_for_names_no_tls_flags() -> None:
    """A move whose source died mid-move was reported with "if the server uses TLS, give
    --tls-ca": nothing listening refuses a connection, which TLS never does."""
    from sessions_client import TlsConfig
    from sessions_server.cli import _call_failure

    refused = SessionsError(
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Connection refused",
        None,
        {},
    )
    for tls in (None, TlsConfig(root_certificates=b"ca")):
        assert _call_failure(refused, tls=tls).endswith("Connection refused"), tls
