"""TLS, mTLS and bearer-token authorization against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sessions_client import RetryPolicy, SessionsClient, SessionsError, TlsConfig
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.config import ServerConfig
from sessions_server.domain.limits import Limits
from sessions_server.storage.paths import object_path
from sessions_server.transport import certificates
from sessions_server.transport.auth import hash_token, load_grants
from tests.conftest import LiveServer, start_server
from tests.reliability.support import wait_until
from tests.service.support import stream_opens, text_message

MESSAGE = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1/localhost, and a client certificate."""
    root = tmp_path_factory.mktemp("pki")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        cwd=root,
    )
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=root,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            cwd=root,
        )
    return root


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "writer", "sha256": hash_token("w-secret"), "prefixes": ["tenant-a/"], "access": "write"},
                    {"name": "reader", "sha256": hash_token("r-secret"), "prefixes": ["tenant-a/"], "access": "read"},
                ]
            }
        )
    )
    return path


@pytest.fixture
def auth_server(tmp_path: Path, tokens_file: Path) -> Iterator[LiveServer]:
    server = start_server(tmp_path / "data", tokens_file=tokens_file)
    yield server
    server.stop()


def _live_feed(channel: grpc.Channel, token: str, object_key: str, timeout: float = 30) -> Any:
    """A subscription with `token`, once registered (its first event, a progress)."""
    metadata = (("authorization", f"Bearer {token}"), ("x-object-key", object_key))
    feed = pb_grpc.SessionServiceStub(channel).Subscribe(
        pb.SubscribeRequest(object_key=object_key), metadata=metadata, timeout=timeout
    )
    assert next(feed).type == pb.CHANGE_TYPE_PROGRESS
    return feed


def _tenant_feed(channel: grpc.Channel, token: str) -> Any:
    """A live feed of one tenant-a object with `token` (the stream-share tests' unit)."""
    return _live_feed(channel, token, "tenant-a/feeds")


def _reload_tokens(server: LiveServer) -> None:
    """What SIGHUP runs, on the server's loop; returns once it has run."""

    async def reload() -> None:
        server.running.reload_tokens()

    asyncio.run_coroutine_threadsafe(reload(), server.loop).result(timeout=30)


def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(SessionsError) as info:
        call()  # type: ignore[operator]
    return info.value.code


