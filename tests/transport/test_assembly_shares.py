"""The assembly budget's fair share (transport/pieces.py `AssemblyBudget`, fair_share.py), without
a server: with tokens, once half the budget is held, a token holding some takes more only while
it holds less than its share of what the others leave, and a lone one all but an eighth. One
tenant holding two large uploads open refused every other tenant's writes over 1 MiB
(SERVER_BUSY) for as long as it liked. Without tokens, first come, first served, as before."""

from __future__ import annotations

import pytest

from sessions_server.domain.errors import LimitExceeded
from sessions_server.transport.pieces import AssemblyBudget, Pieces

MIB = 1024 * 1024
BUDGET = 64 * MIB


def _upload(budget: AssemblyBudget, holder: str | None, size: int) -> tuple[Pieces, LimitExceeded | None]:
    """An upload of `size` bytes in 1 MiB pieces, kept open: the pieces taken, and the refusal
    that stopped it, if any."""
    pieces = Pieces(budget, holder=holder)
    for _ in range(size // MIB):
        try:
            pieces.add("x" * MIB)
        except LimitExceeded as refused:
            return pieces, refused
    return pieces, None


def test_without_tokens_the_budget_goes_first_come_first_served() -> None:
    budget = AssemblyBudget(BUDGET)
    first, refused = _upload(budget, None, 31 * MIB)
    second, refused_too = _upload(budget, None, 31 * MIB)
    assert (refused, refused_too) == (None, None)
    with pytest.raises(LimitExceeded) as busy, budget.holding(["y" * (2 * MIB + 1)]):
        pass
    assert busy.value.reason == "SERVER_BUSY"
    assert str(busy.value).startswith(f"the server holds {62 * MIB} bytes of messages")
    first.release()
    second.release()
    assert budget.held_bytes == 0


def test_one_tenants_open_uploads_leave_another_its_large_writes() -> None:
    """The audit's case: A holds two uploads of 31 MiB open; B writes 2 MiB, then uploads 5 MiB."""
    budget = AssemblyBudget(BUDGET)
    first, refused = _upload(budget, "A", 31 * MIB)
    assert refused is None  # under half the budget
    second, refused = _upload(budget, "A", 31 * MIB)
    assert refused is not None and refused.reason == "SERVER_BUSY"  # its own calls hold it: they end
    assert refused.metadata["limit"] == "max_assembly_bytes"
    # Alone, it holds all but the eighth kept for a newcomer.
    assert str(refused).startswith(f"this token's calls hold {56 * MIB} bytes of messages being received or written")
    second.release()

    with budget.holding(["y" * 2 * MIB], "B"):  # past the small writes' pool
        assert budget.held_bytes == 33 * MIB
    upload, refused = _upload(budget, "B", 5 * MIB)
    assert refused is None
    upload.release()
    first.release()
    assert budget.held_bytes == 0


def test_a_newcomer_is_refused_busy_only_for_what_does_not_fit_and_told_no_figures() -> None:
    budget = AssemblyBudget(BUDGET)
    held_by_a, _ = _upload(budget, "A", 40 * MIB)  # stopped at its share: 32 MiB
    held_by_c, refused = _upload(budget, "C", 40 * MIB)
    assert refused is not None and refused.reason == "SERVER_BUSY"
    held = budget.held_bytes
    assert held < BUDGET
    with pytest.raises(LimitExceeded) as busy, budget.holding(["z" * (BUDGET - held + 1)], "D"):
        pass
    assert busy.value.reason == "SERVER_BUSY"
    assert str(busy.value) == (
        "other callers hold the server's room for messages being received or written, which cannot take "
        f"{BUDGET - held + 1} more now (max_assembly_bytes: {BUDGET} bytes); refused before being written: "
        "retry shortly"
    )
    with budget.holding(["z" * (BUDGET - held)], "D"):  # what fits, a newcomer takes
        assert budget.held_bytes == BUDGET
    held_by_a.release()
    held_by_c.release()
    assert budget.held_bytes == 0


def test_a_lone_tokens_message_may_take_all_but_an_eighth_of_the_budget() -> None:
    """Alone on the server, a token's one large message takes seven eighths of the budget (it
    was held to half, for newcomers that may never come); past that it could never be taken,
    so the refusal is final, naming the limit."""
    budget = AssemblyBudget(BUDGET)
    upload, refused = _upload(budget, "A", 56 * MIB)
    assert refused is None
    upload.release()
    upload, refused = _upload(budget, "A", 60 * MIB)
    assert refused is not None and refused.reason == "LIMIT_EXCEEDED"
    assert refused.metadata["limit"] == "max_assembly_bytes"
    assert "more than one caller may hold at once, seven eighths of the server's budget" in str(refused)
    upload.release()
    assert budget.held_bytes == 0


def test_an_empty_piece_is_never_refused_and_charges_go_back_to_their_holder() -> None:
    budget = AssemblyBudget(BUDGET)
    upload, _ = _upload(budget, "A", 40 * MIB)
    upload.add("")  # over its share, but asking for nothing
    handed = upload.hand_over()
    handed()
    assert budget.held_bytes == 0
    again, refused = _upload(budget, "A", 32 * MIB)  # its share is whole again
    assert refused is None
    again.release()
