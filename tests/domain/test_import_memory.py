"""What an import holds while its writes are under way (`domain.imports.Importer`), over real
object files, no gRPC. An import keeps receiving while its messages are written; it ran up to
IMPORT_PIPELINE_DEPTH chunks ahead of its commits whatever their size, and a chunk is a single
message once it is large: an import of 80 MB messages held four of them (each in several forms),
where an append holds one. It now holds at most IMPORT_PIPELINE_BYTES of messages not yet
written, or a single larger one, and small messages still run as far ahead as before.

The hold point: the import's first write waits (on the writer thread) until the import itself
waits for its writes (`Importer._settle`); what it holds is measured there, and at each later
wait, from the rows it validated (`large_messages.note_written`, called as each message is
taken) and those written (`import_all_in` returned)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import imports
from sessions_server.domain.errors import InvalidArgument, SessionsError
from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import StorageError

GUARD_SECONDS = 30.0  # a failure guard on the gate, never a synchronisation device
MIB = 1024 * 1024


def _message(message_id: str, text_bytes: int) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": "t" * text_bytes}]})


@dataclass
class Observed:
    """Bytes of the messages the import validated and has not written, at each of its waits."""

    sizes: dict[str, int] = field(default_factory=dict)  # by id, the sizes of the messages sent
    validated: list[str] = field(default_factory=list)
    written: set[str] = field(default_factory=set)
    held_at_waits: list[int] = field(default_factory=list)
    messages_at_waits: list[int] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)

    def held(self) -> tuple[int, int]:
        waiting = [message_id for message_id in self.validated if message_id not in self.written]
        return sum(self.sizes[message_id] for message_id in waiting), len(waiting)


@pytest.fixture
def observed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Observed]:
    seen = Observed()
    noted, written, settle = imports.large_messages.note_written, imports.import_all_in, imports.Importer._settle
    first_write = threading.Lock()

    def note_written(store: Any, session_id: str, rows: Any) -> None:
        rows = tuple(rows)
        seen.validated.extend(row.id for row in rows if row is not None)
        noted(store, session_id, rows)

    def import_all_in(ctx: Any, session_id: str, rows: Any, *args: Any) -> Any:
        if first_write.acquire(blocking=False):  # the import's first write waits for the hold point
            assert seen.gate.wait(GUARD_SECONDS), "the import never waited for its writes"
        result = written(ctx, session_id, rows, *args)
        seen.written.update(row.id for row in rows)
        return result

    async def observed_settle(self: imports.Importer, count: int) -> None:
        held, messages = seen.held()
        seen.held_at_waits.append(held)
        seen.messages_at_waits.append(messages)
        seen.gate.set()
        await settle(self, count)

    monkeypatch.setattr(imports.large_messages, "note_written", note_written)
    monkeypatch.setattr(imports, "import_all_in", import_all_in)
    monkeypatch.setattr(imports.Importer, "_settle", observed_settle)
    yield seen
    seen.gate.set()


def _import(tmp_path: Path, texts: list[tuple[str, str]]) -> int:
    """Imports the messages (id, JSON) as a chain; the number imported."""

    async def run() -> int:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            async with service.importer("o", "") as importer:
                parent = None
                for message_id, text in texts:
                    await importer.add(text, parent, 1)
                    parent = message_id
            return importer.imported
        finally:
            await service.registry.close_all()

    return asyncio.run(run())


def test_an_import_of_large_messages_holds_one_of_them_at_a_time(tmp_path: Path, observed: Observed) -> None:
    """Six messages of 5 MiB, each larger than IMPORT_PIPELINE_BYTES: while one is being written
    the import takes no other (it held four: 20 MiB)."""
    message_bytes = 5 * MIB
    texts = [(f"m{index}", _message(f"m{index}", message_bytes)) for index in range(6)]
    observed.sizes.update((message_id, len(text)) for message_id, text in texts)

    assert _import(tmp_path, texts) == 6
    assert observed.held_at_waits, "the import never waited for its writes"
    assert max(observed.messages_at_waits) == 1, observed.messages_at_waits
    assert max(observed.held_at_waits) <= max(observed.sizes.values())


def test_messages_larger_together_than_the_pipeline_bytes_wait_for_the_writes_before_them(
    tmp_path: Path, observed: Observed
) -> None:
    """Messages of 1.5 MiB, each of them a chunk of its own: the import holds at most
    IMPORT_PIPELINE_BYTES of them, not IMPORT_PIPELINE_DEPTH chunks (6 MiB)."""
    texts = [(f"m{index}", _message(f"m{index}", 3 * MIB // 2)) for index in range(8)]
    observed.sizes.update((message_id, len(text)) for message_id, text in texts)

    assert _import(tmp_path, texts) == 8
    assert observed.held_at_waits
    assert max(observed.held_at_waits) <= 4 * MIB, observed.held_at_waits


def test_small_messages_still_run_chunks_ahead_of_their_writes(tmp_path: Path, observed: Observed) -> None:
    """Messages of 1 KB: while the first is being written, the import takes IMPORT_PIPELINE_DEPTH - 1
    chunks more before it waits (the bound in bytes does not slow an import of small messages)."""
    texts = [(f"m{index}", _message(f"m{index}", 1000)) for index in range(400)]
    observed.sizes.update((message_id, len(text)) for message_id, text in texts)

    assert _import(tmp_path, texts) == 400
    ahead = 1 + imports.IMPORT_CHUNK_MESSAGES * (imports.IMPORT_PIPELINE_DEPTH - 1)
    assert observed.messages_at_waits[0] >= ahead, observed.messages_at_waits


class Releases:
    """Release callbacks that count their calls, and what was written when each was called."""

    def __init__(self, written: set[str]) -> None:
        self.calls: Counter[str] = Counter()
        self.written_when_released: dict[str, bool] = {}
        self._written = written

    def of(self, name: str, *, written_id: str | None = None) -> Callable[[], None]:
        """A release named `name`, noting whether `written_id` (else `name`) was written by then."""

        def release() -> None:
            self.calls[name] += 1
            self.written_when_released.setdefault(name, (written_id or name) in self._written)

        return release


def test_each_message_is_released_once_after_its_write(tmp_path: Path, observed: Observed) -> None:
    """`release` (the transport's charge for the message) is called once the message is written,
    not when the importer took it; `release_after`'s once all the messages taken are written."""
    releases = Releases(observed.written)
    texts = [(f"m{index}", _message(f"m{index}", size)) for index, size in enumerate([5 * MIB, 1000, 1000, 5 * MIB])]
    observed.sizes.update((message_id, len(text)) for message_id, text in texts)

    async def run() -> int:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            async with service.importer("o", "") as importer:
                parent = None
                for message_id, text in texts:
                    await importer.add(text, parent, 1, release=releases.of(message_id))
                    parent = message_id
                importer.release_after(releases.of("all so far", written_id="m3"))  # a charge for several
                with pytest.raises(InvalidArgument):
                    await importer.add("{not json", parent, 1, release=releases.of("invalid"))
            assert importer.pending_bytes == 0
            return importer.imported
        finally:
            await service.registry.close_all()

    assert asyncio.run(run()) == 4
    assert releases.calls == Counter({"m0": 1, "m1": 1, "m2": 1, "m3": 1, "all so far": 1, "invalid": 1})
    assert releases.written_when_released == {
        "m0": True,
        "m1": True,
        "m2": True,
        "m3": True,
        "all so far": True,
        "invalid": False,
    }


def test_messages_behind_a_failed_write_are_released_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first write fails while the others wait behind it: none of them is written, and each
    is released once, by the end of the call."""
    written = imports.import_all_in
    hold = threading.Event()
    calls = 0

    def first_fails(ctx: Any, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            hold.wait(timeout=GUARD_SECONDS)  # until the later messages wait behind this write
            raise StorageError("disk I/O error")
        return written(ctx, *args)

    monkeypatch.setattr(imports, "import_all_in", first_fails)
    releases = Releases(set())

    async def run() -> int:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            with pytest.raises(SessionsError) as failure:
                async with service.importer("o", "") as importer:
                    await importer.add(_message("m0", 10), None, 1, release=releases.of("m0"))
                    for index in range(1, 6):
                        await importer.add(
                            _message(f"m{index}", 10), f"m{index - 1}", 1, release=releases.of(f"m{index}")
                        )
                    hold.set()
            assert failure.value.reason == "STORAGE_FAILURE"
            assert importer.pending_bytes == 0
            return sum([await service.get_message("o", "", f"m{index}") is not None for index in range(6)])
        finally:
            hold.set()
            await service.registry.close_all()

    assert asyncio.run(run()) == 0
    assert releases.calls == Counter({f"m{index}": 1 for index in range(6)})
