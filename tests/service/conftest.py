"""Fixtures for service tests: the live server's data directory, a plain generated stub, and a
chat-completions stub for the summarizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2_grpc
from tests.service.chat_completions_stub import ChatCompletionsStub


@pytest.fixture
def data_dir(live_server: Any) -> Path:
    return Path(live_server.data_dir)


@pytest.fixture(scope="module")
def plain_channel(live_server: Any) -> Iterator[grpc.Channel]:
    """A channel with gRPC's default options (4 MiB receive limit), as any stock client has."""
    channel = grpc.insecure_channel(live_server.address)
    yield channel
    channel.close()


@pytest.fixture
def stub(plain_channel: grpc.Channel) -> sessions_pb2_grpc.SessionServiceStub:
    return sessions_pb2_grpc.SessionServiceStub(plain_channel)


@pytest.fixture
def llm() -> Iterator[ChatCompletionsStub]:
    """A chat-completions endpoint on a loopback port, for a server's summarizer."""
    stub = ChatCompletionsStub().start()
    yield stub
    stub.stop()
