"""Runs the same operations on upstream (the oracle) and on our server, and compares.

A `Pair` owns one fresh object key on both sides. Every write method runs the operation on both,
compares what each returned, then `check()`s the whole state: stored rows of every session
(content, slices, seq, parent, token estimate, digest; `created_at` by shape unless it was given),
and every read with its options (paths from each leaf forward and newest-first, unknown and empty
leaf ids, latest leaf, branches and message of every id, row stats, recent history at budget
boundaries, history batches by count and bytes). A mismatch raises `Mismatch` naming the step,
the operation and each differing value.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions_client import AUTO, SessionsClient, SessionsError
from sessions_server.storage.paths import object_path
from tests.conformance.harness.canon import canon, canon_message, canon_message_opt, canon_opt
from tests.conformance.harness.oracle import Oracle, OracleError, RawJson
from tests.conformance.harness.stored import (
    MESSAGE_COLUMNS,
    Stored,
    file_rows,
    file_search_index,
    row_bytes,
    upstream_rows,
    upstream_search_index,
)

Msg = dict[str, Any] | str  # a message, or its exact JSON text
READ_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conformance-reads")
NOW_WINDOW_MS = 24 * 3600 * 1000
UNKNOWN_ID = "no-such-message"


class Mismatch(AssertionError):
    """Upstream and our server disagree."""


@dataclass(frozen=True)
class Outcome:
    """What one side answered: a value (canonical, comparable) or an error."""

    value: Any = None
    error: str | None = None

    def show(self) -> str:
        if self.error is not None:
            return f"<error {self.error}>"
        return _short(self.value)


def _short(value: Any, limit: int = 600) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > limit:
        return text[: limit // 2] + f" …({len(text)} chars)… " + text[-limit // 2 :]
    return text


def first_difference(a: str, b: str) -> str:
    i = next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (
        f"first difference at char {i}: upstream …{a[max(0, i - 40) : i + 60]!r}… ours …{b[max(0, i - 40) : i + 60]!r}…"
    )


def message_text(message: Msg) -> str:
    return message if isinstance(message, str) else json.dumps(message, ensure_ascii=False, separators=(",", ":"))


def message_id(message: Msg) -> str | None:
    try:
        value = json.loads(message) if isinstance(message, str) else message
    except ValueError:
        return None
    ident = value.get("id") if isinstance(value, dict) else None
    return ident if isinstance(ident, str) else None


def _oracle_message(message: Msg) -> Any:
    return RawJson(message) if isinstance(message, str) else message


def _canon_list(messages: Iterable[Any], names: dict[str, str] | None = None) -> list[str]:
    return [canon_message(m, names) for m in messages]


def overlay_names(stored: Stored) -> dict[str, str]:
    """`compaction_<record id>` → a name both sides share: session and the record's seq."""
    return {
        f"compaction_{r['id']}": f"compaction_<{r['session_id']}#{r['seq']}>"
        for r in stored.tables.get("compactions", [])
    }


