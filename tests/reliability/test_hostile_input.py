"""Hostile input: property-based requests to every RPC of the contract, structured and raw.

For each SessionService method (taken from the proto descriptor, so a new RPC is covered without
editing this file) hypothesis generates requests two ways:

- structured, sent through the generated stub: every field drawn from a hostile strategy chosen
  by its type and name - object keys (`../`, NUL, control characters, 10 KB, percent signs, the
  known object), ids, session ids, integers at and beyond their type's edges, unknown enum
  values, random bytes, and for JSON fields: random JSON shapes, messages with wrong types, deep
  nesting (up to 100,000 levels), huge numbers, lone-surrogate escapes, mutated and truncated
  text, oversized text (beyond the server's request limit);
- raw bytes, sent through `channel.unary_unary(path, identity serializers)`: random bytes,
  byte-level mutations of valid requests, string fields holding invalid UTF-8, fields with the
  wrong wire type, absurd length prefixes, 100,000 nested groups.

Client-streaming methods get lists of such frames. Every call is checked:

- the server never answers UNKNOWN or INTERNAL (nor DEADLINE_EXCEEDED - a hang - except for
  Subscribe, which is live by design; nor UNAVAILABLE, which here means the transport broke);
- the process never dies, and health says SERVING after each method's run;
- a write that fails leaves the known object's rows exactly as they were (ImportMessages commits
  per message, so there only complete additions are allowed); no row is ever torn.

HOSTILE_EXAMPLES (default 200) sets the examples per RPC. Runs are derandomized (the same inputs
every run) unless HOSTILE_RANDOM=1. A summary (`HOSTILE SUMMARY ...`) is printed at the end.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sqlite3
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message as pb_message
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import configuration as hypothesis_configuration
from hypothesis import strategies as st

from sessions_client import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.paths import object_path
from sessions_server.transport import handlers
from tests.reliability.support import SERVING, Server, canonical, check_object_file, health_status, open_file

pytestmark = pytest.mark.long  # about 60 s: started first (see tests/conftest.py)

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "200"))
RANDOM = os.environ.get("HOSTILE_RANDOM") == "1"
SERVICE = pb.DESCRIPTOR.services_by_name["SessionService"]
METHODS = [m.name for m in SERVICE.methods]
KNOWN = "hostile-known"
SEEDED_SESSION = "seeded"
MAX_REQUEST_BYTES = 2 * 1024 * 1024
CALL_TIMEOUT_SECONDS = 30.0
SUBSCRIBE_TIMEOUT_SECONDS = 5.0
STREAM_RESPONSE_CAP = 500

# Admin calls never touch the known object: DeleteObject would remove it, ExportObject with
# lock_for_move would refuse its writes for the lease, ImportObject could replace it.
ADMIN_METHODS = {"ExportObject", "ImportObject", "DeleteObject"}
# The writes that may change the known object's rows: the server's writes but the admin calls.
WRITE_METHODS = handlers.WRITE_METHODS - ADMIN_METHODS - {"AbortMove"}
WRONG_CODES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE}

IMAGE = bytes(range(256)) * 400  # 102,400 bytes: goes to the attachment tables
IMAGE_HASH = hashlib.sha256(IMAGE).hexdigest()


def _seed_messages() -> list[tuple[str, str]]:
    """(session, JSON) of the known object's content: small, multi-chunk and attachment rows."""
    small = [
        (
            "",
            canonical(
                {
                    "id": f"m{i}",
                    "role": "user" if i % 2 else "assistant",
                    "parts": [{"type": "text", "text": f"hello {i}"}],
                }
            ),
        )
        for i in range(1, 6)
    ]
    big = ("", canonical({"id": "big", "role": "assistant", "parts": [{"type": "text", "text": "b" * 1_600_000}]}))
    url = "data:image/png;base64," + base64.b64encode(IMAGE).decode("ascii")
    pic = (
        "",
        canonical({"id": "pic", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": url}]}),
    )
    other = [
        (SEEDED_SESSION, canonical({"id": f"s{i}", "role": "user", "parts": [{"type": "text", "text": "x"}]}))
        for i in range(3)
    ]
    return [*small, big, pic, *other]


SEED_IDS = ["m1", "m2", "m3", "m4", "m5", "big", "pic", "s0", "s1", "s2"]

# ── strategies ───────────────────────────────────────────────────────────────

HOSTILE_LITERALS = [
    "",
    ".",
    "..",
    "../",
    "../../../../etc/passwd",
    "/absolute/path",
    "C:\\windows\\system32",
    "a/b\\c",
    "\x00",
    "key\x00with-nul",
    "\x1b[31mred\x1b[0m",
    "\r\n",
    "\t",
    "\x7f",
    "\u0085",
    "\u2028\u2029",
    "\ufeff",
    "\ufffd",
    "\U0010ffff",
    "%00",
    "%2e%2e%2f",
    "%",
    "%ff%fe",
    " ",
    "CON",
    "NUL.txt",
    "attachment:sha256:" + "0" * 64,
    "attachment:sha256:" + IMAGE_HASH,
    "compaction_00000000-0000-0000-0000-000000000000",
    "' OR 1=1 --",
    '"; DROP TABLE cf_agents_session_messages; --',
    "NEAR(a b)",
    "a* OR b^ AND NOT c:d",
    "{}",
    "[]",
    "null",
]

hostile_text = st.one_of(
    st.sampled_from(HOSTILE_LITERALS),
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x1F), max_size=10),
    st.integers(0, 12_000).map(lambda n: "k" * n),  # up to 12 KB, past the 1 KB key limit
    st.integers(0, 3).map(lambda n: "é" * (1024 // 2 + n)),  # around the limit in bytes, not chars
)
object_keys = st.one_of(
    st.just(KNOWN), st.just(KNOWN), st.just(KNOWN), st.just("hostile-other"), hostile_text, hostile_text
)
admin_keys = hostile_text.filter(lambda key: key != KNOWN)
session_ids = st.one_of(st.just(""), st.just(SEEDED_SESSION), hostile_text)
message_ids = st.one_of(st.sampled_from(SEED_IDS), hostile_text)
hashes = st.one_of(
    st.just(IMAGE_HASH), st.just(IMAGE_HASH.upper()), st.binary(min_size=32, max_size=32).map(bytes.hex), hostile_text
)
queries = st.one_of(hostile_text, st.just("hello"), st.integers(0, 10_000).map(lambda n: "q " * n))

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15,
)
parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)}),
        st.fixed_dictionaries(
            {
                "type": st.just("file"),
                "mediaType": st.sampled_from(["image/png", "text/plain", "", "application/octet-stream"]),
                "url": st.one_of(
                    st.just("data:image/png;base64," + base64.b64encode(b"\x89PNG" * 10).decode()),
                    st.just("data:image/png;base64,!!!not base64"),
                    st.just("data:;base64,"),
                    st.text(max_size=20).map(lambda t: "data:image/png;base64," + t),
                ),
            }
        ),
        st.dictionaries(st.sampled_from(["type", "text", "data", "url", "state", "x"]), json_values, max_size=4),
        json_values,
    ),
    max_size=4,
)
message_shapes = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(message_ids, json_values),
        "role": st.one_of(st.sampled_from(["user", "assistant", "system", ""]), json_values),
        "parts": st.one_of(parts, json_values),
        "metadata": json_values,
        "createdAt": json_values,
    },
)


