"""Deliberate differences from upstream (DESIGN.md §9), asserted AS differences: each test runs the
operation on both sides and checks that upstream still does its thing and we do ours, so neither
can drift silently. Feature-specific ones (attachments, search, compaction, feed) join their
feature modules' difference tests as those land."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from tests.conformance.harness.messages import big_text, msg, parts_msg
from tests.conformance.harness.oracle import OracleError, RawJson
from tests.conformance.harness.pair import Pair


def _ours_rejects(call: Any) -> SessionsError:
    with pytest.raises(SessionsError) as info:
        call()
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return info.value


NO_ROLE = {"id": "x", "parts": [{"type": "text", "text": "no role"}]}
BAD_SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("no-role", NO_ROLE),
    ("null-role", {"id": "x", "role": None, "parts": []}),
    ("numeric-role", {"id": "x", "role": 1, "parts": []}),
    ("numeric-id", {"id": 7, "role": "user", "parts": []}),
    ("no-id", {"role": "user", "parts": []}),
    ("parts-object", {"id": "x", "role": "user", "parts": {"0": {"type": "text", "text": "a"}}}),
    ("no-parts", {"id": "x", "role": "user"}),
]


# What upstream does with each bad shape, per write path, on a fresh object (update: an absent id).
# "throws": the call fails; "ignored": returns quietly, nothing stored; "null": update returns null;
# "stored": upstream writes the row anyway.
UPSTREAM_OUTCOME: dict[tuple[str, str], str] = {
    ("no-role", "append"): "throws",  # SqlError NOT NULL
    ("no-role", "import"): "ignored",  # INSERT OR IGNORE swallows NOT NULL
    ("no-role", "update"): "null",
    ("null-role", "append"): "throws",
    ("null-role", "import"): "ignored",
    ("null-role", "update"): "null",
    ("numeric-role", "append"): "stored",
    ("numeric-role", "import"): "stored",
    ("numeric-role", "update"): "null",
    ("numeric-id", "append"): "throws",  # TypeError: msg.id.startsWith
    ("numeric-id", "import"): "stored",  # as the text "7.0"
    ("numeric-id", "update"): "throws",
    ("no-id", "append"): "throws",
    ("no-id", "import"): "ignored",
    ("no-id", "update"): "throws",
    ("parts-object", "append"): "throws",
    ("parts-object", "import"): "throws",
    ("parts-object", "update"): "throws",
    ("no-parts", "append"): "throws",
    ("no-parts", "import"): "throws",
    ("no-parts", "update"): "throws",
}


@pytest.mark.parametrize(("name", "path"), list(UPSTREAM_OUTCOME), ids=[f"{n}-{p}" for n, p in UPSTREAM_OUTCOME])
def test_bad_shape_rejected_on_every_path(pair: Pair, name: str, path: str) -> None:
    """DESIGN §9: without a string id/role or an array parts we answer INVALID_ARGUMENT on every
    write path and store nothing; upstream throws on some paths, drops or stores on others."""
    message = dict(BAD_SHAPES)[name]
    op, body = {
        "append": ("appendMessage", {"message": message}),
        "import": ("importMessage", {"message": message, "options": {"parentId": None, "createdAt": 1}}),
        "update": ("updateMessage", {"message": message}),
    }[path]
    try:
        result = pair.up(op, body)
        rows = pair.oracle.sql(pair.key, "SELECT id FROM cf_agents_session_messages")
        if rows:
            outcome = "stored"
        elif path == "update" and result is None:
            outcome = "null"
        else:
            outcome = "ignored"
    except OracleError:
        outcome = "throws"
    assert outcome == UPSTREAM_OUTCOME[(name, path)], f"upstream now {outcome!r} for {name} on {path}"
    ours = pair.ours()
    call = {
        "append": lambda: ours.append_message(message),
        "import": lambda: ours.import_message(message, parent_id=None, created_at=1),
        "update": lambda: ours.update_message(message),
    }[path]
    _ours_rejects(call)
    assert pair.our_rows_now().messages == []


def test_duplicate_append_without_role(pair: Pair) -> None:
    """Upstream returns the stored row (inserted:false) for a duplicate id even without a role; we reject."""
    pair.append(msg("x"))
    up = pair.up("appendMessage", {"message": NO_ROLE})
    assert up["inserted"] is False and up["message"]["role"] == msg("x")["role"]
    _ours_rejects(lambda: pair.ours().append_message(NO_ROLE))
    pair.check()


def test_update_without_role(pair: Pair) -> None:
    """Upstream: absent id → null, present id → throws (NOT NULL). We reject both."""
    assert pair.up("updateMessage", {"message": {**NO_ROLE, "id": "absent"}}) is None
    _ours_rejects(lambda: pair.ours().update_message({**NO_ROLE, "id": "absent"}))
    pair.append(msg("x"))
    with pytest.raises(OracleError):
        pair.up("updateMessage", {"message": NO_ROLE})
    _ours_rejects(lambda: pair.ours().update_message(NO_ROLE))
    pair.check()


def test_import_without_role(pair: Pair) -> None:
    """Upstream's importMessage silently stores nothing (INSERT OR IGNORE swallows NOT NULL); we reject."""
    pair.append(msg("a"))
    assert pair.up("importMessage", {"message": NO_ROLE, "options": {"parentId": "a", "createdAt": 1}}) is None
    _ours_rejects(lambda: pair.ours().import_message(NO_ROLE, parent_id="a", created_at=1))
    pair.check()  # neither side stored it