def test_tokens_grant_prefixes_and_access(auth_server: LiveServer) -> None:
    with SessionsClient(auth_server.address, token="w-secret") as writer:
        assert writer.object("tenant-a/x").session().append_message(MESSAGE).inserted
    with SessionsClient(auth_server.address, token="r-secret") as reader:
        assert reader.object("tenant-a/x").session().get_message("m1") == MESSAGE
        assert _code(lambda: reader.object("tenant-a/x").session().append_message(MESSAGE)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert _code(lambda: reader.object("tenant-b/x").session().get_message("m1")) == (
            grpc.StatusCode.PERMISSION_DENIED
        )


def test_missing_or_unknown_token_is_unauthenticated_and_reveals_nothing(auth_server: LiveServer) -> None:
    with SessionsClient(auth_server.address) as anonymous, SessionsClient(auth_server.address, token="nope") as bad:
        for client in (anonymous, bad):
            existing = _code(lambda c=client: c.object("tenant-a/x").session().get_message("m1"))
            absent = _code(lambda c=client: c.object("tenant-a/never").session().get_message("m1"))
            assert existing == absent == grpc.StatusCode.UNAUTHENTICATED
    # Refused calls never open (or create) the object.
    assert not object_path(auth_server.data_dir, "tenant-a/never").exists()


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        (None, "missing bearer token (metadata `authorization: Bearer <token>`)"),
        ("r-secret", "the authorization metadata holds no bearer token: send `authorization: Bearer <token>`"),
        (
            "Basic cjpzZWNyZXQ=",
            "the authorization metadata holds no bearer token: send `authorization: Bearer <token>`",
        ),
        ("Bearer ", "the authorization metadata holds no bearer token: send `authorization: Bearer <token>`"),
    ],
    ids=["absent", "scheme-forgotten", "another-scheme", "empty-token"],
)
def test_a_header_without_a_bearer_token_is_told_apart_from_none(
    auth_server: LiveServer, authorization: str | None, expected: str
) -> None:
    """A header present but of another form was answered "missing bearer token"."""
    metadata = () if authorization is None else (("authorization", authorization),)
    with grpc.insecure_channel(auth_server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetObjectStats(pb.GetObjectStatsRequest(object_key="tenant-a/x"), metadata=metadata, timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    assert refused.value.details() == expected  # type: ignore[attr-defined]


def test_health_stays_open_and_tokens_reload(auth_server: LiveServer, tokens_file: Path) -> None:
    channel = grpc.insecure_channel(auth_server.address)
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    channel.close()
    tokens_file.write_text(
        json.dumps({"tokens": [{"name": "new", "sha256": hash_token("n-secret"), "prefixes": [""], "access": "write"}]})
    )
    auth_server.running.authority.reload()  # what SIGHUP triggers
    with SessionsClient(auth_server.address, token="n-secret") as fresh:
        assert fresh.object("any/key").session().append_message(MESSAGE).inserted
    with SessionsClient(auth_server.address, token="w-secret") as revoked:
        assert _code(lambda: revoked.object("tenant-a/x").session().get_message("m1")) == (
            grpc.StatusCode.UNAUTHENTICATED
        )


def test_with_a_probe_port_health_on_the_main_port_needs_a_token(tmp_path: Path, tokens_file: Path) -> None:
    """Health is open to anyone, and its requests were received whole (up to
    --max-request-bytes) and held while unfinished. With --probe-listen, probes go there (small
    requests only), and on the main port health needs a token, checked before the request is
    read: the calls below send none until released, yet are answered."""
    server = start_server(tmp_path / "data", tokens_file=tokens_file, probe_listen="127.0.0.1:0")
    held = threading.Event()
    serialize = health_pb2.HealthCheckRequest.SerializeToString

    def nothing_until_released() -> Iterator[health_pb2.HealthCheckRequest]:
        held.wait(30)
        return
        yield  # a generator that sends no request

    try:
        with grpc.insecure_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for metadata in ((), (("authorization", "Bearer nope"),)):
                with pytest.raises(grpc.RpcError) as checked:
                    health.Check(health_pb2.HealthCheckRequest(), metadata=metadata, timeout=30)
                assert checked.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
            check = channel.stream_unary(
                "/grpc.health.v1.Health/Check", serialize, health_pb2.HealthCheckResponse.FromString
            )
            watch = channel.stream_stream(
                "/grpc.health.v1.Health/Watch", serialize, health_pb2.HealthCheckResponse.FromString
            )
            try:
                with pytest.raises(grpc.RpcError) as unread:
                    check(nothing_until_released(), timeout=20)
                assert unread.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
                with pytest.raises(grpc.RpcError) as unread_watch:
                    next(watch(nothing_until_released(), timeout=20))
                assert unread_watch.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
                assert not held.is_set()  # refused while the client still had sent nothing
            finally:
                held.set()
            token = (("authorization", "Bearer r-secret"),)
            assert health.Check(health_pb2.HealthCheckRequest(), metadata=token, timeout=30).status == (
                health_pb2.HealthCheckResponse.SERVING
            )
            watched = health.Watch(health_pb2.HealthCheckRequest(), metadata=token, timeout=30)
            assert next(watched).status == health_pb2.HealthCheckResponse.SERVING
            watched.cancel()
            statuses = health.List(health_pb2.HealthListRequest(), metadata=token, timeout=30).statuses
            assert set(statuses) == {"", "sessions.v1.SessionService"}
        assert server.running.probe_address is not None
        with grpc.insecure_channel(server.running.probe_address) as channel:  # probes need none
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop()


def test_reflection_can_require_a_token(tmp_path: Path, tokens_file: Path) -> None:
    server = start_server(tmp_path / "data", tokens_file=tokens_file, auth_protect_reflection=True)
    try:
        channel = grpc.insecure_channel(server.address)
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ServerReflectionInfo(iter([request])))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answers = list(stub.ServerReflectionInfo(iter([request]), metadata=(("authorization", "Bearer r-secret"),)))
        names = {s.name for s in answers[0].list_services_response.service}
        assert "sessions.v1.SessionService" in names
        channel.close()
    finally:
        server.stop()


def test_tls_and_mtls(tmp_path: Path, pki: Path) -> None:
    tls = start_server(tmp_path / "tls", tls_cert=pki / "server.pem", tls_key=pki / "server.key")
    try:
        config = TlsConfig(root_certificates=(pki / "ca.pem").read_bytes())
        with SessionsClient(tls.address, tls=config) as client:
            assert client.object("k").session().append_message(MESSAGE).inserted
        with SessionsClient(tls.address, timeout=5, retry=None) as plaintext:
            assert _code(lambda: plaintext.object("k").session().get_message("m1")) == grpc.StatusCode.UNAVAILABLE
    finally:
        tls.stop()
    mtls = start_server(
        tmp_path / "mtls", tls_cert=pki / "server.pem", tls_key=pki / "server.key", tls_client_ca=pki / "ca.pem"
    )
    try:
        anonymous = TlsConfig(root_certificates=(pki / "ca.pem").read_bytes())
        with SessionsClient(mtls.address, tls=anonymous, timeout=5, retry=None) as client:
            assert _code(lambda: client.object("k").session().get_message("m1")) == grpc.StatusCode.UNAVAILABLE
        identified = TlsConfig(
            root_certificates=(pki / "ca.pem").read_bytes(),
            certificate_chain=(pki / "client.pem").read_bytes(),
            private_key=(pki / "client.key").read_bytes(),
        )
        with SessionsClient(mtls.address, tls=identified) as client:
            assert client.object("k").session().append_message(MESSAGE).inserted
    finally:
        mtls.stop()


def _server_certificate(pki: Path, directory: Path, name: str) -> tuple[Path, Path]:
    """A new key and a certificate for it from the test CA, in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}", cwd=pki
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", "san.ext", cwd=pki,
    )  # fmt: skip
    return cert, key


def _presented_certificate(address: str, pki: Path) -> bytes:
    """The certificate a new connection's handshake gets, in DER."""
    context = ssl.create_default_context(cafile=pki / "ca.pem")
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def _install(source: Path, target: Path) -> None:
    """Replaces `target` in one step, as a renewal (or a Secret volume's update) does."""
    staged = target.with_suffix(".new")
    staged.write_bytes(source.read_bytes())
    staged.replace(target)


def _server_renewing(tmp_path: Path, pair: tuple[Path, Path]) -> tuple[LiveServer, Path, Path]:
    """A TLS server started on copies of `pair` (certificate, key), which a test then replaces."""
    cert, key = tmp_path / "tls" / "server.pem", tmp_path / "tls" / "server.key"
    cert.parent.mkdir()
    _install(pair[0], cert)
    _install(pair[1], key)
    return start_server(tmp_path / "data", tls_cert=cert, tls_key=key), cert, key


def _served_soon(address: str, pki: Path, cert: Path) -> bool:
    """Whether new connections get `cert` within a few handshakes (a pair refused is read again
    after RETRY_SECONDS)."""
    return wait_until(lambda: _presented_certificate(address, pki) == _der(cert), timeout=30)


def test_a_renewed_certificate_is_served_to_new_connections_without_a_restart(
    tmp_path: Path, pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessions.transport")
    first, renewed, later = (_server_certificate(pki, tmp_path / "issued", n) for n in ("first", "renewed", "later"))
    server, cert, key = _server_renewing(tmp_path, first)
    try:
        config = TlsConfig(root_certificates=(pki / "ca.pem").read_bytes())
        with SessionsClient(server.address, tls=config) as before:
            assert before.object("k").session().append_message(MESSAGE).inserted
            assert _presented_certificate(server.address, pki) == _der(first[0])

            _install(renewed[0], cert)
            _install(renewed[1], key)
            # The first connection after the change gets it: it got the old certificate (expired,
            # when a renewal came late) while its handshake started the files' read (an audit).
            assert _presented_certificate(server.address, pki) == _der(renewed[0])
            assert before.object("k").session().get_message("m1") == MESSAGE  # its connection goes on
            taken = [r.getMessage() for r in caplog.records if "TLS files read again" in r.getMessage()]
            assert taken and f"--tls-cert {cert}, --tls-key {key})" in taken[0] and "valid until" in taken[0]

            _install(later[0], cert)  # its key not there yet: the pair does not load
            refused = "TLS files changed but were not taken"
            assert wait_until(
                lambda: _presented_certificate(server.address, pki) == _der(renewed[0]) and refused in caplog.text,
                timeout=30,
            )
            assert _presented_certificate(server.address, pki) == _der(renewed[0])
            with SessionsClient(server.address, tls=config) as meanwhile:
                assert meanwhile.object("k").session().get_message("m1") == MESSAGE

            _install(later[1], key)
            assert _presented_certificate(server.address, pki) == _der(later[0])
            with SessionsClient(server.address, tls=config) as after:
                assert after.object("k").session().get_message("m1") == MESSAGE
    finally:
        server.stop()


def test_a_pair_that_failed_to_read_is_read_again_unchanged(
    tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that writes the key unreadable, then fixes its mode (or a moment out of file
    descriptors): the files' contents and mtime stay, and the pair was refused for good. Now it
    is read again after a while (and at once when a chmod or chown changes the files' ctime)."""
    first, renewed = (_server_certificate(pki, tmp_path / "issued", name) for name in ("first", "renewed"))
    server, cert, key = _server_renewing(tmp_path, first)
    try:
        failures = [OSError(f"could not read --tls-key {key}: Permission denied")]
        read = certificates._read

        def read_failing_once(flag: str, path: Path) -> bytes:
            if flag == "--tls-key" and failures:
                raise failures.pop()
            return read(flag, path)

        monkeypatch.setattr(certificates, "_read", read_failing_once)
        monkeypatch.setattr(certificates, "RETRY_SECONDS", 0.5)
        _install(renewed[0], cert)
        _install(renewed[1], key)
        assert _served_soon(server.address, pki, renewed[0])
        assert failures == []  # it did fail once, and was read again with nothing changed
    finally:
        server.stop()


def test_plaintext_refused_off_loopback(tmp_path: Path) -> None:
    import asyncio

    from sessions_server.transport.server import create_server

    config = ServerConfig(data_dir=tmp_path, listen="0.0.0.0:0")
    with pytest.raises(OSError, match="refusing plaintext"):
        asyncio.run(create_server(config))


def test_listing_objects_names_the_grant_it_needs(auth_server: LiveServer) -> None:
    """ListObjects has no object key: a token confined to a prefix is told that listing needs
    every key, not that it may not read "this object key"."""
    with grpc.insecure_channel(auth_server.address) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.SessionServiceStub(channel).ListObjects(
            pb.ListObjectsRequest(), metadata=[("authorization", "Bearer r-secret")], timeout=30
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    details = info.value.details()  # type: ignore[attr-defined]
    assert "listing objects needs a token granting every object key" in details and "'reader'" in details


def test_a_call_without_a_known_token_is_refused_before_its_request_is_read(auth_server: LiveServer) -> None:
    """Checked in the handler, the token came after the request: a unary request was received
    whole first (a client without a token made the server hold 10 × 60 MB), and a client
    stream waited for its first frame (held open for good by one that sent none)."""
    held = threading.Event()

    def nothing_until_released() -> Iterator[pb.UploadMessageRequest]:
        held.wait(30)
        return
        yield  # a generator that sends no frame

    with grpc.insecure_channel(auth_server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        try:
            for metadata in ((), (("authorization", "Bearer nope"),)):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.UploadMessage(nothing_until_released(), metadata=metadata, timeout=20)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
                assert not held.is_set()  # refused while the client still had sent nothing
            with pytest.raises(grpc.RpcError) as empty:  # an empty import was answered OK
                stub.ImportMessages(iter(()), timeout=20)
            assert empty.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        finally:
            held.set()
    with SessionsClient(auth_server.address, token="w-secret") as writer:  # a known token goes through
        assert writer.object("tenant-a/big").session().append_message(MESSAGE).inserted


def test_a_revoked_token_loses_its_open_change_feed(auth_server: LiveServer, tokens_file: Path) -> None:
    """Its feed went on receiving the object's messages after the reload that revoked it."""
    metadata = (("authorization", "Bearer r-secret"), ("x-object-key", "tenant-a/feed"))
    with grpc.insecure_channel(auth_server.address) as channel:
        feed = pb_grpc.SessionServiceStub(channel).Subscribe(
            pb.SubscribeRequest(object_key="tenant-a/feed"), metadata=metadata, timeout=30
        )
        assert next(feed).type == pb.CHANGE_TYPE_PROGRESS  # subscribed
        with SessionsClient(auth_server.address, token="w-secret") as writer:
            writer.object("tenant-a/feed").session().append_message(text_message("before"))
            assert next(feed).type == pb.CHANGE_TYPE_APPEND
            kept = [entry for entry in json.loads(tokens_file.read_text())["tokens"] if entry["name"] != "reader"]
            tokens_file.write_text(json.dumps({"tokens": kept}))
            auth_server.running.authority.reload()  # what SIGHUP triggers
            writer.object("tenant-a/feed").session().append_message(text_message("after", "SECRET"))
        with pytest.raises(grpc.RpcError) as ended:
            for response in feed:
                assert "SECRET" not in str(response)
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]


def test_a_revoked_token_cannot_go_on_writing_through_an_import_it_opened_before(
    auth_server: LiveServer, tokens_file: Path
) -> None:
    """A client stream was authorized once, at its start: after the reload that revoked its
    token it went on writing every message its sender sent."""
    key = "tenant-a/import"
    metadata = (("authorization", "Bearer w-secret"), ("x-object-key", key))
    revoked = threading.Event()

    def frames() -> Iterator[pb.ImportMessagesRequest]:
        yield pb.ImportMessagesRequest(
            object_key=key, messages=[pb.ImportedMessage(json=json.dumps(text_message("m1")))]
        )
        assert revoked.wait(timeout=30)
        yield pb.ImportMessagesRequest(messages=[pb.ImportedMessage(json=json.dumps(text_message("m2")))])

    with (
        grpc.insecure_channel(auth_server.address) as channel,
        SessionsClient(auth_server.address, token="r-secret") as reader,
    ):
        stub = pb_grpc.SessionServiceStub(channel)
        call = stub.ImportMessages.future(frames(), metadata=metadata, timeout=30)
        assert wait_until(lambda: reader.object(key).session().get_message("m1") is not None, 20)
        kept = [entry for entry in json.loads(tokens_file.read_text())["tokens"] if entry["name"] != "writer"]
        tokens_file.write_text(json.dumps({"tokens": kept}))
        auth_server.running.authority.reload()  # what SIGHUP triggers
        revoked.set()
        with pytest.raises(grpc.RpcError) as ended:
            call.result()
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        assert reader.object(key).session().get_message("m2") is None


def test_a_revoked_token_loses_its_idle_change_feed_at_the_reload(tmp_path: Path, tokens_file: Path) -> None:
    """With nothing written, the feed of a revoked token ran on until its next progress event
    (--progress-seconds, here far longer than the call's deadline)."""
    server = start_server(tmp_path / "data", tokens_file=tokens_file, progress_seconds=600)
    try:
        with grpc.insecure_channel(server.address) as channel:
            feed = _live_feed(channel, "r-secret", "tenant-a/idle", timeout=20)
            kept = [entry for entry in json.loads(tokens_file.read_text())["tokens"] if entry["name"] != "reader"]
            tokens_file.write_text(json.dumps({"tokens": kept}))
            _reload_tokens(server)
            with pytest.raises(grpc.RpcError) as ended:
                for response in feed:
                    assert response.type == pb.CHANGE_TYPE_PROGRESS
            assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    finally:
        server.stop()


def test_one_token_holds_at_most_its_share_of_the_stream_slots(tmp_path: Path, tokens_file: Path) -> None:
    """One token's idle feeds could take every stream slot of the server, refusing every other
    tenant's reads and feeds."""
    server = start_server(tmp_path / "data", tokens_file=tokens_file, limits=Limits(max_streams_per_token=2))

    try:
        with grpc.insecure_channel(server.address) as channel:
            held = [_tenant_feed(channel, "r-secret") for _ in range(2)]
            with pytest.raises(grpc.RpcError) as refused:
                _tenant_feed(channel, "r-secret")
            error = SessionsError.from_rpc_error(refused.value)
            assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
            assert error.metadata.get("limit") == "max_streams_per_token"
            other = _tenant_feed(channel, "w-secret")  # another token's share is its own
            held.pop().cancel()
            held.append(_tenant_feed(channel, "r-secret"))  # a slot given back is taken again
            for feed in (*held, other):
                feed.cancel()
    finally:
        server.stop()


def test_stream_shares_follow_the_token_not_its_name_across_a_reload(tmp_path: Path) -> None:
    """Shares were counted by grant name, and an unnamed grant is named by its place in the
    file: a reload that reordered the file charged one token's open feeds to the other."""
    tokens = tmp_path / "tokens.json"

    def write(order: list[str]) -> None:
        entries = [{"sha256": hash_token(token), "prefixes": ["tenant-a/"], "access": "read"} for token in order]
        tokens.write_text(json.dumps({"tokens": entries}))

    write(["x-secret", "y-secret"])
    server = start_server(tmp_path / "data", tokens_file=tokens, limits=Limits(max_streams_per_token=2))

    try:
        with grpc.insecure_channel(server.address) as channel:
            held = [_tenant_feed(channel, "x-secret") for _ in range(2)]
            write(["y-secret", "x-secret"])
            _reload_tokens(server)
            held.append(_tenant_feed(channel, "y-secret"))  # its own share, untouched by x's feeds
            with pytest.raises(grpc.RpcError) as refused:
                _tenant_feed(channel, "x-secret")  # x still holds its two
            assert SessionsError.from_rpc_error(refused.value).metadata.get("limit") == "max_streams_per_token"
            for feed in held:
                feed.cancel()
    finally:
        server.stop()


def _call_each_method(channel: grpc.Channel, token: str, object_key: str) -> dict[str, grpc.StatusCode]:
    """Every SessionService method called with `token`, a request naming `object_key` (one frame
    for a client stream), and the header naming it too: the status each ends with."""
    from sessions_proto.v1.sessions_pb2 import DESCRIPTOR

    metadata = (("authorization", f"Bearer {token}"), ("x-object-key", object_key))
    codes: dict[str, grpc.StatusCode] = {}
    for method in DESCRIPTOR.services_by_name["SessionService"].methods:
        request_class = getattr(pb, method.input_type.name)
        fields = request_class.DESCRIPTOR.fields_by_name
        request = request_class(object_key=object_key) if "object_key" in fields else request_class()
        if "header" in fields:
            request.header.object_key = object_key
        path = f"/sessions.v1.SessionService/{method.name}"
        kind = (
            ("stream" if method.client_streaming else "unary")
            + "_"
            + ("stream" if method.server_streaming else "unary")
        )
        call = getattr(channel, kind)(
            path, request_serializer=lambda r: r.SerializeToString(), response_deserializer=bytes
        )
        try:
            answer = call(iter([request]) if method.client_streaming else request, metadata=metadata, timeout=10)
            if method.server_streaming:
                for _ in answer:
                    break
                answer.cancel()
            codes[method.name] = grpc.StatusCode.OK
        except grpc.RpcError as error:
            codes[method.name] = error.code()  # type: ignore[attr-defined]
    return codes


def test_the_screen_and_the_handlers_refuse_the_same_calls_of_a_token(auth_server: LiveServer) -> None:
    """The early screen refuses, before the request is read, what the handler would refuse
    after it (WRITE_METHODS, the header's key): called method by method with a read-only token,
    exactly the writes are refused, and every read still goes through; with a token of another
    tenant, everything is. (That the screen answers before any request is read is checked by
    the next test.)"""
    from sessions_server.transport.handlers import WRITE_METHODS

    with grpc.insecure_channel(auth_server.address) as channel:
        codes = _call_each_method(channel, "r-secret", "tenant-a/screened")
        denied = {name for name, code in codes.items() if code == grpc.StatusCode.PERMISSION_DENIED}
        assert denied == WRITE_METHODS | {"ListObjects"}, codes  # ListObjects: a token of every key
        assert grpc.StatusCode.UNAUTHENTICATED not in codes.values()
        elsewhere = _call_each_method(channel, "w-secret", "tenant-b/not-granted")
        assert set(elsewhere.values()) == {grpc.StatusCode.PERMISSION_DENIED}, elsewhere


def test_the_screen_refuses_before_the_request_is_read(auth_server: LiveServer) -> None:
    """The screen answers from the method and metadata alone: no request reaches the refusal."""
    from sessions_server.transport.handlers import WRITE_METHODS, refusing_unauthorized

    screen = refusing_unauthorized(auth_server.running.authority)

    class Details:
        def __init__(self, method: str, token: str, key: str | None) -> None:
            self.method = f"/sessions.v1.SessionService/{method}"
            self.invocation_metadata = (("authorization", f"Bearer {token}"),) + (
                (("x-object-key", key),) if key is not None else ()
            )

    for method in ("AppendMessage", "GetMessage", "ImportMessages", "StreamHistory"):
        write = method in WRITE_METHODS
        assert (screen(Details(method, "r-secret", None)) is not None) == write  # type: ignore[arg-type]
        assert (screen(Details(method, "r-secret", "tenant-a/x")) is not None) == write  # type: ignore[arg-type]
        assert screen(Details(method, "w-secret", "tenant-a/x")) is None  # type: ignore[arg-type]
        assert screen(Details(method, "w-secret", "tenant-b/x")) is not None  # type: ignore[arg-type]
        assert screen(Details(method, "w-secret", "tenant-%61/x")) is None  # type: ignore[arg-type]  # percent-encoded


def test_a_prefix_that_does_not_end_a_segment_is_warned_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Prefixes match characters: a grant for `tenant-a` reaches `tenant-ab/...` too (a security
    audit's note). The file still loads as written; the operator is told."""
    path = tmp_path / "tokens.json"
    entries = [{"name": "a", "sha256": "0" * 64, "prefixes": ["tenant-a", "tenant-b/", ""], "access": "write"}]
    path.write_text(json.dumps({"tokens": entries}))
    with caplog.at_level("WARNING", logger="sessions.auth"):
        (grant,) = load_grants(path)
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert warnings == [
        "tokens[0].prefixes: 'tenant-a' also grants keys such as 'tenant-ab/...'; end it with a separator "
        "(e.g. 'tenant-a/') unless that is meant"
    ]
    assert grant.prefixes == ("tenant-a", "tenant-b/", "")  # as written: a warning, not a new rule


def test_a_tenants_write_grant_takes_no_step_of_a_move(auth_server: LiveServer) -> None:
    """A move's steps are an operator's (a token granting every key): with its write grant a
    tenant held its own keys against a re-shard (hold_for_move, lock_for_move) and had every
    later reader told its key had moved to an address of its choosing (DeleteObject with
    moved_to). It still exports, imports and erases its own objects (a second security audit)."""
    key = "tenant-a/moving"
    metadata = (("authorization", "Bearer w-secret"), ("x-object-key", key))
    with (
        SessionsClient(auth_server.address, token="w-secret") as writer,
        grpc.insecure_channel(auth_server.address) as channel,
    ):
        writer.object(key).session().append_message(MESSAGE)
        stub = pb_grpc.SessionServiceStub(channel)
        exported = b"".join(
            frame.data for frame in stub.ExportObject(pb.ExportObjectRequest(object_key=key), metadata=metadata)
        )
        digest = hashlib.sha256(exported).hexdigest()
        refused = {
            "lock_for_move": lambda: list(
                stub.ExportObject(pb.ExportObjectRequest(object_key=key, lock_for_move=True), metadata=metadata)
            ),
            "hold_for_move": lambda: stub.ImportObject(
                iter(
                    [
                        pb.ImportObjectRequest(
                            object_key=key, replace=True, hold_for_move=True, data=exported, sha256=digest
                        )
                    ]
                ),
                metadata=metadata,
            ),
            "moved_to": lambda: stub.DeleteObject(
                pb.DeleteObjectRequest(object_key=key, moved_to="grpc://elsewhere:443"), metadata=metadata
            ),
            "AbortMove": lambda: stub.AbortMove(pb.AbortMoveRequest(object_key=key), metadata=metadata),
        }
        for step, call in refused.items():
            with pytest.raises(grpc.RpcError) as denied:
                call()
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED, step
            assert "needs a token granting every object key" in (denied.value.details() or ""), step
        assert writer.object(key).session().append_message(dict(MESSAGE, id="m2")).inserted  # not moving, not moved
        imported = stub.ImportObject(
            iter([pb.ImportObjectRequest(object_key=key, replace=True, data=exported, sha256=digest)]),
            metadata=metadata,
        )
        assert imported.message_rows == 1
        assert stub.DeleteObject(pb.DeleteObjectRequest(object_key=key, erase=True), metadata=metadata).deleted


def _dated_certificate(
    pki: Path,
    directory: Path,
    name: str,
    *,
    days_from: float,
    days_to: float,
    edwards: bool = False,
    client_only: bool = False,
) -> tuple[Path, Path]:
    """A certificate from the test CA valid from `days_from` to `days_to` days from now, for a
    P-256 key (or an Ed448 one, which Python's `ssl` takes and gRPC does not); `client_only`:
    its extended key usage is clientAuth alone, a client's certificate."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed448
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    key: Any = ed448.Ed448PrivateKey.generate() if edwards else ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=days_from))
        .not_valid_after(now + datetime.timedelta(days=days_to))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
    )
    if client_only:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.mark.parametrize(("days_from", "days_to", "said"), [(-10, -1, "expired on"), (1, 10, "is not valid before")])
def test_a_certificate_not_valid_now_is_refused_at_start_and_at_renewal(
    tmp_path: Path, pki: Path, caplog: pytest.LogCaptureFixture, days_from: float, days_to: float, said: str
) -> None:
    """Every client would refuse it: served at start, nobody could connect; taken at a renewal
    (a job that wrote an old backup, an issuer whose clock is off), it cut every new client off."""
    bad = _dated_certificate(pki, tmp_path / "issued", "bad", days_from=days_from, days_to=days_to)
    with pytest.raises(OSError, match=said) as refused:
        start_server(tmp_path / "refused", tls_cert=bad[0], tls_key=bad[1])
    # Whose clock judged it: a server whose clock is off refuses a valid certificate (an audit).
    assert "by this server's clock, which reads " in str(refused.value) and "fix its time sync" in str(refused.value)
    _renewal_is_refused(tmp_path, pki, caplog, bad, said)


def _renewal_is_refused(
    tmp_path: Path, pki: Path, caplog: pytest.LogCaptureFixture, bad: tuple[Path, Path], said: str
) -> None:
    """A server renewing onto `bad` refuses it, logging `said`, and keeps serving its previous pair."""
    good = _server_certificate(pki, tmp_path / "issued", "good")
    server, cert, key = _server_renewing(tmp_path, good)
    try:
        _install(bad[0], cert)
        _install(bad[1], key)
        # Each handshake looks at the files; one after their change has them read, and refused.
        assert wait_until(lambda: bool(_presented_certificate(server.address, pki)) and said in caplog.text, timeout=30)
        assert _presented_certificate(server.address, pki) == _der(good[0])  # the previous pair stays
    finally:
        server.stop()


def test_a_clients_certificate_is_refused_as_the_servers_at_start_and_at_renewal(
    tmp_path: Path, pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its extended key usage clientAuth alone, every client refuses it ("unsupported
    certificate purpose"): the server started with it without a word (a TLS audit)."""
    said = "is no TLS server's certificate (its key usages leave out serverAuth): clients would refuse it"
    client_only = _dated_certificate(pki, tmp_path / "issued", "client", days_from=-1, days_to=10, client_only=True)
    with pytest.raises(OSError, match=re.escape(said)):
        start_server(tmp_path / "refused", tls_cert=client_only[0], tls_key=client_only[1])
    _renewal_is_refused(tmp_path, pki, caplog, client_only, said)


def test_a_certificate_close_to_its_end_is_warned_of(
    tmp_path: Path, pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ending = _dated_certificate(pki, tmp_path / "issued", "ending", days_from=-30, days_to=3)
    server = start_server(tmp_path / "data", tls_cert=ending[0], tls_key=ending[1])
    try:
        assert "expires on" in caplog.text
    finally:
        server.stop()


def test_client_certificates_no_ca_issued_are_warned_of(
    tmp_path: Path, pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server's own certificate given as --tls-client-ca (a leaf, no CA) started without a
    word, and then refused every client certificate its CA issued, silently on the server's side."""
    server = start_server(
        tmp_path / "leaf", tls_cert=pki / "server.pem", tls_key=pki / "server.key", tls_client_ca=pki / "server.pem"
    )
    server.stop()
    warned = [r.getMessage() for r in caplog.records if "--tls-client-ca" in r.getMessage()]
    assert warned == [
        f"--tls-client-ca {pki / 'server.pem'} holds no CA certificate, only 1 leaf certificate(s): a client is let "
        "in only if it presents one of those very certificates, never one a CA issued; give the CA that issues your "
        "clients' certificates"
    ]
    caplog.clear()
    server = start_server(
        tmp_path / "ca", tls_cert=pki / "server.pem", tls_key=pki / "server.key", tls_client_ca=pki / "ca.pem"
    )
    server.stop()
    assert "--tls-client-ca" not in caplog.text


def _named_certificate(pki: Path, directory: Path, name: str) -> tuple[Path, Path]:
    """A server certificate from the test CA for the DNS name `name` alone (not 127.0.0.1)."""
    directory.mkdir(parents=True, exist_ok=True)
    key, csr, cert, ext = (directory / f"{name}.{suffix}" for suffix in ("key", "csr", "pem", "ext"))
    ext.write_text(f"subjectAltName=DNS:{name}\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}", cwd=pki
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext), cwd=pki,
    )  # fmt: skip
    return cert, key


def _another_ca(directory: Path) -> bytes:
    """A CA of its own in `directory`, which the test servers' certificates do not come from: its PEM."""
    directory.mkdir()
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=another-ca", cwd=directory,
    )  # fmt: skip
    return (directory / "ca.pem").read_bytes()


@pytest.mark.parametrize("failure", ["untrusted CA", "another name", "mismatched client key"])
def test_a_failed_tls_handshake_is_not_tried_again(tmp_path: Path, pki: Path, failure: str) -> None:
    """The next attempt meets the same certificates: the call failed after 10 attempts (about
    7 s) and a subscription after 20 reconnects (33 s); the TypeScript client never retried. An
    audit found two more tried again so: a server certificate for another name than the address
    ("Hostname Verification Check failed"), and a client certificate given with another key
    ("Failed to create security handshaker"), both failing at once in Go and TypeScript."""
    from sessions_client._retry import may_resubscribe, may_retry

    ca = (pki / "ca.pem").read_bytes()
    cert, key = pki / "server.pem", pki / "server.key"
    if failure == "untrusted CA":
        config = TlsConfig(root_certificates=_another_ca(tmp_path / "other-ca"))
    elif failure == "another name":
        cert, key = _named_certificate(pki, tmp_path / "issued", "other.example")
        config = TlsConfig(root_certificates=ca)
    else:
        other_key = _named_certificate(pki, tmp_path / "issued", "unrelated.example")[1]
        client_cert = (pki / "client.pem").read_bytes()
        config = TlsConfig(root_certificates=ca, certificate_chain=client_cert, private_key=other_key.read_bytes())
    server = start_server(tmp_path / "data", tls_cert=cert, tls_key=key)
    notices: list[Any] = []
    try:
        with (
            SessionsClient(server.address, tls=config, on_retry=notices.append) as client,
            pytest.raises(SessionsError) as refused,
        ):
            client.object("k").session().get_history_row_stats()
    finally:
        server.stop()
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE, refused.value
    assert notices == []
    assert not may_retry("GetMessage", refused.value) and not may_resubscribe(refused.value)


def _hanging_up(listener: socket.socket) -> None:
    """Reads what each connection sends first, then closes it, until `listener` closes."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection, contextlib.suppress(OSError):
            connection.recv(65536)


@pytest.fixture
def hanging_up() -> Iterator[str]:
    """A loopback address whose listener takes connections and closes them before any HTTP/2."""
    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=_hanging_up, args=(listener,), daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    with contextlib.suppress(OSError):  # not connected, where the system says so
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept on Linux; close alone does not
    listener.close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[LiveServer]:
    server = start_server(
        tmp_path_factory.mktemp("mtls"),
        tls_cert=pki / "server.pem",
        tls_key=pki / "server.key",
        tls_client_ca=pki / "ca.pem",
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def foreign_client(pki: Path) -> tuple[bytes, bytes]:
    """A client certificate (and its key) of another CA than the one the servers trust."""
    other = pki / "foreign"
    other.mkdir()
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=another-ca", cwd=other,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
        "-subj", "/CN=stranger", cwd=other,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "client.pem", "-days", "2", cwd=other,
    )  # fmt: skip
    return (other / "client.pem").read_bytes(), (other / "client.key").read_bytes()


def _refused_tls(pki: Path, foreign_client: tuple[bytes, bytes], certificate: str) -> TlsConfig:
    """The test CA trusted, and no client certificate or one of another CA."""
    ca = (pki / "ca.pem").read_bytes()
    if certificate == "none":
        return TlsConfig(root_certificates=ca)
    return TlsConfig(root_certificates=ca, certificate_chain=foreign_client[0], private_key=foreign_client[1])


def _says_refused(error: SessionsError) -> None:
    """`error` is a TLS connection the server closed after the handshake, said so in the three
    clients' words, with gRPC's own kept."""
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, None), error
    assert error.message.startswith("the server closed the TLS connection before it spoke HTTP/2 (failed to connect")
    assert "Socket closed): it may have refused the TLS handshake, most likely for want of a client" in error.message
    assert "set TlsConfig's certificate_chain and private_key" in error.message
    assert error.message.endswith("or a proxy that ends TLS in front of it could not reach it")


QUICK = RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.001)


@pytest.mark.parametrize("certificate", ["none", "another CA's"])
def test_a_client_certificate_the_server_refuses_is_tried_again_then_named(
    mtls_server: LiveServer,
    pki: Path,
    foreign_client: tuple[bytes, bytes],
    certificate: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With TLS 1.3 the client's side of the handshake ends before the server has checked its
    certificate; the server then closes the connection before it speaks HTTP/2, as a proxy
    ending TLS in front of a server it cannot reach does, and gRPC says no more than "Socket
    closed". Tried again as a connection failure, the call's last failure names the likely
    cause, a client certificate, instead of reading like a network fault; so does a
    subscription's once its reconnections run out."""
    notices: list[Any] = []
    tls = _refused_tls(pki, foreign_client, certificate)
    with SessionsClient(mtls_server.address, tls=tls, retry=QUICK, on_retry=notices.append) as client:
        opened = stream_opens(client, monkeypatch)
        with pytest.raises(SessionsError) as refused:
            client.object("k").session().append_message(MESSAGE)
        with pytest.raises(SessionsError) as unsubscribed:
            next(client.object("k").subscribe(reconnect_attempts=2))
    assert [(n.method, n.attempt) for n in notices] == [("AppendMessage", 1), ("AppendMessage", 2)]
    assert opened == ["Subscribe"] * 3
    _says_refused(notices[0].error)
    _says_refused(refused.value)
    _says_refused(unsubscribed.value)


@pytest.mark.parametrize("certificate", ["none", "another CA's"])
def test_the_asyncio_client_names_a_refused_client_certificate_too(
    mtls_server: LiveServer,
    pki: Path,
    foreign_client: tuple[bytes, bytes],
    certificate: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    notices: list[Any] = []

    async def scenario() -> tuple[SessionsError, SessionsError, list[str]]:
        tls = _refused_tls(pki, foreign_client, certificate)
        async with AsyncClient(mtls_server.address, tls=tls, retry=QUICK, on_retry=notices.append) as client:
            opened = stream_opens(client, monkeypatch)
            with pytest.raises(SessionsError) as refused:
                await client.object("k").session().append_message(MESSAGE)
            with pytest.raises(SessionsError) as unsubscribed:
                async for _ in client.object("k").subscribe(reconnect_attempts=2):
                    pass
            return refused.value, unsubscribed.value, opened

    refused, unsubscribed, opened = asyncio.run(scenario())
    assert [(n.method, n.attempt) for n in notices] == [("AppendMessage", 1), ("AppendMessage", 2)]
    assert opened == ["Subscribe"] * 3
    _says_refused(refused)
    _says_refused(unsubscribed)


def test_a_plaintext_client_of_a_tls_server_is_told_it_may_need_tls(mtls_server: LiveServer) -> None:
    """A TLS server reads a plaintext client's HTTP/2 as a broken handshake and closes the
    connection without a byte, and gRPC said no more than "Socket closed", as for a network
    fault. Both clients try it again as one, then say the server may speak TLS alone."""
    from sessions_client.aio import SessionsClient as AsyncClient

    notices: list[Any] = []
    with (
        SessionsClient(mtls_server.address, retry=QUICK, on_retry=notices.append) as client,
        pytest.raises(SessionsError) as refused,
    ):
        client.object("k").session().append_message(MESSAGE)

    async def scenario() -> SessionsError:
        async with AsyncClient(mtls_server.address, retry=QUICK, on_retry=notices.append) as client:
            with pytest.raises(SessionsError) as refused:
                await client.object("k").session().append_message(MESSAGE)
            return refused.value

    async_refused = asyncio.run(scenario())
    assert [(n.method, n.attempt) for n in notices] == [("AppendMessage", 1), ("AppendMessage", 2)] * 2
    for error in (refused.value, async_refused):
        assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, None), error
        assert error.message.startswith("the server closed the connection before it spoke HTTP/2 (failed to")
        assert "Socket closed): it may speak TLS alone (a server run with --tls-cert does: give the client" in (
            error.message
        )
        assert error.message.endswith("tls=TlsConfig(...)), or a proxy in front of it could not reach it")


@pytest.mark.parametrize("channel", ["plaintext", "TLS"])
def test_a_server_closing_connections_before_http2_is_still_tried_again(
    hanging_up: str, pki: Path, channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plaintext connection closed before HTTP/2 is a network fault, though gRPC's words are
    those of a refused handshake ("failed to connect to all addresses; … Socket closed"); so is
    a TLS connection closed during its handshake ("Handshake read failed (Socket closed)"). Both
    clients try such a call again, and a subscription reconnects."""
    from sessions_client.aio import SessionsClient as AsyncClient

    tls = TlsConfig(root_certificates=(pki / "ca.pem").read_bytes()) if channel == "TLS" else None
    notices: list[Any] = []
    with SessionsClient(hanging_up, tls=tls, retry=QUICK, on_retry=notices.append) as client:
        opened = stream_opens(client, monkeypatch)
        with pytest.raises(SessionsError) as failed:
            client.object("k").session().append_message(MESSAGE)
        with pytest.raises(SessionsError) as unsubscribed:
            next(client.object("k").subscribe(reconnect_attempts=2))

    async def scenario() -> tuple[SessionsError, list[str]]:
        async with AsyncClient(hanging_up, tls=tls, retry=QUICK, on_retry=notices.append) as client:
            opened = stream_opens(client, monkeypatch)
            with pytest.raises(SessionsError) as failed:
                await client.object("k").session().append_message(MESSAGE)
            with pytest.raises(SessionsError) as unsubscribed:
                async for _ in client.object("k").subscribe(reconnect_attempts=2):
                    pass
            assert "refused the TLS handshake" not in unsubscribed.value.message
            return failed.value, opened

    async_failed, async_opened = asyncio.run(scenario())
    for error in (failed.value, unsubscribed.value, async_failed):
        assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, None), error
        assert "failed to connect to all addresses" in error.message and "Socket closed" in error.message
        assert "refused the TLS handshake" not in error.message
        # A plaintext connection closed so is also what a server speaking TLS alone does with it.
        assert ("it may speak TLS alone" in error.message) == (channel == "plaintext")
    assert [(n.method, n.attempt) for n in notices] == [("AppendMessage", 1), ("AppendMessage", 2)] * 2
    assert opened == async_opened == ["Subscribe"] * 3


def test_a_pair_grpc_cannot_use_is_refused_at_start_and_at_renewal(
    tmp_path: Path, pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Python's `ssl` takes an Ed448 key, gRPC's TLS library does not: at a renewal the pair
    was announced as served while gRPC kept the previous one (its own log lines alone said so);
    at start the refusal blamed the port."""
    unusable = _dated_certificate(pki, tmp_path / "issued", "ed448", days_from=-1, days_to=10, edwards=True)
    with pytest.raises(OSError, match="gRPC cannot use --tls-cert and --tls-key"):
        start_server(tmp_path / "refused", tls_cert=unusable[0], tls_key=unusable[1])
    _renewal_is_refused(tmp_path, pki, caplog, unusable, "gRPC cannot use")
    assert "new connections get them" not in caplog.text


def test_a_move_to_a_server_whose_certificate_is_not_trusted_says_so(tmp_path: Path, pki: Path) -> None:
    """A move whose destination's TLS handshake failed waited 10 s for a connection, then said
    only that the destination "could not be connected to within 10 s", whatever the TLS settings'
    fault (an audit). It says the handshake failed now, at once, and nothing is locked."""
    from sessions_client._retry import tls_failed
    from sessions_client.admin import move_object

    source = start_server(tmp_path / "source")
    destination = start_server(tmp_path / "destination", tls_cert=pki / "server.pem", tls_key=pki / "server.key")
    untrusting = TlsConfig(root_certificates=_another_ca(tmp_path / "other-ca"))
    try:
        with (
            SessionsClient(source.address, retry=None) as a,
            SessionsClient(destination.address, tls=untrusting, retry=None) as b,
        ):
            a.object("k").session().append_message(MESSAGE)
            with pytest.raises(SessionsError) as refused:
                move_object(a, b, "k")
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            assert "within" not in refused.value.message and tls_failed(refused.value), refused.value.message
            assert "nothing was moved or locked" in refused.value.message
            assert a.object("k").session().append_message({**MESSAGE, "id": "m2"}).inserted  # not locked
    finally:
        source.stop()
        destination.stop()


def test_a_served_certificate_past_its_end_is_logged_as_handshakes_come(
    tmp_path: Path, pki: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its end was warned of when it was read, then nothing: a server went on serving a
    certificate every client refused, its log silent (an audit). A handshake after the end logs
    it, once an hour."""
    caplog.set_level(logging.INFO, logger="sessions.transport")
    server = start_server(tmp_path / "data", tls_cert=pki / "server.pem", tls_key=pki / "server.key")
    try:
        _presented_certificate(server.address, pki)
        assert "has expired" not in caplog.text and "expired on" not in caplog.text
        monkeypatch.setattr(
            certificates, "wall_clock", lambda: certificates.time.time() + 3 * 86_400
        )  # past its 2 days
        with contextlib.suppress(ssl.SSLError, OSError):  # the client's own clock still trusts it
            _presented_certificate(server.address, pki)
            _presented_certificate(server.address, pki)
        expired = [r for r in caplog.records if "expired on" in r.getMessage()]
        assert len(expired) == 1 and expired[0].levelno == logging.ERROR, [r.getMessage() for r in expired]
        assert f"--tls-cert {pki / 'server.pem'}" in expired[0].getMessage()
        assert "by this server's clock" in expired[0].getMessage()  # ahead, it reports a valid one expired
    finally:
        server.stop()


def test_a_held_import_ends_when_a_reload_takes_its_tokens_grant_of_every_key(tmp_path: Path) -> None:
    """An import holding its object for a move needs a token granting every key, checked at its
    first frame only: narrowed to a prefix that still covers the key, the token's import went on
    and installed the held copy."""
    tokens = tmp_path / "tokens.json"
    mover = {"name": "mover", "sha256": hash_token("m-secret"), "prefixes": [""], "access": "write"}
    tokens.write_text(json.dumps({"tokens": [mover]}))
    data_dir = tmp_path / "data"
    server = start_server(data_dir, tokens_file=tokens)
    source, key = "tenant-a/source", "tenant-a/held"
    narrowed = threading.Event()
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            request = pb.AppendMessageRequest(object_key=source, message_json=json.dumps(MESSAGE))
            stub.AppendMessage(request, metadata=(("authorization", "Bearer m-secret"),), timeout=30)
            exported = list(
                stub.ExportObject(
                    pb.ExportObjectRequest(object_key=source), metadata=(("authorization", "Bearer m-secret"),)
                )
            )
            data, digest = b"".join(frame.data for frame in exported), exported[-1].sha256

            def frames() -> Iterator[pb.ImportObjectRequest]:
                yield pb.ImportObjectRequest(object_key=key, hold_for_move=True, data=data[: len(data) // 2])
                assert narrowed.wait(timeout=30)
                yield pb.ImportObjectRequest(data=data[len(data) // 2 :], sha256=digest)

            call = stub.ImportObject.future(frames(), metadata=(("authorization", "Bearer m-secret"),), timeout=30)
            scratch = data_dir / "scratch"
            assert wait_until(lambda: any(p.stat().st_size for p in scratch.glob("import-*")), 20)  # first frame taken
            tokens.write_text(json.dumps({"tokens": [{**mover, "prefixes": ["tenant-a/"]}]}))
            server.running.authority.reload()  # what SIGHUP triggers
            narrowed.set()
            with pytest.raises(grpc.RpcError) as ended:
                call.result()
            assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
            assert not object_path(data_dir, key).exists()
    finally:
        narrowed.set()
        server.stop()


def test_open_health_watches_and_reflection_streams_end_when_a_reload_revokes_their_token(
    tmp_path: Path, tokens_file: Path
) -> None:
    """Both were authorized once, as they opened: a revoked token's health Watch stayed open for
    good, holding one of the bounded watches, and its reflection stream went on answering. The
    watch ends at the reload (it has no next message to check again at while the status holds),
    the reflection stream at its next request."""
    server = start_server(
        tmp_path / "data", tokens_file=tokens_file, probe_listen="127.0.0.1:0", auth_protect_reflection=True
    )
    token = (("authorization", "Bearer r-secret"),)
    reloaded = threading.Event()
    request = reflection_pb2.ServerReflectionRequest(list_services="")

    def reflection_requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield request
        assert reloaded.wait(timeout=30)
        yield request

    try:
        with grpc.insecure_channel(server.address) as channel:
            watched = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(), metadata=token, timeout=30
            )
            assert next(watched).status == health_pb2.HealthCheckResponse.SERVING
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                reflection_requests(), metadata=token, timeout=30
            )
            assert next(reflection).HasField("list_services_response")
            kept = [entry for entry in json.loads(tokens_file.read_text())["tokens"] if entry["name"] != "reader"]
            tokens_file.write_text(json.dumps({"tokens": kept}))
            server.running.authority.reload()  # what SIGHUP triggers
            reloaded.set()
            with pytest.raises(grpc.RpcError) as watch_ended:
                next(watched)
            with pytest.raises(grpc.RpcError) as reflection_ended:
                next(reflection)
        assert watch_ended.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        assert reflection_ended.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    finally:
        reloaded.set()
        server.stop()