def _deep(depth: int, kind: str) -> str:
    if kind == "array":
        return "[" * depth + "]" * depth
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return '{"id":"deep","role":"user","parts":[{"type":"text","text":"x","v":' + "[" * depth + "]" * depth + "}]}"


deep_json = st.builds(
    _deep,
    st.sampled_from([999, 1000, 1001, 5000, 100_000]) | st.integers(1, 2000),
    st.sampled_from(["array", "object", "message"]),
)
huge_numbers = st.sampled_from(
    [
        "1e999999",
        "-1e999999",
        "9" * 5000,
        "-0",
        "0.0000000000000000000000000000001e-400",
        "123456789012345678901234567890",
        "NaN",
        "Infinity",
        "-Infinity",
        "0x10",
        "1_000",
    ]
).map(lambda number: '{"id":"num","role":"user","parts":[{"type":"text","text":"n","n":' + number + "}]}")
odd_json = st.sampled_from(
    [
        "",
        " ",
        "\ufeff{}",
        '{"id":"a","role":"user","parts":[],}',
        '{"id":"a","role":"user","parts":[]} trailing',
        '{"id":"a","id":"b","role":"user","parts":[]}',
        '{"id":"\\ud800","role":"user","parts":[]}',
        '{"id":"s","role":"user","parts":[{"type":"text","text":"\\udfff\\ud800"}]}',
        '{"id":"a","role":"user","parts":[]}\x00',
        '{"id":"a","role":"user","parts":[/* comment */]}',
        "{'id':'a','role':'user','parts':[]}",
        '{"__proto__":{"x":1},"id":"p","role":"user","parts":[]}',
        '{"id":"a","role":"user","parts":"not a list"}',
        '{"id":1,"role":"user","parts":[]}',
        '{"id":"a","role":null,"parts":[]}',
        '{"id":"a","role":"user","parts":[1,2,3]}',
        '{"id":"a","role":"user","parts":[{"type":5}]}',
        "[]",
        "null",
        "true",
        '"string"',
    ]
)
oversized_json = st.integers(MAX_REQUEST_BYTES - 200, MAX_REQUEST_BYTES + 1024).map(
    lambda n: canonical({"id": "huge", "role": "user", "parts": [{"type": "text", "text": "h" * n}]})
)


