"""The session's token estimate, which decides automatic compaction after every append, follows
updates and appends past the walk's cap without walking the path again, and stays what a fresh
derivation gives.

Upstream adds an update's difference when the row is counted (on the active path, outside the
applied overlays) and re-derives only after other changes. Here an update dropped the estimate
and the remembered path, so the next append walked and summed the whole path (5.6 ms at 1,000
messages, 53 ms at 9,000), and past the 10,001-row cap every append did (58 ms). The domain over
real object files, no gRPC; `queries.path_stats` is counted to see the walks.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import compactor as compactor_module
from sessions_server.domain import paths
from sessions_server.domain.compactor import Policy
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.domain.tokens import estimate_row_tokens, estimate_string_tokens
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import MAX_PATH_DEPTH, Parent

KEY = "o"


class _Summarizer:
    async def summarize(self, prompt: str) -> str:
        raise AssertionError("the threshold is never crossed here")


def _message(message_id: str, text: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})


def _tokens(text: str) -> int:
    return estimate_row_tokens(json.loads(text))


class _Walks:
    """Counts the session path walks that reach storage."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = paths.queries.path_stats

        def counted(*args: Any) -> Any:
            self.count += 1
            return original(*args)

        monkeypatch.setattr(paths.queries, "path_stats", counted)


async def _remembered_estimate(service: SessionsService, session_id: str = "") -> int:
    async with service.object(KEY) as store:
        return await service.compactor.token_estimate(store, session_id)


async def _fresh_estimate(service: SessionsService, session_id: str = "") -> int:
    async with service.object(KEY) as store:
        compactor_module.forget_estimate(store, session_id)
        return await service.compactor.token_estimate(store, session_id)


def _run(scenario: Callable[[SessionsService], Awaitable[None]], tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)), summarizer=_Summarizer())
        try:
            await service.compactor.set_policy(KEY, "", Policy(threshold_tokens=10**12))
            await scenario(service)
        finally:
            await service.registry.close_all()

    asyncio.run(main())


def _texts(count: int, prefix: str = "m") -> Iterator[tuple[str, str]]:
    for index in range(count):
        yield f"{prefix}{index}", _message(f"{prefix}{index}", f"message {index} " + "word " * (index % 7))


async def _append_all(service: SessionsService, texts: list[tuple[str, str]]) -> None:
    for start in range(0, len(texts), 1000):
        items = [AppendInput(text, Parent.auto(), True) for _, text in texts[start : start + 1000]]
        await service.append_many(KEY, "", items)


def test_updates_of_counted_rows_add_their_difference_without_a_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(service: SessionsService) -> None:
        current = dict(_texts(200))
        await _append_all(service, list(current.items()))
        walks = _Walks(monkeypatch)
        assert await _remembered_estimate(service) == sum(map(_tokens, current.values()))
        derived = walks.count  # the appends' own checks may have derived it already
        # An answer streamed by upserts, then the next turn; a rewrite of an older message.
        for step in range(5):
            current["m199"] = _message("m199", "streamed " * (40 * (step + 1)))
            inserted, result = await service.upsert(KEY, "", current["m199"], Parent.auto(), from_client=True)
            assert (inserted, result.changed) == (False, True)
        current["m200"] = _message("m200", "the next turn")
        assert (await service.append(KEY, "", current["m200"], Parent.auto(), from_client=True)).inserted
        current["m17"] = _message("m17", "rewritten " * 300)
        assert (await service.update(KEY, "", current["m17"], from_client=True)).changed
        assert await _remembered_estimate(service) == sum(map(_tokens, current.values()))
        assert walks.count == derived, "the estimate was derived again by a walk"
        # What the restated path remembers reads back as stored.
        assert [stat.token_estimate for stat in await service.row_stats(KEY, "")] == [
            _tokens(text) for text in current.values()
        ]
        assert walks.count == derived
        history = [view.json for window in [w async for w in service.history(KEY, "")] for view in window]
        assert [json.loads(text) for text in history] == [json.loads(text) for text in current.values()]
        assert await _fresh_estimate(service) == sum(map(_tokens, current.values()))

    _run(scenario, tmp_path)


