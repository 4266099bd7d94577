"""The standard gRPC health service and server reflection are on (issue 2, DESIGN.md §4)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import start_server
from tests.deploy.support import free_port

SERVICE = "sessions.v1.SessionService"


def test_health_check_is_serving(plain_channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(plain_channel)
    overall = health.Check(health_pb2.HealthCheckRequest(service=""))
    assert overall.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services(plain_channel: grpc.Channel) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(plain_channel)
    responses = list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in responses[0].list_services_response.service}
    assert SERVICE in names
    assert "grpc.health.v1.Health" in names


def test_reflection_describes_the_contract(plain_channel: grpc.Channel) -> None:
    from google.protobuf import descriptor_pb2

    reflection = reflection_pb2_grpc.ServerReflectionStub(plain_channel)
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)
    responses = list(reflection.ServerReflectionInfo(iter([request])))
    protos = responses[0].file_descriptor_response.file_descriptor_proto
    files = [descriptor_pb2.FileDescriptorProto.FromString(p) for p in protos]
    services = {f"{f.package}.{s.name}": s for f in files for s in f.service}
    methods = {m.name for m in services[SERVICE].method}
    expected = {
        "AppendMessage",
        "AppendMessages",
        "UpdateMessage",
        "UpsertMessage",
        "DeleteMessages",
        "ClearMessages",
        "ImportMessages",
        "GetMessage",
        "GetMessages",
        "GetLatestLeaf",
        "GetBranches",
        "StreamHistory",
        "GetRecentHistory",
        "GetHistoryRowStats",
    }
    assert expected <= methods


def test_live_server_answers_on_its_address(live_server: Any) -> None:
    host, _, port = live_server.address.rpartition(":")
    assert host in ("127.0.0.1", "localhost")
    assert int(port) > 0


def test_health_lists_every_service(plain_channel: grpc.Channel) -> None:
    """grpc.health.v1.Health/List, which reflection shows, answered UNIMPLEMENTED."""
    statuses = health_pb2_grpc.HealthStub(plain_channel).List(health_pb2.HealthListRequest()).statuses
    assert {name: status.status for name, status in statuses.items()} == {
        "": health_pb2.HealthCheckResponse.SERVING,
        SERVICE: health_pb2.HealthCheckResponse.SERVING,
    }


def test_reflection_describes_the_error_details_errors_carry(plain_channel: grpc.Channel) -> None:
    """Every error carries a google.rpc.ErrorInfo, which grpcurl could not decode ("is not
    recognized") since reflection did not know the type."""
    from google.protobuf import descriptor_pb2

    reflection = reflection_pb2_grpc.ServerReflectionStub(plain_channel)
    for symbol in ("google.rpc.ErrorInfo", "google.rpc.Status"):
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
        (response,) = reflection.ServerReflectionInfo(iter([request]))
        protos = response.file_descriptor_response.file_descriptor_proto
        assert protos, response.error_response.error_message
        files = [descriptor_pb2.FileDescriptorProto.FromString(p) for p in protos]
        assert symbol.rpartition(".")[2] in {m.name for f in files for m in f.message_type}


def test_health_watches_are_bounded_and_unknown_names_leave_nothing_behind(live_server: Any) -> None:
    """Health needs no token, and watches were uncounted: one client opened 20,000 (RSS +450
    MiB). The library also keeps an entry for good for every service name watched. Past
    MAX_HEALTH_WATCHES a watch is refused; a name never served is answered SERVICE_UNKNOWN,
    and the call stays open, as the library does, without an entry."""
    from sessions_server.transport.open_services import MAX_HEALTH_WATCHES

    health_servicer = live_server.running.health
    watchers_before = dict(health_servicer._watcher_count_by_service)
    with grpc.insecure_channel(live_server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watches = []
        try:
            for index in range(MAX_HEALTH_WATCHES):
                name = "" if index % 2 else f"made-up-{index}"
                watch = stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=60)
                first = next(watch)
                expected = (
                    health_pb2.HealthCheckResponse.SERVING
                    if not name
                    else health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
                )
                assert first.status == expected
                watches.append(watch)
            refused = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
            try:
                next(refused)
                raise AssertionError("a watch past the bound was answered")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert (
                stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
            )
        finally:
            for watch in watches:
                watch.cancel()
    names = set(health_servicer._watcher_count_by_service) | set(health_servicer._server_watchers)
    assert not any(name.startswith("made-up-") for name in names)
    assert set(health_servicer._watcher_count_by_service) <= set(watchers_before) | {""}


def test_reflection_streams_are_bounded(live_server: Any) -> None:
    """Open to any caller (unless reflection is guarded), reflection streams were uncounted, as
    health watches were. Past MAX_REFLECTION_STREAMS one is refused; the others still answer."""
    import asyncio

    from sessions_server.transport.open_services import MAX_REFLECTION_STREAMS

    ask = reflection_pb2.ServerReflectionRequest(list_services="")

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(live_server.address) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            calls = []
            try:
                for _ in range(MAX_REFLECTION_STREAMS):
                    call = stub.ServerReflectionInfo(timeout=60)
                    await call.write(ask)
                    assert (await call.read()).list_services_response.service
                    calls.append(call)
                # Refused as it opens, before any request: a write to it may find it ended already.
                refused = stub.ServerReflectionInfo(timeout=60)
                try:
                    await refused.read()
                    raise AssertionError("a reflection stream past the bound was answered")
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                await calls[0].write(ask)
                assert (await calls[0].read()).list_services_response.service
            finally:
                for call in calls:
                    call.cancel()

    asyncio.run(scenario())


def test_the_probe_port_serves_health_alone_and_small_requests_only(tmp_path: Path) -> None:
    """On the main port a health request may be as large as --max-request-bytes, and one left
    unfinished is held (8 such, 60 MB each, took RSS from 50 to 514 MiB). The probe port
    serves health alone, with the main port's statuses, and refuses a larger request as its
    length arrives."""
    from sessions_server.transport.open_services import PROBE_REQUEST_BYTES

    server = start_server(tmp_path / "data", probe_listen="127.0.0.1:0")
    try:
        probe_address = server.running.probe_address
        assert probe_address is not None and probe_address != server.address
        with grpc.insecure_channel(probe_address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", SERVICE):
                assert health.Check(health_pb2.HealthCheckRequest(service=name), timeout=30).status == (
                    health_pb2.HealthCheckResponse.SERVING
                )
            assert set(health.List(health_pb2.HealthListRequest(), timeout=30).statuses) == {"", SERVICE}
            with pytest.raises(grpc.RpcError) as unknown:
                health.Check(health_pb2.HealthCheckRequest(service="made-up"), timeout=30)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
            with pytest.raises(grpc.RpcError) as large:
                health.Check(health_pb2.HealthCheckRequest(service="x" * PROBE_REQUEST_BYTES), timeout=30)
            assert large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            with pytest.raises(grpc.RpcError) as sessions:
                pb_grpc.SessionServiceStub(channel).ListObjects(pb.ListObjectsRequest(), timeout=30)
            assert sessions.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            with pytest.raises(grpc.RpcError) as reflected:
                list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
            assert reflected.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        with grpc.insecure_channel(server.address) as channel:  # without tokens the main port's stays open
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop()


def test_the_probe_port_turns_not_serving_when_the_server_drains(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", probe_listen="127.0.0.1:0")
    stopped = False
    try:
        assert server.running.probe_address is not None
        with grpc.insecure_channel(server.running.probe_address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            stopping = threading.Thread(target=server.stop)
            stopping.start()
            stopped = True
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
            stopping.join(timeout=60)
            assert not stopping.is_alive()
            with pytest.raises(grpc.RpcError) as closed:  # stopped with the server
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert closed.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    finally:
        if not stopped:
            server.stop()


def test_watches_on_the_probe_port_are_bounded_apart_from_the_main_port(tmp_path: Path) -> None:
    """Both ports share the server's MAX_HEALTH_WATCHES, and the probe port needs no token:
    anyone could take them all, and token holders' watches on the main port were refused. The
    probe port holds at most MAX_PROBE_WATCHES of them (at most 8 calls per connection)."""
    from sessions_server.transport.open_services import MAX_PROBE_WATCHES, PROBE_STREAMS_PER_CONNECTION

    server = start_server(tmp_path / "data", probe_listen="127.0.0.1:0")
    probe_address = server.running.probe_address
    assert probe_address is not None
    connections = -(-MAX_PROBE_WATCHES // PROBE_STREAMS_PER_CONNECTION) + 1
    # Channels of their own (gRPC would share one connection between equal channels).
    channels = [
        grpc.insecure_channel(probe_address, options=[("grpc.use_local_subchannel_pool", 1), ("test.channel", i)])
        for i in range(connections)
    ]
    watches = []
    try:
        for index in range(MAX_PROBE_WATCHES):
            stub = health_pb2_grpc.HealthStub(channels[index // PROBE_STREAMS_PER_CONNECTION])
            watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            watches.append(watch)
        refused = health_pb2_grpc.HealthStub(channels[-1]).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        with pytest.raises(grpc.RpcError) as error:
            next(refused)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        with grpc.insecure_channel(server.address) as channel:  # the main port's still has room
            main = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(main).status == health_pb2.HealthCheckResponse.SERVING
            main.cancel()
    finally:
        for watch in watches:
            watch.cancel()
        for channel in channels:
            channel.close()
        server.stop()


def test_a_port_refused_at_start_gives_the_others_back_in_process(tmp_path: Path) -> None:
    """A server never started kept its ports through stop(): a second try in the same process,
    on the same --listen, failed with "address in use"."""
    import socket

    listen = f"127.0.0.1:{free_port()}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="--probe-listen"):
            start_server(tmp_path / "data", listen, probe_listen=f"127.0.0.1:{taken.getsockname()[1]}")
    server = start_server(tmp_path / "data", listen, probe_listen="127.0.0.1:0")
    try:
        assert server.address == listen
    finally:
        server.stop()