@st.composite
def mutated_text(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    text = draw(base)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "truncate"]))
        char = draw(st.sampled_from(['"', "\\", "{", "}", "[", "]", ",", ":", "\x00", "\u2028", "é", "\\u", "\\ud83d"]))
        if op == "insert":
            text = text[:pos] + char + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + 1 :]
        elif op == "replace":
            text = text[:pos] + char + text[pos + 1 :]
        else:
            text = text[:pos]
    return text


valid_shapes_text = message_shapes.map(lambda m: json.dumps(m, ensure_ascii=False))
json_texts = st.one_of(
    valid_shapes_text,
    valid_shapes_text,
    json_values.map(json.dumps),
    mutated_text(valid_shapes_text),
    deep_json,
    huge_numbers,
    odd_json,
    hostile_text,
    oversized_json,
)


def _int_strategy(field_type: int) -> st.SearchStrategy[int]:
    fd = pb_descriptor.FieldDescriptor
    if field_type in (fd.TYPE_INT32, fd.TYPE_SINT32, fd.TYPE_SFIXED32, fd.TYPE_ENUM):
        low, high = -(2**31), 2**31 - 1
    elif field_type in (fd.TYPE_UINT32, fd.TYPE_FIXED32):
        low, high = 0, 2**32 - 1
    elif field_type in (fd.TYPE_UINT64, fd.TYPE_FIXED64):
        low, high = 0, 2**64 - 1
    else:
        low, high = -(2**63), 2**63 - 1
    edges = sorted(v for v in {low, high, low + 1, high - 1, 0, 1, -1, 2**31 - 1, 2**31, 2**53 + 1} if low <= v <= high)
    return st.one_of(st.sampled_from(edges), st.integers(low, high), st.integers(max(low, -5), 100_000))


def _string_strategy(name: str, admin: bool) -> st.SearchStrategy[str]:
    if name == "object_key":
        return admin_keys if admin else object_keys
    if name == "session_id":
        return session_ids
    if name in ("message_json", "json_piece"):
        return json_texts
    if name in ("hash", "sha256"):
        return hashes
    if name == "query":
        return queries
    if name.endswith("_id") or name in ("message_ids",):
        return message_ids
    return hostile_text