def test_resolved_parent_is_reported(pair: Pair) -> None:
    """Upstream's append result is {inserted, message}; ours also names the parent used, so an
    unknown parent visibly made a root. The value equals upstream's stored parent_id."""
    pair.append(msg("a"))
    up = pair.up("appendMessage", {"message": msg("b"), "options": {"parentId": "unknown"}})
    assert set(up) == {"inserted", "message"}
    ours = pair.ours().append_message(msg("b"), parent_id="unknown")
    assert ours.parent_id is None
    up_c = pair.up("appendMessage", {"message": msg("c")})
    ours_c = pair.ours().append_message(msg("c"))
    assert set(up_c) == {"inserted", "message"} and ours_c.parent_id == "b"
    pair.check()


def test_compaction_policy_persisted_in_config_table(pair: Pair) -> None:
    """DESIGN §5: ours keeps the per-session compaction policy in `cf_agents_session_config`, which
    upstream creates but never writes (its compactAfter() is in-memory, per handle)."""
    pair.append(msg("a"))
    pair.up("compactAfter", {"threshold": 1000, "mode": "null"})
    pair.ours().set_compaction_policy(0, keep_recent_tokens=5)  # a threshold needs a summarizer here
    assert pair.oracle.sql(pair.key, "SELECT * FROM cf_agents_session_config") == []
    rows = pair.our_rows_now().tables["config"]
    assert {r["key"]: r["value"] for r in rows} == {
        "compaction.threshold_tokens": "0",
        "compaction.keep_recent_tokens": "5",
    }


@pytest.mark.parametrize("text", [r'"a\ud800b"', r'"\udc00"', r'"\udc00\ud800"'], ids=["high", "low", "reversed"])
def test_lone_surrogate_ids_are_rejected(pair: Pair, text: str) -> None:
    """Upstream stores ids holding a lone UTF-16 surrogate. Ours lifts ids into protobuf strings,
    which must be valid UTF-8, so it answers INVALID_ARGUMENT (INVALID_MESSAGE) and stores nothing."""
    message = f'{{"id":{text},"role":"user","parts":[]}}'
    upstream = pair.up("appendMessage", {"message": json.loads(message)})
    assert upstream["inserted"] is True
    error = _ours_rejects(lambda: pair.ours().append_message(message))
    assert error.reason == "INVALID_MESSAGE"
    assert pair.ours().get_history() == []


def test_a_write_answer_past_one_response_comes_back_as_a_read_gives_it(pair: Pair) -> None:
    """A written message whose JSON passes one response (3 MiB) and is not the JSON the client
    sent (the server sanitized or re-serialized it) is left out of the answer and read back by
    the client, so its media come back as stored: a part without `mediaType` has gained one,
    bytes first stored under another type carry that type. Upstream's write answers with the
    parts as given. Reads agree on both sides."""
    pair.level = "light"  # each read moves every byte
    bare = {"type": "file", "url": "data:image/png;base64,QUJD"}
    pair.append(parts_msg("small", [{"type": "file", "mediaType": "image/jpeg", "url": "data:image/jpeg;base64,REVG"}]))
    retyped = {"type": "file", "mediaType": "application/pdf", "url": "data:application/pdf;base64,REVG"}
    large = parts_msg("large", [bare, retyped, {"type": "text", "text": big_text(3_500_000)}], role="user")
    # Spaced JSON: the server stores it re-serialized, so the answer is not the JSON as sent.
    spaced = json.dumps(large, separators=(", ", ": "))
    up = pair.up("appendMessage", {"message": RawJson(spaced)})
    ours = pair.ours().append_message(spaced)
    assert up["inserted"] and ours.inserted
    assert up["message"]["parts"][:2] == [bare, retyped]
    assert ours.message["parts"][:2] == [
        {**bare, "mediaType": "image/png"},
        {**retyped, "url": "data:image/jpeg;base64,REVG"},
    ]
    as_read = pair.read("getMessage", {"id": "large"})
    assert json.loads(as_read)["parts"][:2] == ours.message["parts"][:2]
    pair.check()
