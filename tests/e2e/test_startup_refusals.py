"""Starts the machine refuses, and commands that refuse before they act: one line naming the
flag, and no trace left in the data directory.

A refused start (a port in use, a flag's file missing, plaintext on a non-loopback address)
used to leave `LOCK` and `objects/` behind, and a port in use printed gRPC core's own line
above the server's. A data directory the server cannot write is refused at start, naming
--data-dir and the path (it used to start, report SERVING, and fail every write). The cases
of permissions run the server as uid 65534 when the tests run as root (a root process writes
whatever the modes say), with `setpriv` (.ci/run installs it when missing)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import sessions_client
import sessions_proto
import sessions_server
from sessions_server.cli import parse_arguments
from sessions_server.config import ServerConfig
from tests.e2e.test_cli_flags import _port_taken

NOBODY = 65534


def _cli(
    *args: str, stdin: str | None = None, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    python = prefix or (sys.executable,)
    return subprocess.run(
        [*python, "-m", "sessions_server.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def _only_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The command's whole standard error, one line: nothing of gRPC's own, no traceback."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def _contents(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


# -- a refused start leaves the data directory as it was -------------------------------------


REFUSED_STARTS = {
    # id: (flags, {port} for a port in use, expected in the line)
    "listen-port-in-use": (["--listen", "127.0.0.1:{port}"], "(--listen): Address already in use"),
    "metrics-port-in-use": (["--metrics-listen", "127.0.0.1:{port}"], "(--metrics-listen): Address already in use"),
    "probe-port-in-use": (["--probe-listen", "127.0.0.1:{port}"], "(--probe-listen): Address already in use"),
    "tls-files-missing": (["--tls-cert", "missing.pem", "--tls-key", "missing.key"], "could not read --tls-cert"),
    "tokens-file-missing": (["--tokens-file", "missing.json"], "cannot read tokens file missing.json"),
    "ring-file-missing": (["--ring-file", "missing.json"], "cannot read ring file missing.json"),
    "plaintext-not-on-loopback": (["--listen", "0.0.0.0:0"], "refusing plaintext on non-loopback address 0.0.0.0"),
}


@pytest.mark.parametrize(("flags", "expected"), REFUSED_STARTS.values(), ids=REFUSED_STARTS.keys())
def test_a_refused_start_leaves_the_data_directory_untouched(
    tmp_path: Path, flags: list[str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data_dir = tmp_path / "data"
    for existing in (False, True):
        if existing:
            data_dir.mkdir()  # a volume mounted empty, say
        with _port_taken() as port:
            argv = ["serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"]
            argv += [flag.format(port=port) for flag in flags]
            done = _cli(*argv)
        line = _only_line(done, 1)
        assert line.startswith("sessions-server: ") and expected in line, line
        assert "listening on" not in done.stdout
        if existing:
            assert _contents(data_dir) == [], "the start left files in the data directory"
        else:
            assert not data_dir.exists(), f"the start made the data directory: {_contents(data_dir)}"


def test_a_port_in_use_is_told_in_one_line_and_the_port_is_free_after(tmp_path: Path) -> None:
    """gRPC core logged "E... add_port.cc ... Failed to add port" above the server's line."""
    with _port_taken() as port:
        done = _cli("serve", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}")
    assert (
        _only_line(done, 1)
        == f"sessions-server: could not listen on 127.0.0.1:{port} (--listen): Address already in use"
    )