def _value_strategy(f: pb_descriptor.FieldDescriptor, admin: bool, depth: int) -> st.SearchStrategy[Any]:
    fd = pb_descriptor.FieldDescriptor
    if f.type == fd.TYPE_MESSAGE:
        one: st.SearchStrategy[Any] = request_strategy(f.message_type, admin, depth + 1)
    elif f.type == fd.TYPE_STRING:
        one = _string_strategy(f.name, admin)
    elif f.type == fd.TYPE_BYTES:
        one = st.one_of(
            st.binary(max_size=2048),
            st.just(b"SQLite format 3\x00" + b"\x00" * 84),
            st.integers(0, MAX_REQUEST_BYTES + 4096).map(lambda n: b"\x00" * n),
        )
    elif f.type == fd.TYPE_BOOL:
        one = st.booleans()
    elif f.type in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE):
        one = st.floats()
    else:
        one = _int_strategy(f.type)
    if f.is_repeated:
        if f.type == fd.TYPE_STRING:  # also very long lists (20,000 ids)
            return st.one_of(
                st.lists(one, max_size=5), st.integers(1000, 20_000).map(lambda n: ["m1", "\x00"] * (n // 2))
            )
        return st.lists(one, max_size=5)
    return one


def request_strategy(
    desc: pb_descriptor.Descriptor, admin: bool, depth: int = 0
) -> st.SearchStrategy[pb_message.Message]:
    """Instances of `desc` with any subset of fields set to hostile values."""
    cls = pb.__dict__[desc.name]
    if depth > 2:
        return st.just(cls())
    optional = {f.name: _value_strategy(f, admin, depth) for f in desc.fields}
    # The object key is present most of the time, so most requests get past the first check.
    required = {"object_key": optional.pop("object_key")} if "object_key" in optional and depth == 0 else {}
    return st.fixed_dictionaries(required, optional=optional).map(lambda kwargs: cls(**kwargs))


# ── raw bytes ────────────────────────────────────────────────────────────────


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


BAD_UTF8 = [
    b"\xff",
    b"\xfe\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xe2\x82",
    b"\xf4\x90\x80\x80",
    b"ok\x80ok",
    b"\xf8\x88\x80\x80\x80",
]


@st.composite
def raw_request(draw: st.DrawFn, desc: pb_descriptor.Descriptor, admin: bool) -> bytes:
    """Bytes that are at most almost a `desc`: the server must decode or refuse them cleanly."""
    fd = pb_descriptor.FieldDescriptor
    base = draw(request_strategy(desc, admin)).SerializeToString()
    kind = draw(st.sampled_from(["random", "mutated", "bad_utf8", "bad_utf8", "wrong_wire", "length", "groups"]))
    if kind == "random":
        return draw(st.binary(max_size=512))
    if kind == "mutated":
        data = bytearray(base)
        for _ in range(draw(st.integers(1, 6))):
            pos = draw(st.integers(0, len(data)))
            op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
            if op == "flip" and pos < len(data):
                data[pos] ^= 1 << draw(st.integers(0, 7))
            elif op == "insert":
                data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
            elif op == "delete":
                del data[pos : pos + draw(st.integers(1, 8))]
            else:
                del data[pos:]
        return bytes(data)
    strings = [f for f in desc.fields if f.type == fd.TYPE_STRING]
    nested = [f for f in desc.fields if f.type == fd.TYPE_MESSAGE]
    if kind == "bad_utf8" and (strings or nested):
        bad = draw(st.sampled_from(BAD_UTF8))
        if nested and (not strings or draw(st.booleans())):
            outer = draw(st.sampled_from(nested))
            inner_strings = [f for f in outer.message_type.fields if f.type == fd.TYPE_STRING] or [None]
            inner = draw(st.sampled_from(inner_strings))
            if inner is None:
                return base
            payload = _tag(inner.number, 2) + _varint(len(bad)) + bad
            return base + _tag(outer.number, 2) + _varint(len(payload)) + payload
        f = draw(st.sampled_from(strings))
        return base + _tag(f.number, 2) + _varint(len(bad)) + bad
    if kind == "wrong_wire" and desc.fields:
        f = draw(st.sampled_from(list(desc.fields)))
        wire = draw(st.sampled_from([0, 1, 2, 3, 5, 6, 7]))
        payload = {0: _varint(2**63), 1: b"\x00" * 8, 2: _varint(3) + b"abc", 3: b"", 5: b"\x00" * 4}.get(wire, b"\x00")
        return base + _tag(f.number, wire) + payload
    if kind == "length" and desc.fields:
        f = draw(st.sampled_from(list(desc.fields)))
        return base + _tag(f.number, 2) + _varint(draw(st.sampled_from([2**31, 2**32 + 5, 2**63, 10]))) + b"abc"
    depth = draw(st.sampled_from([50, 101, 1000, 100_000]))
    number = draw(st.integers(1, 40))
    return base + _tag(number, 3) * depth + _tag(number, 4) * depth


# ── running calls ────────────────────────────────────────────────────────────


@dataclass
class Tally:
    tried: int = 0
    structured: int = 0
    raw: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    restarts: int = 0


@dataclass
class Target:
    server: Server
    channel: grpc.Channel
    stub: pb_grpc.SessionServiceStub
    tally: Tally
    watcher: sqlite3.Connection | None = None
    version: int = -1
    rows: dict[str, Counter[str]] = field(default_factory=dict)

    @property
    def known_path(self) -> Path:
        return object_path(self.server.data_dir, KNOWN)

    def known_rows(self) -> tuple[dict[str, Counter[str]], bool]:
        """The known object's rows (as digests) and whether they may have changed since the last
        look. `PRAGMA data_version` on a connection of ours moves only when another connection
        commits, so the full read happens only after a commit."""
        if self.watcher is None:
            self.watcher = sqlite3.connect(f"file:{self.known_path}?mode=ro", uri=True, isolation_level=None)
        version = int(self.watcher.execute("PRAGMA data_version").fetchone()[0])
        if version == self.version:
            return self.rows, False
        self.rows, self.version = _digest_rows(self.known_path), version
        return self.rows, True


def _reason(error: grpc.RpcError) -> str:
    with contextlib.suppress(Exception):
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
        if status is not None:
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info.reason
    return ""


def _metadata(draw_choice: int, key: str) -> tuple[tuple[str, str], ...]:
    if draw_choice == 0:
        return ()
    if draw_choice == 1:
        return (("x-object-key", urllib.parse.quote(key, safe="")),)
    if draw_choice == 2:
        return (("x-object-key", urllib.parse.quote(key + "-other", safe="")),)
    return (("x-object-key", "%ff%fe%00%"),)


def _call(
    target: Target, method: str, request: Any, metadata: tuple[tuple[str, str], ...], raw: bool
) -> tuple[grpc.StatusCode, str, str]:
    """Performs one call; returns (code, reason, details). Streams are read up to a cap."""
    desc = SERVICE.methods_by_name[method]
    path = f"/{SERVICE.full_name}/{method}"
    timeout = SUBSCRIBE_TIMEOUT_SECONDS if method == "Subscribe" else CALL_TIMEOUT_SECONDS
    identity = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
    if raw:
        if desc.client_streaming:
            callable_ = target.channel.stream_unary(path, **identity)
        elif desc.server_streaming:
            callable_ = target.channel.unary_stream(path, **identity)
        else:
            callable_ = target.channel.unary_unary(path, **identity)
    else:
        callable_ = getattr(target.stub, method)
    try:
        if desc.client_streaming:
            callable_(iter(request), timeout=timeout, metadata=metadata)
        elif desc.server_streaming:
            call = callable_(request, timeout=timeout, metadata=metadata)
            cap = 1 if method == "Subscribe" else STREAM_RESPONSE_CAP
            for count, _ in enumerate(call, start=1):
                if count >= cap:
                    call.cancel()  # ours: not the server's answer
                    return grpc.StatusCode.OK, "", "cancelled by the test after enough responses"
        else:
            callable_(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as error:
        return error.code(), _reason(error), error.details() or ""
    return grpc.StatusCode.OK, "", ""


def _describe(request: Any, limit: int = 300) -> str:
    text = repr(request)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _digest_rows(path: Path) -> dict[str, Counter[str]]:
    """Per table, a multiset of row digests (cheap to compare, even with megabyte rows)."""
    out: dict[str, Counter[str]] = {}
    with open_file(path) as conn:
        names = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        ]
        for name in names:
            try:
                rows = conn.execute(f'SELECT * FROM "{name}"').fetchall()
            except Exception:  # a virtual table whose module this sqlite lacks
                continue
            out[name] = Counter(hashlib.sha256(repr(row).encode("utf-8", "surrogatepass")).hexdigest() for row in rows)
    return out


def _check_example(target: Target, method: str, request: Any, raw: bool, metadata_choice: int) -> None:
    tally = target.tally
    tally.tried += 1
    if raw:
        tally.raw += 1
    else:
        tally.structured += 1
    write = method in WRITE_METHODS
    before = target.known_rows()[0] if write else None
    key = KNOWN
    with contextlib.suppress(Exception):
        key = request.object_key if not raw and hasattr(request, "object_key") else KNOWN
    started = time.monotonic()
    code, reason, details = _call(target, method, request, _metadata(metadata_choice, key), raw)
    elapsed = time.monotonic() - started
    tally.codes[f"{code.name}{'/' + reason if reason else ''}"] += 1
    alive = target.server.alive()
    if not alive:
        code_now = target.server.proc.poll() if target.server.proc else "?"
        tally.crashes.append(
            f"{method}: server died (exit {code_now}) on {_describe(request)}\n{target.server.output()[-3000:]}"
        )
        target.server.stop()
        _restart(target)
        return
    hung = code == grpc.StatusCode.DEADLINE_EXCEEDED and method != "Subscribe"
    moving = code == grpc.StatusCode.UNAVAILABLE and reason == "OBJECT_MOVING"
    if (code in WRONG_CODES and not moving) or hung:
        kind = "raw " if raw else ""
        tally.wrong.append(
            f"{method}: {code.name} [{reason}] {details[:200]!r} after {elapsed:.1f}s for {kind}{_describe(request)}"
        )
    if write:
        after, committed = target.known_rows()
        if committed and code != grpc.StatusCode.OK and after != before:
            assert before is not None
            additive = method == "ImportMessages" and all(not (before[t] - after.get(t, Counter())) for t in before)
            if not additive:
                changed = sorted(t for t in set(before) | set(after) if before.get(t) != after.get(t))
                tally.partial.append(
                    f"{method} answered {code.name} [{reason}] but changed {changed}: {_describe(request)}"
                )
        if committed and after != before:
            report = check_object_file(target.known_path, integrity=False, parents=False)
            if report.torn:
                tally.partial.append(f"{method}: torn rows after {_describe(request)}: {report.torn[:3]}")


def _seed(target: Target) -> None:
    with SessionsClient(target.server.address, timeout=60) as client:
        for session_id, text in _seed_messages():
            client.object(KNOWN).session(session_id).append_message(text)  # idempotent by id


def _restart(target: Target) -> None:
    if target.watcher is not None:
        target.watcher.close()
        target.watcher, target.version = None, -1
    target.channel.close()
    target.server.start()
    target.channel = grpc.insecure_channel(target.server.address, options=[("grpc.max_receive_message_length", -1)])
    target.stub = pb_grpc.SessionServiceStub(target.channel)
    target.tally.restarts += 1


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Target]:
    # Hypothesis keeps caches under ./.hypothesis by default; keep them out of the repository.
    hypothesis_configuration.set_hypothesis_home_dir(tmp_path_factory.mktemp("hypothesis-home"))
    server = Server(
        tmp_path_factory.mktemp("hostile"),
        "--max-request-bytes",
        str(MAX_REQUEST_BYTES),
        "--progress-seconds",
        "0.1",
        "--drain-seconds",
        "2",
    ).start()
    channel = grpc.insecure_channel(server.address, options=[("grpc.max_receive_message_length", -1)])
    found = Target(server, channel, pb_grpc.SessionServiceStub(channel), Tally())
    _seed(found)
    yield found
    tally = found.tally
    summary = (
        f"HOSTILE SUMMARY inputs tried={tally.tried} (structured={tally.structured}, raw={tally.raw}) over "
        f"{len(METHODS)} RPCs x {EXAMPLES} examples; crashes={len(tally.crashes)} wrong codes={len(tally.wrong)} "
        f"partial writes={len(tally.partial)}; codes={dict(tally.codes.most_common())}"
    )
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + summary)
    if found.watcher is not None:
        found.watcher.close()
    found.channel.close()
    found.server.stop()
    hypothesis_configuration.set_hypothesis_home_dir(None)


