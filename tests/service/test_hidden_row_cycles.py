"""Hidden overlay rows in a cycle. `ImportMessages` stores ids and parents verbatim, as upstream's
`importMessage` does, so a caller can store a `compaction_<record>` row (hidden while its record
exists) whose parent is itself, or two such rows parented to each other. Reads that walk through
hidden rows (the active leaf towards the root, branches down to visible children) must end there:
the active leaf looped for good on a SQL thread (eight such calls stopped every read of every
object), and branches recursed until Python's stack gave out (INTERNAL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sessions_client import ImportItem, SessionsClient
from tests.service.support import ids, text_message

DEADLINE = 10.0  # a walk that loops never answers; a bounded one answers in milliseconds


@pytest.fixture
def session(live_server: Any, object_key: str) -> Iterator[Any]:
    with SessionsClient(live_server.address, timeout=DEADLINE, retry=None) as client:
        yield client.object(object_key).session()


def _hidden_id(session: Any) -> str:
    record = session.add_compaction("summary", "a", "b")
    return f"compaction_{record.id}"


def test_a_hidden_row_that_is_its_own_parent_has_no_visible_leaf(session: Any) -> None:
    session.append_messages([text_message("a"), text_message("b")])
    hidden = _hidden_id(session)
    assert session.import_messages([ImportItem(text_message(hidden), hidden)]).imported == 1

    assert session.get_latest_leaf() is None  # every row from the leaf on is hidden
    assert session.get_branches(hidden) == []  # its one child is itself, hidden
    assert ids(session.get_history()) == []  # the path from the leaf: the hidden row alone


def test_two_hidden_rows_parented_to_each_other(session: Any) -> None:
    first, second = _hidden_id(session), _hidden_id(session)
    session.import_messages([ImportItem(text_message(first), second), ImportItem(text_message(second), first)])

    assert session.get_latest_leaf() is None
    assert session.get_branches(first) == []
    assert session.get_branches(second) == []


def test_a_cycle_below_a_visible_message_still_gives_its_visible_children(session: Any) -> None:
    hidden = _hidden_id(session)
    session.import_messages(
        [
            ImportItem(text_message("root"), None),
            ImportItem(text_message(hidden), "root"),
            ImportItem(text_message("shown"), hidden),
            ImportItem(text_message("tip"), "root"),
        ]
    )
    # Hidden children are replaced by their own children (upstream's rule), in seq order.
    assert ids(session.get_branches("root")) == ["shown", "tip"]
    leaf = session.get_latest_leaf()
    assert leaf is not None and leaf["id"] == "tip"