class Pair:
    """One object, two implementations. `level` sets how much `check()` reads after each step:
    "full" reads every message id as a leaf; "normal" the leaves plus a sample; "light" a few reads
    (for very large messages); "rows" stored rows only."""

    def __init__(
        self,
        oracle: Oracle,
        client: SessionsClient,
        data_dir: Path,
        *,
        key: str | None = None,
        level: str = "full",
        label: str = "",
    ) -> None:
        self.oracle = oracle
        self.client = client
        self.data_dir = data_dir
        self.key = key or f"conf-{label + '-' if label else ''}{uuid.uuid4().hex[:16]}"
        self.level = level
        self.sessions: set[str] = {""}
        self.session_levels: dict[str, str] = {}  # per-session override of `level`
        self.ignore_tables: set[str] = set()  # e.g. "config" where ours stores a policy (DESIGN §5)
        self.step = 0
        self.log: list[str] = []
        self.fixed_created_at: dict[tuple[str, str], int] = {}
        self.up_rows = Stored()
        self.our_rows = Stored()
        self.checks = 0
        self._last_parent: str | None = None
        self._last_changed = False
        self._last_count = 0
        self._last_imported = False

    # ── plumbing ────────────────────────────────────────────────────────────

    def ours(self, session: str = "") -> Any:
        return self.client.object(self.key).session(session)

    def up(self, op: str, body: dict[str, Any] | None = None, session: str = "") -> Any:
        return self.oracle.call(self.key, session, op, body or {})

    def our_file(self) -> Path:
        return object_path(self.data_dir, self.key)

    def _fail(self, problems: Sequence[str]) -> None:
        history = "\n".join(f"  {line}" for line in self.log[-12:])
        raise Mismatch(
            f"object {self.key!r}, step {self.step}: {self.log[-1] if self.log else '(none)'}\n"
            + "\n".join(f"- {p}" for p in problems[:12])
            + (f"\n- … and {len(problems) - 12} more differences" if len(problems) > 12 else "")
            + f"\nrecent steps:\n{history}"
        )

    @staticmethod
    def _run_up(fn: Callable[[], Any], shape: Callable[[Any], Any]) -> Outcome:
        try:
            return Outcome(shape(fn()))
        except OracleError as exc:
            return Outcome(error=f"{exc.name or 'Error'}: {exc}")

    @staticmethod
    def _run_ours(fn: Callable[[], Any], shape: Callable[[Any], Any]) -> Outcome:
        try:
            return Outcome(shape(fn()))
        except SessionsError as exc:
            return Outcome(error=f"{exc.code.name}: {exc.message}")

    def _compare(self, what: str, up: Outcome, ours: Outcome, problems: list[str]) -> None:
        if up.error is not None or ours.error is not None:
            if up.error is None or ours.error is None:
                problems.append(f"{what}: upstream {up.show()} | ours {ours.show()}")
            return
        if up.value != ours.value:
            detail = f"{what}:\n    upstream {up.show()}\n    ours     {ours.show()}"
            if isinstance(up.value, str) and isinstance(ours.value, str):
                detail += "\n    " + first_difference(up.value, ours.value)
            problems.append(detail)

    def _write(
        self,
        label: str,
        session: str,
        up_call: Callable[[], Any],
        our_call: Callable[[], Any],
        up_shape: Callable[[Any], Any],
        our_shape: Callable[[Any], Any],
        extra: Callable[[Outcome, Outcome, list[str]], None] | None = None,
        check: bool = True,
    ) -> tuple[Outcome, Outcome]:
        self.step += 1
        self.log.append(f"[{session!r}] {label}")
        self.sessions.add(session)
        up = self._run_up(up_call, up_shape)
        ours = self._run_ours(our_call, our_shape)
        problems: list[str] = []
        self._compare("returned", up, ours, problems)
        if check:
            self._load_rows()
            if extra is not None:
                extra(up, ours, problems)
            self._check_rows(problems)
        elif extra is not None:
            self._fresh_upstream_rows()
            extra(up, ours, problems)
        if problems:
            self._fail(problems)
        if check:
            self._check_reads()
        return up, ours

    # ── writes ──────────────────────────────────────────────────────────────

    @staticmethod
    def _opts(parent: Any, source: str | None) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if parent is not AUTO:
            opts["parentId"] = parent
        if source is not None:
            opts["source"] = source
        return opts

    def append(
        self, message: Msg, parent: Any = AUTO, source: str | None = None, session: str = "", check: bool = True
    ) -> tuple[Outcome, Outcome]:
        opts = self._opts(parent, source)
        mid = message_id(message)
        label = f"append {_short(message_text(message), 160)} parent={parent!r} source={source}"

        def up_shape(r: Any) -> Any:
            return {"inserted": r["inserted"], "message": canon(r["message"])}

        def our_shape(r: Any) -> Any:
            self._last_parent = r.parent_id
            return {"inserted": r.inserted, "message": canon(r.message)}

        def extra(up: Outcome, ours: Outcome, problems: list[str]) -> None:
            # Ours also reports the parent it used (a documented addition); it must be upstream's.
            if up.error is None and ours.error is None and mid is not None:
                row = self.up_rows.row(session, mid)
                if row is not None and row["parent_id"] != self._last_parent:
                    problems.append(
                        f"reported parent: ours {self._last_parent!r}, upstream stored parent_id {row['parent_id']!r}"
                    )

        return self._write(
            label,
            session,
            lambda: self.up("appendMessage", {"message": _oracle_message(message), "options": opts}, session),
            lambda: self.ours(session).append_message(message, parent_id=parent, source=source or "server"),
            up_shape,
            our_shape,
            extra,
            check,
        )

    def update(
        self, message: Msg, source: str | None = None, session: str = "", check: bool = True
    ) -> tuple[Outcome, Outcome]:
        opts = self._opts(AUTO, source)
        return self._write(
            f"update {_short(message_text(message), 160)} source={source}",
            session,
            lambda: self.up("updateMessage", {"message": _oracle_message(message), "options": opts}, session),
            lambda: self.ours(session).update_message(message, source=source or "server"),
            canon_opt,
            canon_opt,
            check=check,
        )

    def upsert(
        self, message: Msg, parent: Any = AUTO, source: str | None = None, session: str = "", check: bool = True
    ) -> tuple[Outcome, Outcome]:
        opts = self._opts(parent, source)
        mid = message_id(message)
        before = self._fresh_upstream_rows()

        def our_shape(r: Any) -> Any:
            self._last_changed = r.changed
            return {"inserted": r.inserted, "message": canon(r.message)}

        def extra(up: Outcome, ours: Outcome, problems: list[str]) -> None:
            # Ours also says whether an existing row changed: it must match upstream's stored bytes.
            if up.error is None and ours.error is None and mid is not None and not up.value["inserted"]:
                changed = before.full_content(session, mid) != self.up_rows.full_content(session, mid)
                if changed != self._last_changed:
                    problems.append(f"upsert `changed`: ours {self._last_changed}, upstream row changed: {changed}")

        return self._write(
            f"upsert {_short(message_text(message), 160)} parent={parent!r} source={source}",
            session,
            lambda: self.up("upsertMessage", {"message": _oracle_message(message), "options": opts}, session),
            lambda: self.ours(session).upsert_message(message, parent_id=parent, source=source or "server"),
            lambda r: {"inserted": r["inserted"], "message": canon(r["message"])},
            our_shape,
            extra,
            check,
        )

    def delete(self, ids: Sequence[str], session: str = "", check: bool = True) -> tuple[Outcome, Outcome]:
        before = len(self._fresh_upstream_rows().session_rows(session))

        def extra(up: Outcome, ours: Outcome, problems: list[str]) -> None:
            removed = before - len(self.up_rows.session_rows(session))
            if ours.error is None and self._last_count != removed:
                problems.append(f"deleted_count: ours {self._last_count}, upstream rows removed {removed}")

        def our_shape(n: int) -> None:
            self._last_count = n

        return self._write(
            f"delete {list(ids)!r}",
            session,
            lambda: self.up("deleteMessages", {"ids": list(ids)}, session),
            lambda: self.ours(session).delete_messages(list(ids)),
            lambda r: r,
            our_shape,
            extra,
            check,
        )

    def clear(self, session: str = "", check: bool = True) -> tuple[Outcome, Outcome]:
        before = len(self._fresh_upstream_rows().session_rows(session))

        def extra(up: Outcome, ours: Outcome, problems: list[str]) -> None:
            if ours.error is None and self._last_count != before:
                problems.append(f"clear deleted_count: ours {self._last_count}, upstream rows removed {before}")

        def our_shape(n: int) -> None:
            self._last_count = n

        return self._write(
            "clear",
            session,
            lambda: self.up("clearMessages", {}, session),
            lambda: self.ours(session).clear_messages(),
            lambda r: r,
            our_shape,
            extra,
            check,
        )

    def import_(
        self, message: Msg, parent: str | None, created_at: int, session: str = "", check: bool = True
    ) -> tuple[Outcome, Outcome]:
        mid = message_id(message)
        existed = mid is not None and self._fresh_upstream_rows().row(session, mid) is not None

        def extra(up: Outcome, ours: Outcome, problems: list[str]) -> None:
            inserted = mid is not None and not existed and self.up_rows.row(session, mid) is not None
            if ours.error is None and self._last_imported != inserted:
                problems.append(f"import result: ours imported={self._last_imported}, upstream inserted={inserted}")
            if inserted and mid is not None:  # createdAt is a JS number upstream: past 2^53, the nearest double
                self.fixed_created_at[(session, mid)] = (
                    created_at if abs(created_at) <= 2**53 else int(float(created_at))
                )

        def our_shape(imported: bool) -> None:
            self._last_imported = imported

        return self._write(
            f"import {_short(message_text(message), 160)} parent={parent!r} created_at={created_at}",
            session,
            lambda: self.up(
                "importMessage",
                {"message": _oracle_message(message), "options": {"parentId": parent, "createdAt": created_at}},
                session,
            ),
            lambda: self.ours(session).import_message(message, parent_id=parent, created_at=created_at),
            lambda r: None,
            our_shape,
            extra,
            check,
        )

    # ── compaction ──────────────────────────────────────────────────────────

    def add_compaction(
        self, summary: str, from_id: str, to_id: str, session: str = "", check: bool = True
    ) -> tuple[Outcome, Outcome]:
        """addCompaction: the record's random id and creation time are compared by shape."""

        def up_shape(r: Any) -> Any:
            assert isinstance(r["id"], str) and r["id"], r
            assert isinstance(r["createdAt"], str) and r["createdAt"].endswith("Z"), r
            return {"summary": r["summary"], "from": r["fromMessageId"], "to": r["toMessageId"]}

        def our_shape(r: Any) -> Any:
            assert isinstance(r.id, str) and r.id, r
            assert abs(r.created_at_ms - time.time() * 1000) < NOW_WINDOW_MS, r
            return {"summary": r.summary, "from": r.from_message_id, "to": r.to_message_id}

        return self._write(
            f"addCompaction {summary!r} {from_id!r}..{to_id!r}",
            session,
            lambda: self.up(
                "addCompaction", {"summary": summary, "fromMessageId": from_id, "toMessageId": to_id}, session
            ),
            lambda: self.ours(session).add_compaction(summary, from_id, to_id),
            up_shape,
            our_shape,
            check=check,
        )

    def compact_reference(
        self, keep_recent_tokens: int, leaf: str | None = None, session: str = "", check: bool = True
    ) -> tuple[Outcome, Outcome]:
        """compact() with upstream's createCompactFunction and a fake summarizer answering
        `SUMMARY(<prompt length in UTF-16 units> chars)`; ours plans on the server and the client
        stores the overlay. The prompt itself is compared too."""
        body: dict[str, Any] = {"mode": "reference", "keepRecentTokens": keep_recent_tokens}
        if leaf is not None:
            body["leafId"] = leaf

        def fake(prompt: str) -> str:
            return f"SUMMARY({len(prompt.encode('utf-16-le')) // 2} chars)"

        def up_shape(r: Any) -> Any:
            res = r["result"]
            got = (
                None
                if res is None
                else {"from": res["fromMessageId"], "to": res["toMessageId"], "summary": res["summary"]}
            )
            return {"result": got, "prompt": r["prompt"] if r["summarizeCalled"] else None}

        def our_call() -> Any:
            s = self.ours(session)
            plan = s.plan_compaction(leaf_id=leaf, keep_recent_tokens=keep_recent_tokens)
            record = s.compact(fake, leaf_id=leaf, keep_recent_tokens=keep_recent_tokens)
            return plan, record

        def our_shape(r: Any) -> Any:
            plan, record = r
            got = (
                None
                if record is None
                else {"from": record.from_message_id, "to": record.to_message_id, "summary": record.summary}
            )
            return {"result": got, "prompt": None if plan is None else plan.prompt}

        return self._write(
            f"compact(reference, keepRecentTokens={keep_recent_tokens}, leaf={leaf!r})",
            session,
            lambda: self.up("compact", body, session),
            our_call,
            up_shape,
            our_shape,
            check=check,
        )

    # ── search ──────────────────────────────────────────────────────────────

    def search(
        self, query: str, limit: int | None = None, session: str = "", index: bool = True
    ) -> list[dict[str, Any]]:
        """search() on both sides; asserts equal hits and, with `index`, equal rows of the whole
        object's index (none on our side while the object has no file). Returns our hits."""
        self.log.append(f"[{session!r}] search {query!r} limit={limit}")
        body: dict[str, Any] = {"query": query}
        if limit is not None:
            body["options"] = {"limit": limit}
        kwargs = {} if limit is None else {"limit": limit}
        up = self._run_up(lambda: self.up("search", body, session), lambda hits: [dict(h) for h in hits])
        ours = self._run_ours(
            lambda: self.ours(session).search(query, **kwargs),
            lambda hits: [{"id": h.id, "role": h.role, "content": h.content} for h in hits],
        )
        problems: list[str] = []
        self._compare(f"search {query!r} limit={limit}", up, ours, problems)
        up_index, our_index = self.search_index_rows() if index else ([], [])
        if up_index != our_index:
            problems.append(f"search index rows: upstream {_short(up_index, 400)} | ours {_short(our_index, 400)}")
        if problems:
            self._fail(problems)
        return list(ours.value)

    def search_index_rows(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The search index's rows: (upstream's, ours)."""
        return upstream_search_index(self.oracle, self.key), file_search_index(self.our_file())

    # ── state checks ────────────────────────────────────────────────────────

    def our_rows_now(self) -> Stored:
        return file_rows(self.our_file())

    def _fresh_upstream_rows(self) -> Stored:
        self.up_rows = upstream_rows(self.oracle, self.key, ("messages", "chunks"))
        return self.up_rows

    def _load_rows(self) -> None:
        self.up_rows = upstream_rows(self.oracle, self.key)
        self.our_rows = file_rows(self.our_file())
        self.sessions |= self.up_rows.sessions() | self.our_rows.sessions()

    def _created_at_ok(self, session: str, mid: str, up: Any, ours: Any) -> str | None:
        fixed = self.fixed_created_at.get((session, mid))
        if fixed is not None and up == fixed:  # (else the id was deleted and written again since)
            if ours != fixed:
                return f"created_at of imported {mid!r}: given {fixed}, upstream {up}, ours {ours}"
            return None
        if up == ours:
            return None
        now = time.time() * 1000
        for side, value in (("upstream", up), ("ours", ours)):
            if not isinstance(value, int) or abs(value - now) > NOW_WINDOW_MS:
                return f"created_at of {mid!r}: upstream {up}, ours {ours} ({side} is not a current ms time)"
        return None

    def _check_rows(self, problems: list[str]) -> None:
        up, ours = self.up_rows, self.our_rows
        up_keys = [(r["session_id"], r["id"]) for r in up.messages]
        our_keys = [(r["session_id"], r["id"]) for r in ours.messages]
        if up_keys != our_keys:
            problems.append(f"stored message rows: upstream {up_keys} | ours {our_keys}")
            return
        for a, b in zip(up.messages, ours.messages, strict=True):
            for col in MESSAGE_COLUMNS:
                if col == "created_at":
                    issue = self._created_at_ok(a["session_id"], a["id"], a[col], b[col])
                    if issue:
                        problems.append(issue)
                    continue
                if a[col] != b[col]:
                    where = f"row {a['session_id']!r}/{a['id']!r} column {col}"
                    detail = f"{where}: upstream {_short(a[col], 300)} | ours {_short(b[col], 300)}"
                    if isinstance(a[col], str) and isinstance(b[col], str):
                        detail += "\n    " + first_difference(a[col], b[col])
                    problems.append(detail)
        for table in ("chunks", "attachment_meta", "attachment_chunks", "attachment_refs", "config"):
            if table in self.ignore_tables:
                continue
            a_rows, b_rows = up.tables.get(table, []), ours.tables.get(table, [])
            if a_rows != b_rows:
                problems.append(f"table {table}: upstream {_short(a_rows, 400)} | ours {_short(b_rows, 400)}")
        a_comp = [
            {k: v for k, v in r.items() if k not in ("id", "created_at")} for r in up.tables.get("compactions", [])
        ]
        b_comp = [
            {k: v for k, v in r.items() if k not in ("id", "created_at")} for r in ours.tables.get("compactions", [])
        ]
        if a_comp != b_comp:
            problems.append(f"table compactions: upstream {a_comp} | ours {b_comp}")

    def check(self, level: str | None = None) -> None:
        """Compares stored rows and (unless level "rows") every read."""
        self.log.append(f"check level={level or self.level}")
        self._load_rows()
        problems: list[str] = []
        self._check_rows(problems)
        if problems:
            self._fail(problems)
        self._check_reads(level)

    # ── reads ───────────────────────────────────────────────────────────────

    def read_plan(self, session: str, level: str) -> list[tuple[str, str, dict[str, Any]]]:
        """(label, op, body) reads to compare for one session, derived from upstream's rows."""
        rows = sorted(self.up_rows.session_rows(session), key=lambda r: r["seq"])
        ids = [r["id"] for r in rows]
        if level == "light":
            return self._light_plan(session, ids)
        parents = {r["parent_id"] for r in rows}
        leaves = [i for i in ids if i not in parents]
        if level == "full" or len(ids) <= 8:
            leaf_ids = ids
        else:
            sample = ids[:: max(1, len(ids) // 5)]
            leaf_ids = list(dict.fromkeys(leaves + sample))
        plan: list[tuple[str, str, dict[str, Any]]] = [
            ("getHistory()", "getHistory", {}),
            ("getHistory(newestFirst)", "getHistory", {"options": {"newestFirst": True}}),
            ("getHistory(leafId='')", "getHistory", {"options": {"leafId": ""}}),
            ("getHistory(leafId=unknown)", "getHistory", {"options": {"leafId": UNKNOWN_ID}}),
            ("getLatestLeaf()", "getLatestLeaf", {}),
            ("getHistoryRowStats()", "getHistoryRowStats", {}),
            ("getHistoryRowStats(unknown)", "getHistoryRowStats", {"leafId": UNKNOWN_ID}),
            ("getMessage(unknown)", "getMessage", {"id": UNKNOWN_ID}),
            ("getMessage('')", "getMessage", {"id": ""}),
            ("getBranches(unknown)", "getBranches", {"messageId": UNKNOWN_ID}),
            ("getRecentHistory(1000000000)", "getRecentHistory", {"maxContentBytes": 10**9}),
            (
                "getRecentHistory(unknown leaf)",
                "getRecentHistory",
                {"maxContentBytes": 10**9, "options": {"leafId": UNKNOWN_ID}},
            ),
        ]
        for mid in ids:
            plan.append((f"getMessage({mid!r})", "getMessage", {"id": mid}))
            plan.append((f"getBranches({mid!r})", "getBranches", {"messageId": mid}))
        for leaf in leaf_ids:
            plan.append((f"getHistory(leafId={leaf!r})", "getHistory", {"options": {"leafId": leaf}}))
            plan.append(
                (
                    f"getHistory(leafId={leaf!r}, newestFirst)",
                    "getHistory",
                    {"options": {"leafId": leaf, "newestFirst": True}},
                )
            )
            plan.append((f"getHistoryRowStats({leaf!r})", "getHistoryRowStats", {"leafId": leaf}))
        # Recent-history budgets around the path's row sizes (exact fit, one byte short, 1).
        for leaf in [None, *leaves[:3]]:
            path = self._upstream_path(session, leaf)
            sizes = [row_bytes(self.up_rows, session, mid) for mid in path]
            budgets = {1, sum(sizes), sum(sizes) - 1}
            if leaf is None:
                budgets.add(0)
                suffix = 0
                for size in reversed(sizes[-3:]):
                    suffix += size
                    budgets |= {suffix, suffix - 1}
            opts = {} if leaf is None else {"options": {"leafId": leaf}}
            for budget in sorted(b for b in budgets if b >= 0):
                plan.append(
                    (
                        f"getRecentHistory({budget}, leaf={leaf!r})",
                        "getRecentHistory",
                        {"maxContentBytes": budget, **opts},
                    )
                )
        first = self._upstream_path(session, None)[:1]
        one = row_bytes(self.up_rows, session, first[0]) if first else 10
        for label, options in (
            ("batchSize=2", {"batchSize": 2}),
            ("batchSize=2.7", {"batchSize": 2.7}),
            ("batchSize=0", {"batchSize": 0}),
            ("maxBatchBytes=1", {"maxBatchBytes": 1}),
            (f"batchSize=3,maxBatchBytes={one + 10}", {"batchSize": 3, "maxBatchBytes": one + 10}),
            ("newestFirst,batchSize=2", {"newestFirst": True, "batchSize": 2}),
            ("default", {}),
        ):
            plan.append((f"historyBatches({label})", "historyBatches", {"options": options}))
        for leaf in leaves[:2]:
            plan.append(
                (
                    f"historyBatches(leafId={leaf!r},batchSize=2)",
                    "historyBatches",
                    {"options": {"leafId": leaf, "batchSize": 2}},
                )
            )
        return plan

    def _light_plan(self, session: str, ids: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
        """A few reads for scenarios with very large messages (each read moves every byte)."""
        plan: list[tuple[str, str, dict[str, Any]]] = [
            ("getHistory()", "getHistory", {}),
            ("getLatestLeaf()", "getLatestLeaf", {}),
            ("getHistoryRowStats()", "getHistoryRowStats", {}),
            ("historyBatches(maxBatchBytes=1)", "historyBatches", {"options": {"maxBatchBytes": 1}}),
        ]
        plan += [(f"getMessage({mid!r})", "getMessage", {"id": mid}) for mid in ids]
        sizes = [row_bytes(self.up_rows, session, mid) for mid in self._upstream_path(session, None)]
        budgets = {1, sum(sizes), sum(sizes) - 1}
        if len(sizes) > 1:
            budgets |= {sizes[-1] + sizes[-2], sizes[-1] + sizes[-2] - 1}
        for budget in sorted(b for b in budgets if b >= 0):
            plan.append((f"getRecentHistory({budget})", "getRecentHistory", {"maxContentBytes": budget}))
        return plan

    def _upstream_path(self, session: str, leaf: str | None) -> list[str]:
        rows = {r["id"]: r for r in self.up_rows.session_rows(session)}
        if not rows:
            return []
        if leaf is None:
            leaf = max(rows.values(), key=lambda r: r["seq"])["id"]
        path: list[str] = []
        current: str | None = leaf
        while current is not None and current in rows and len(path) <= 10_000:
            path.append(current)
            current = rows[current]["parent_id"]
        return path[::-1]

    def _our_read(self, session: str, op: str, body: dict[str, Any]) -> Any:
        s = self.ours(session)
        opts = body.get("options", {})
        names = overlay_names(self.our_rows)
        if op == "getHistory":
            return _canon_list(
                s.get_history(leaf_id=opts.get("leafId"), newest_first=bool(opts.get("newestFirst"))), names
            )
        if op == "getLatestLeaf":
            return canon_message_opt(s.get_latest_leaf(), names)
        if op == "getHistoryRowStats":
            return [
                {"id": r.id, "role": r.role, "bytes": r.bytes, "tokenEstimate": r.token_estimate}
                for r in s.get_history_row_stats(leaf_id=body.get("leafId"))
            ]
        if op == "getMessage":
            return canon_message_opt(s.get_message(body["id"]), names)
        if op == "getBranches":
            return _canon_list(s.get_branches(body["messageId"]), names)
        if op == "getRecentHistory":
            r = s.get_recent_history(body["maxContentBytes"], leaf_id=opts.get("leafId"))
            return {
                "messages": _canon_list(r.messages, names),
                "truncated": r.truncated,
                "totalContentBytes": r.total_content_bytes,
            }
        if op == "historyBatches":
            kwargs: dict[str, Any] = {}
            if "batchSize" in opts:
                kwargs["batch_size"] = opts["batchSize"]
            if "maxBatchBytes" in opts:
                kwargs["max_batch_bytes"] = opts["maxBatchBytes"]
            batches = s.history_batches(
                leaf_id=opts.get("leafId"), newest_first=bool(opts.get("newestFirst")), **kwargs
            )
            return [_canon_list(b, names) for b in batches]
        raise ValueError(op)

    def _up_shape(self, op: str, result: Any) -> Any:
        names = overlay_names(self.up_rows)
        if op in ("getHistory", "getBranches", "history"):
            return _canon_list(result, names)
        if op in ("getLatestLeaf", "getMessage"):
            return canon_message_opt(result, names)
        if op == "getHistoryRowStats":
            return [
                {"id": r["id"], "role": r["role"], "bytes": r["bytes"], "tokenEstimate": r["tokenEstimate"]}
                for r in result
            ]
        if op == "getRecentHistory":
            return {
                "messages": _canon_list(result["messages"], names),
                "truncated": result["truncated"],
                "totalContentBytes": result["totalContentBytes"],
            }
        if op == "historyBatches":
            return [_canon_list(b, names) for b in result]
        raise ValueError(op)

    def compare_reads(self, session: str, plan: Sequence[tuple[str, str, dict[str, Any]]], problems: list[str]) -> None:
        ours_future = READ_POOL.map(
            lambda item: self._run_ours(lambda: self._our_read(session, item[1], item[2]), lambda v: v), plan
        )
        results = self.oracle.batch(self.key, [(session, op, body) for _, op, body in plan])
        for (label, op, _body), (ok, result), ours in zip(plan, results, ours_future, strict=True):
            up = Outcome(self._up_shape(op, result)) if ok else Outcome(error=f"{result.name or 'Error'}: {result}")
            self._compare(f"[{session!r}] {label}", up, ours, problems)

    def _check_reads(self, level: str | None = None) -> None:
        level = level or self.level
        if level == "rows":
            return
        self.checks += 1
        problems: list[str] = []
        for session in sorted(self.sessions):
            session_level = self.session_levels.get(session, level)
            if session_level != "rows":
                self.compare_reads(session, self.read_plan(session, session_level), problems)
        if problems:
            self._fail(problems)

    def read(self, op: str, body: dict[str, Any] | None = None, session: str = "") -> Any:
        """One read on both sides; asserts equal; returns upstream's (canonical) value."""
        body = body or {}
        self.log.append(f"read {op} {body}")
        self._load_rows()
        problems: list[str] = []
        results = self.oracle.batch(self.key, [(session, op, body)])
        ok, result = results[0]
        up = Outcome(self._up_shape(op, result)) if ok else Outcome(error=str(result))
        ours = self._run_ours(lambda: self._our_read(session, op, body), lambda v: v)
        self._compare(f"[{session!r}] {op} {body}", up, ours, problems)
        if problems:
            self._fail(problems)
        return up.value