def _with_known_key(request: Any) -> Any:
    if not request.object_key:
        request.object_key = KNOWN
    return request


def _frames(method: str, admin: bool) -> st.SearchStrategy[Any]:
    desc = SERVICE.methods_by_name[method]
    structured = request_strategy(desc.input_type, admin)
    if method == "UploadMessage":
        header = request_strategy(pb.UploadHeader.DESCRIPTOR, admin)
        pieces = st.lists(json_texts | hostile_text, max_size=3)
        good_stream = st.tuples(header, pieces).map(
            lambda hp: (
                [pb.UploadMessageRequest(header=hp[0], json_piece=(hp[1] or [""])[0])]
                + [pb.UploadMessageRequest(json_piece=p) for p in hp[1][1:]]
            )
        )
        structured_stream = st.one_of(good_stream, st.lists(structured, max_size=4))
    elif method == "ImportMessages":
        first = structured.map(_with_known_key)  # so that most streams get past the first frame
        structured_stream = st.tuples(first, st.lists(structured, max_size=3)).map(lambda fr: [fr[0], *fr[1]])
    else:
        structured_stream = st.lists(structured, max_size=4)
    raw_stream = st.lists(raw_request(desc.input_type, admin), max_size=4)
    return st.one_of(structured_stream.map(lambda r: (False, r)), raw_stream.map(lambda r: (True, r)))