def test_rows_under_an_overlay_or_off_the_active_path_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(service: SessionsService) -> None:
        current = dict(_texts(40))
        await _append_all(service, list(current.items()))
        await service.append(KEY, "", _message("side", "a branch"), Parent.of("m5"), from_client=True)
        current["m40"] = _message("m40", "back on the main line")
        await service.append(KEY, "", current["m40"], Parent.of("m39"), from_client=True)
        await service.compactor.add(KEY, "", "the summary of ten to twenty", "m10", "m20")
        walks = _Walks(monkeypatch)
        covered = [f"m{index}" for index in range(10, 21)]

        def expected() -> int:
            counted = [text for message_id, text in current.items() if message_id not in covered]
            return sum(map(_tokens, counted)) + estimate_string_tokens("the summary of ten to twenty")

        before = await _remembered_estimate(service)
        assert before == expected()
        derived = walks.count
        current["m15"] = _message("m15", "inside the summary " * 50)
        assert (await service.update(KEY, "", current["m15"], from_client=True)).changed
        assert (await service.update(KEY, "", _message("side", "elsewhere " * 50), from_client=True)).changed
        assert await _remembered_estimate(service) == before
        current["m30"] = _message("m30", "outside the summary " * 50)
        assert (await service.update(KEY, "", current["m30"], from_client=True)).changed
        assert await _remembered_estimate(service) == expected() > before
        assert walks.count == derived
        assert await _fresh_estimate(service) == expected()

    _run(scenario, tmp_path)


@pytest.mark.parametrize("with_record", [False, True])
def test_appends_past_the_walks_cap_keep_the_estimate_without_a_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_record: bool
) -> None:
    async def scenario(service: SessionsService) -> None:
        texts = list(_texts(MAX_PATH_DEPTH + 1))
        await _append_all(service, texts)
        if with_record:  # a record that applies to no row of the path: derived again at the cap
            await service.compactor.add(KEY, "", "a summary", "nowhere", "nothing")
        walks = _Walks(monkeypatch)
        assert await _remembered_estimate(service) == sum(_tokens(text) for _, text in texts)
        derived = walks.count
        for index in range(MAX_PATH_DEPTH + 1, MAX_PATH_DEPTH + 21):
            message_id, text = f"m{index}", _message(f"m{index}", f"past the cap {index} " * (index % 5))
            assert (await service.append(KEY, "", text, Parent.auto(), from_client=True)).inserted
            texts.append((message_id, text))
        current = texts[-(MAX_PATH_DEPTH + 1) :]
        assert await _remembered_estimate(service) == sum(_tokens(text) for _, text in current)
        assert walks.count == derived, "an append at the cap walked the path"
        assert await _fresh_estimate(service) == sum(_tokens(text) for _, text in current)

    _run(scenario, tmp_path)


def test_a_derivation_an_append_overtook_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends do not move the session's version (they change no remembered path): a derivation
    whose read began before an append committed would be remembered for the older leaf, and the
    estimate would miss the appended row until some later append dropped it."""
    entered, proceed = threading.Event(), threading.Event()
    original = paths.path_stats

    def held(*args: Any) -> Any:
        if not entered.is_set():  # the first derivation only: the append's own check goes on
            entered.set()
            assert proceed.wait(timeout=30), "the derivation was never let go"
        return original(*args)

    async def scenario(service: SessionsService) -> None:
        first, second = _message("m1", "a few words"), _message("m2", "many words " * 300)
        await service.append(KEY, "", first, Parent.auto(), from_client=True)
        async with service.object(KEY) as store:
            compactor_module.forget_estimate(store, "")
        monkeypatch.setattr(compactor_module.paths, "path_stats", held)
        racing = asyncio.ensure_future(_remembered_estimate(service))
        await asyncio.to_thread(entered.wait, 30)  # its snapshot holds m1 alone
        await service.append(KEY, "", second, Parent.auto(), from_client=True)
        proceed.set()
        assert await racing in (_tokens(first), _tokens(first) + _tokens(second))
        monkeypatch.setattr(compactor_module.paths, "path_stats", original)
        assert await _remembered_estimate(service) == _tokens(first) + _tokens(second)

    _run(scenario, tmp_path)


def test_an_append_that_ends_a_records_span_derives_the_estimate_again(tmp_path: Path) -> None:
    """A record may name a span whose end is not stored yet: the append that stores it makes the
    overlay apply, and the estimate must count the summary instead of the rows it covers."""

    async def scenario(service: SessionsService) -> None:
        first = _message("m1", "the first message")
        await service.append(KEY, "", first, Parent.auto(), from_client=True)
        await service.compactor.add(KEY, "", "short summary", "m2", "m3")  # neither stored yet
        assert await _remembered_estimate(service) == _tokens(first)
        for message_id in ("m2", "m3"):
            text = _message(message_id, "covered words " * 200)
            assert (await service.append(KEY, "", text, Parent.auto(), from_client=True)).inserted
        expected = _tokens(first) + estimate_string_tokens("short summary")
        assert await _remembered_estimate(service) == expected
        assert await _fresh_estimate(service) == expected

    _run(scenario, tmp_path)
