"""The file format: the same tables, columns, keys and DDL as upstream creates (reference notes §1)."""

from __future__ import annotations

import re
import sqlite3

from tests.conformance.harness.messages import msg
from tests.conformance.harness.pair import Pair

# Ours alone, documented: the object-key record, the (session_id, seq) index that finds the
# active leaf, the (session_id, parent_id, seq) index that finds a row's children without
# scanning a session, and the index of the messages naming an attachment. All are invisible to
# upstream's code.
OUR_ADDITIONS = {
    "_sessions_meta",
    "_sessions_messages_by_seq",
    "_sessions_messages_by_parent",
    "_sessions_attachment_refs_by_hash",
}


def _norm(sql: str | None) -> str:
    return re.sub(r"\s+", " ", sql or "").replace("IF NOT EXISTS ", "").strip()


def test_tables_columns_and_ddl(pair: Pair) -> None:
    pair.append(msg("a"))
    up_master = pair.oracle.sql(pair.key, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name")
    up = {r["name"]: r for r in up_master if not r["name"].startswith("_cf_")}
    conn = sqlite3.connect(f"file:{pair.our_file()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        ours = {
            r["name"]: dict(r)
            for r in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name")
            if not r["name"].startswith("_cf_") and r["name"] not in OUR_ADDITIONS
        }
        assert sorted(up) == sorted(ours)
        for name, row in up.items():
            assert _norm(row["sql"]) == _norm(ours[name]["sql"]), name
            if row["type"] != "table":
                continue
            up_cols = pair.oracle.sql(pair.key, f"SELECT * FROM pragma_table_info('{name}')")
            our_cols = [dict(r) for r in conn.execute(f"SELECT * FROM pragma_table_info('{name}')")]
            assert up_cols == our_cols, name
    finally:
        conn.close()