def _single(method: str, admin: bool) -> st.SearchStrategy[Any]:
    desc = SERVICE.methods_by_name[method]
    structured = request_strategy(desc.input_type, admin)
    raw = raw_request(desc.input_type, admin)
    return st.one_of(
        structured.map(lambda r: (False, r)), structured.map(lambda r: (False, r)), raw.map(lambda r: (True, r))
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("method", METHODS)
def test_hostile_requests_never_break_the_server(target: Target, method: str) -> None:
    desc = SERVICE.methods_by_name[method]
    admin = method in ADMIN_METHODS
    strategy = _frames(method, admin) if desc.client_streaming else _single(method, admin)
    tally = target.tally
    wrong_before, partial_before, crashes_before = len(tally.wrong), len(tally.partial), len(tally.crashes)
    if method in WRITE_METHODS:
        _seed(target)  # earlier runs may have deleted or cleared the known rows

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=not RANDOM,
        suppress_health_check=list(HealthCheck),
    )
    @given(example=strategy, metadata_choice=st.sampled_from([0, 0, 0, 1, 1, 2, 3]))
    def run(example: tuple[bool, Any], metadata_choice: int) -> None:
        raw, request = example
        _check_example(target, method, request, raw, metadata_choice)

    run()
    assert target.server.alive()
    assert health_status(target.server.address) == SERVING
    report = check_object_file(target.known_path, parents=False)  # imports keep parents verbatim
    problems = tally.crashes[crashes_before:] + tally.wrong[wrong_before:] + tally.partial[partial_before:]
    if report.integrity != "ok":
        problems.append(f"integrity of the known object: {report.integrity}")
    problems += report.torn
    assert not problems, f"{method}: {len(problems)} problems:\n" + "\n".join(problems[:25])
