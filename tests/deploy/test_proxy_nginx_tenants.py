"""Tenants behind the shipped nginx (deploy/nginx/nginx.conf): a bearer token past its calls in
flight (`limit_conn calls_per_token`, here 1) is answered as a busy shard answers,
RESOURCE_EXHAUSTED with ErrorInfo SERVER_BUSY, which the clients retry for every method; another
token's calls, and the token's own Subscribe streams, pass. Without the bound one tenant's
hundreds of concurrent calls queued every other tenant's in the shard (docs/operations.md,
"Tenants"). Needs Debian's `nginx` (installed by .ci/run)."""

from __future__ import annotations

import base64
import re
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from sessions_client import RetryNotice, SessionsClient, SessionsError
from sessions_client._retry import REFUSED_BEFORE_ACTING
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.transport.errors import ERROR_DOMAIN
from tests.deploy.support import DEPLOY, Proxy, Shard, free_port, text_message, wait_for
from tests.security.tenants import tenant_tokens

# A name whose token is longer than the 255 bytes nginx keys a limit by: counted by its head.
LONG = "l" * 300
REFUSAL = "too many calls of this token in flight at the proxy; retry shortly"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    root = tmp_path_factory.mktemp("nginx-tenants")
    tokens = tenant_tokens(root / "tokens.json", ["a", "b", LONG])
    shard = Shard("shard", root / "shard", free_port(), "--tokens-file", str(tokens)).start()
    nginx = Proxy("nginx", root / "nginx", free_port(), [shard.address], calls_per_token=1)
    try:
        yield nginx.start()
    finally:
        nginx.stop()
        shard.stop()


def _metadata(tenant: str, key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {tenant}-secret"), ("x-object-key", urllib.parse.quote(key, safe=""))]


def _refused_by_the_proxy(stub: pb_grpc.SessionServiceStub, tenant: str, key: str) -> bool:
    try:
        stub.GetObjectStats(pb.GetObjectStatsRequest(object_key=key), metadata=_metadata(tenant, key), timeout=10)
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error.details() == REFUSAL:
            return True
        raise
    return False


@contextmanager
def held_upload(address: str, tenant: str) -> Iterator[threading.Event]:
    """An upload of `tenant`'s kept open until the event is set: one call in flight at the proxy
    (counted once a call of the token's is refused there). It then completes."""
    key = f"tenant-{tenant}/held"
    release = threading.Event()

    def frames() -> Iterator[pb.UploadMessageRequest]:
        header = pb.UploadHeader(object_key=key, operation=pb.UPLOAD_OPERATION_APPEND)
        yield pb.UploadMessageRequest(header=header, json_piece='{"id":"held","role":"user","parts":[{"type":"text",')
        release.wait(60)
        yield pb.UploadMessageRequest(json_piece='"text":"held"}]}')

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)

        def start() -> grpc.Future:
            return stub.UploadMessage.future(frames(), metadata=_metadata(tenant, key), timeout=90)

        upload = start()

        def counted() -> bool:
            nonlocal upload
            if upload.done():  # refused, as it came while a probe was the token's one call: again
                assert upload.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, upload.exception()
                upload = start()
                return False
            return _refused_by_the_proxy(stub, tenant, key)

        try:
            wait_for(counted, timeout=30, what="the upload counted at nginx")
            yield release
        finally:
            release.set()
        assert upload.result(timeout=30).message.info.id == "held"


@pytest.mark.parametrize("tenant", ["a", LONG], ids=["token", "token-past-255-bytes"])
def test_a_token_past_its_calls_in_flight_is_refused_as_a_busy_server(proxy: Proxy, tenant: str) -> None:
    key = f"tenant-{tenant}/held"
    with held_upload(proxy.address, tenant):
        with (
            SessionsClient(proxy.address, token=f"{tenant}-secret", retry=None) as held,
            pytest.raises(SessionsError) as refused,
        ):
            held.object(key).session().append_message(text_message("refused", "x"))
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER_BUSY")
        assert refused.value.metadata == {"limit": "calls_per_token"}
        # Another tenant's calls pass meanwhile.
        with SessionsClient(proxy.address, token="b-secret", retry=None) as other:
            other.object("tenant-b/free").session().append_message(text_message("free", "x"))
            assert other.object("tenant-b/free").session().get_message("free") is not None
        # So does the token's own change feed, which nginx does not count.
        with grpc.insecure_channel(proxy.address) as channel:
            feed = pb_grpc.SessionServiceStub(channel).Subscribe(
                pb.SubscribeRequest(object_key=key), metadata=_metadata(tenant, key), timeout=30
            )
            assert next(feed) is not None
            feed.cancel()
    with SessionsClient(proxy.address, token=f"{tenant}-secret", retry=None) as after:
        assert after.object(key).session().get_message("refused") is None  # refused, so not written


def test_the_clients_retry_a_refusal_at_the_proxy_even_for_a_method_not_safe_to_repeat(proxy: Proxy) -> None:
    """ClearMessages is not retried after a connection failure (it could remove what others
    appended since); a refusal before acting is retried, the proxy's included."""
    notices: list[RetryNotice] = []
    with held_upload(proxy.address, "a") as release:

        def end_the_held_call(notice: RetryNotice) -> None:
            notices.append(notice)
            release.set()

        with SessionsClient(proxy.address, token="a-secret", on_retry=end_the_held_call) as client:
            session = client.object("tenant-a/cleared").session()
            assert session.clear_messages() == 0
    assert notices, "the clear was not refused once"
    first = notices[0]
    assert (first.method, first.error.code, first.error.reason) == (
        "ClearMessages",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "SERVER_BUSY",
    )


def test_the_shipped_refusal_carries_the_status_its_message_says() -> None:
    """grpc-status-details-bin is a constant in the file: it must hold the code and message of
    the headers beside it (clients reading rich details compare them) and the reason the clients
    retry."""
    text = (DEPLOY / "nginx" / "nginx.conf").read_text(encoding="utf-8")
    block = re.search(r"location @calls_per_token \{(.*?)\n        \}", text, re.DOTALL)
    assert block is not None
    headers = dict(re.findall(r'add_header (grpc-[a-z-]+) "?([^"\s]+(?: [^"]+)?)"? always;', block.group(1)))
    assert headers["grpc-status"] == "8"
    assert headers["grpc-message"] == REFUSAL
    details = headers["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(base64.b64decode(details + "=" * (-len(details) % 4)))
    assert (status.code, status.message) == (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], REFUSAL)
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "SERVER_BUSY",
        ERROR_DOMAIN,
        {"limit": "calls_per_token"},
    )
    assert (grpc.StatusCode.RESOURCE_EXHAUSTED, info.reason) in REFUSED_BEFORE_ACTING
    assert "return 200;" in block.group(1)  # grpc-go takes a gRPC answer with no other status