# -- flags that go together ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--tls-cert", "server.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-key", "server.key"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert and --tls-key"),
        (["--summarizer-url", "notaurl"], "--summarizer-url 'notaurl' is no http or https URL with a host"),
        (["--summarizer-url", "ftp://llm/v1"], "--summarizer-url 'ftp://llm/v1' is no http or https URL"),
        # The resolver wrapped a port past 65,535 onto another (94897: 29361), and the key and
        # the conversation went to whatever listened there.
        (["--summarizer-url", "http://127.0.0.1:94897/v1"], "--summarizer-url 'http://127.0.0.1:94897/v1' is no "),
        (["--summarizer-url", "http://llm:abc/v1"], "--summarizer-url 'http://llm:abc/v1' is no http or https URL"),
        (["--summarizer-url", "http://llm:0/v1"], "--summarizer-url 'http://llm:0/v1' is no http or https URL"),
        # The refusal quotes the URL without its credentials, which would reach the logs.
        (
            ["--summarizer-url", "https://u:secret@llm/v1"],
            "--summarizer-url 'https://***@llm/v1' is a URL holding credentials",
        ),
        (["--summarizer-url", "//u:secret@llm:1/v1"], "--summarizer-url '//***@llm:1/v1' is no http or https URL"),
        (["--summarizer-url", "https://u:se/c?r#et@llm/v1"], "--summarizer-url 'https://***@llm/v1' is no http"),
        (["--summarizer-url", "https://llm/v1#x"], "--summarizer-url 'https://llm/v1#x' is a URL with a fragment"),
        (["--summarizer-url", "http://ll m/v1"], "--summarizer-url 'http://ll m/v1' is a URL holding spaces"),
        (["--summarizer-model", "m"], "--summarizer-model has no effect without --summarizer-url"),
        (
            ["--max-connection-age-grace-seconds", "5"],
            "--max-connection-age-grace-seconds has no effect without --max-connection-age-seconds",
        ),
        (
            ["--summarizer-timeout-seconds", "5", "--summarizer-api-key-env", "KEY"],
            "--summarizer-api-key-env and --summarizer-timeout-seconds have no effect without --summarizer-url",
        ),
    ],
    ids=[
        "cert-alone",
        "key-alone",
        "client-ca-alone",
        "summarizer-no-url",
        "summarizer-not-http",
        "summarizer-port-past-65535",
        "summarizer-port-not-a-number",
        "summarizer-port-0",
        "summarizer-credentials",
        "summarizer-credentials-no-scheme",
        "summarizer-credentials-cut-short",
        "summarizer-fragment",
        "summarizer-space",
        "summarizer-model-alone",
        "connection-age-grace-alone",
        "summarizer-settings-alone",
    ],
)
def test_tls_flags_without_their_pair_are_refused_as_the_command_line(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They exited 1 without the usage, as a start the machine refused (a summarizer URL that is
    none started, and failed at the first compaction)."""
    with pytest.raises(SystemExit) as exit_info:
        parse_arguments(["serve", "--data-dir", "data", *flags])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("usage: sessions-server serve ")
    assert lines[-1].startswith(f"sessions-server serve: error: {expected}"), lines


def test_summarizer_settings_take_their_defaults_and_what_is_given() -> None:
    url = ["--summarizer-url", "https://llm.example/v1"]
    defaults = parse_arguments(["serve", "--data-dir", "data", *url])
    given = parse_arguments(
        ["serve", "--data-dir", "data", *url, "--summarizer-model", "m", "--summarizer-timeout-seconds", "5"]
    )
    assert (defaults.summarizer_model, defaults.summarizer_api_key_env, defaults.summarizer_timeout_seconds) == (
        ServerConfig.summarizer_model,
        ServerConfig.summarizer_api_key_env,
        ServerConfig.summarizer_timeout_seconds,
    )
    assert (given.summarizer_model, given.summarizer_timeout_seconds) == ("m", 5.0)
    assert parse_arguments(["serve", "--data-dir", "data"]).summarizer_model == ServerConfig.summarizer_model


# -- hash-token --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "stdin"),
    [(["hash-token", ""], None), (["hash-token"], ""), (["hash-token"], "  \n"), (["hash-token", "  "], None)],
    ids=["empty-argument", "empty-stdin", "blank-stdin", "blank-argument"],
)
def test_hash_token_refuses_an_empty_token(argv: list[str], stdin: str | None) -> None:
    """It printed the SHA-256 of the empty string, for a tokens file."""
    done = _cli(*argv, stdin=stdin if stdin is not None else "")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].startswith("sessions-server hash-token: error: the token is empty")


def test_hash_token_reads_standard_input_and_its_help_recommends_it() -> None:
    from sessions_server.transport.auth import hash_token

    done = _cli("hash-token", stdin="a-secret\n")
    assert (done.returncode, done.stdout.strip()) == (0, hash_token("a-secret"))
    helped = " ".join(_cli("hash-token", "--help").stdout.split())
    assert "standard input" in helped and "ps" in helped


# -- import-store ------------------------------------------------------------------------------


def test_a_refused_offline_import_leaves_no_data_directory_it_made(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is no SQLite file" * 100)
    data_dir = tmp_path / "fresh" / "data"
    done = _cli("import-store", str(garbage), "--object-key", "k", "--data-dir", str(data_dir))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "is not a usable SQLite store" in done.stderr
    assert not (tmp_path / "fresh").exists(), _contents(tmp_path / "fresh")


# -- stdout and the JSON logs --------------------------------------------------------------------


def test_with_json_logs_stdout_carries_the_two_plain_lines_and_stderr_json(tmp_path: Path) -> None:
    """Documented (README, Operations): tools read the address from the "listening on" line."""
    command = [sys.executable, "-m", "sessions_server.cli", "serve", "--listen", "127.0.0.1:0"]
    command += ["--data-dir", str(tmp_path / "data"), "--log-format", "json", "--log-level", "INFO"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until the server prints it (or exits)
        assert first.startswith("sessions-server listening on 127.0.0.1:"), first
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0
    assert out.splitlines() == ["sessions-server stopped"]
    records = [json.loads(line) for line in err.splitlines()]
    assert any("draining" in record.get("message", "") for record in records), records


# -- a data directory the server cannot write ----------------------------------------------------


def _nobody_python() -> tuple[str, ...] | None:
    """A command prefix running this Python's server as uid 65534, which can import it; None
    when none can. As non-root, the tests' own user will do."""
    if os.getuid() != 0:
        return (sys.executable,)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    drop = (setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in dict.fromkeys((sys.executable, sys._base_executable, f"/usr/bin/python{version}")):
        done = subprocess.run(
            [*drop, python, "-c", "import sessions_server.cli, grpc"],
            env=_nobody_env(),
            capture_output=True,
            timeout=60,
            check=False,
            cwd="/",
        )
        if done.returncode == 0:
            return (*drop, python)
    return None


def _nobody_env() -> dict[str, str]:
    """The import path of this Python, for a Python run as another user: site-packages, and the
    packages installed in development mode (their path hook is a .pth file, which PYTHONPATH
    does not read)."""
    paths = [
        str(Path(module.__file__).parents[1])
        for module in (sessions_server, sessions_client, sessions_proto)
        if module.__file__
    ]
    paths += [path for path in sys.path if path.endswith("site-packages")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


@pytest.fixture
def as_nobody() -> tuple[str, ...]:
    python = _nobody_python()
    assert python is not None, (
        "running as root, no Python here runs the server as uid 65534 (setpriv, from util-linux, and "
        "a Python outside /root: .ci/run installs setpriv; the machine's /usr/bin/python3 serves)"
    )
    return python


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory uid 65534 can reach (pytest's tmp_path is private to the tests' user)."""
    path = Path(tempfile.mkdtemp(prefix="sessions-perm-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for child in (path, *path.rglob("*")):
            with contextlib.suppress(OSError):
                child.chmod(0o755 if child.is_dir() else 0o644)
        shutil.rmtree(path, ignore_errors=True)


def _owned_by_nobody(path: Path) -> None:
    if os.getuid() == 0:
        os.chown(path, NOBODY, NOBODY)


@pytest.mark.parametrize("unwritable", ["objects", "scratch"])
def test_a_data_directory_whose_objects_cannot_be_written_is_refused_at_start(
    shared_tmp: Path, as_nobody: tuple[str, ...], unwritable: str
) -> None:
    """It started, reported SERVING, and failed every write (STORAGE_FAILURE)."""
    data_dir = shared_tmp / "data"
    for directory in (data_dir, data_dir / "objects", data_dir / "scratch"):
        directory.mkdir(exist_ok=True)
        _owned_by_nobody(directory)
    (data_dir / unwritable).chmod(0o555)
    done = _cli("serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", prefix=as_nobody, env=_nobody_env())
    line = _only_line(done, 1)
    assert line.startswith(
        f"sessions-server: --data-dir {data_dir}: {data_dir / unwritable} is not writable: cannot create a file in it "
        "(Permission denied)"
    ), line
    assert "listening on" not in done.stdout
    assert _contents(data_dir) == ["objects", "scratch"]  # its LOCK too is gone: the start made it


@pytest.mark.parametrize("below", [False, True], ids=["the-directory", "a-directory-to-make-in-it"])
def test_a_data_directory_that_cannot_be_written_is_named_with_the_flag(
    shared_tmp: Path, as_nobody: tuple[str, ...], below: bool
) -> None:
    """It printed "sessions-server: [Errno 13] Permission denied: '.../LOCK'"."""
    read_only = shared_tmp / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)  # and owned by another user than 65534 when run as root
    data_dir = read_only / "sub" if below else read_only
    done = _cli("serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", prefix=as_nobody, env=_nobody_env())
    line = _only_line(done, 1)
    if below:
        assert line == f"sessions-server: --data-dir {data_dir}: cannot create {data_dir} (Permission denied)"
    else:
        assert line == (
            f"sessions-server: --data-dir {data_dir}: {data_dir} is not writable: cannot create "
            f"{data_dir / 'LOCK'} (Permission denied)"
        )
    done = _cli(
        "import-store",
        str(shared_tmp / "x.sqlite"),
        "--object-key",
        "k",
        "--data-dir",
        str(data_dir),
        prefix=as_nobody,
        env=_nobody_env(),
    )
    assert _only_line(done, 1) == line.replace("sessions-server:", "sessions-server import-store:", 1)


def test_a_wildcard_listen_is_left_to_grpc_which_binds_it_its_own_way() -> None:
    """gRPC binds `[::]` dual-stack, else 0.0.0.0: a trial bind of one address could refuse a
    start it accepts (`[::]` on a host without IPv6)."""
    from sessions_server.transport.server import _bind_refusal

    with _port_taken() as port:
        assert _bind_refusal(f"127.0.0.1:{port}") == "Address already in use"
        assert _bind_refusal(f"0.0.0.0:{port}") is None
        assert _bind_refusal(f"[::]:{port}") is None
