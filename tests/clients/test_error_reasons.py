"""Every ErrorInfo reason the server can send is a documented ErrorReason of the contract."""

from __future__ import annotations

import re
from pathlib import Path

from sessions_proto.v1 import sessions_pb2
from sessions_server.domain import errors

SERVER = Path(__file__).resolve().parents[2] / "server" / "sessions_server"


def _documented() -> set[str]:
    return {name.removeprefix("ERROR_REASON_") for name in sessions_pb2.ErrorReason.keys()} - {"UNSPECIFIED"}  # noqa: SIM118


def test_default_reasons_of_error_classes_are_documented() -> None:
    classes = [errors.SessionsError, *errors.SessionsError.__subclasses__()]
    assert {cls.reason for cls in classes if cls is not errors.SessionsError} <= _documented()


def test_reasons_named_in_server_code_are_documented() -> None:
    used = set()
    for path in SERVER.rglob("*.py"):
        used |= set(re.findall(r'reason="([A-Z_]+)"', path.read_text()))
    assert used
    assert used <= _documented(), used - _documented()
