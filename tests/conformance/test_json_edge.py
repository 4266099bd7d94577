"""JSON text edge cases: number formatting, escapes, key order, unicode (reference notes §15, §16).

Messages are sent as exact JSON text to both sides; stored bytes (and so digests, slices and
sizes) must match byte for byte."""

from __future__ import annotations

import pytest

from tests.conformance.harness.pair import Pair


def _raw(mid: str, metadata_json: str, text_json: str = '"x"') -> str:
    return f'{{"id":"{mid}","role":"user","parts":[{{"type":"text","text":{text_json}}}],"metadata":{metadata_json}}}'


NUMBER_CASES = [
    ("integers", '{"a":1,"b":-1,"c":0,"d":-0,"e":1.0,"f":-0.0,"g":100}'),
    ("exponents", '{"a":1e16,"b":1e21,"c":1e-7,"d":1e-6,"e":1E5,"f":1e+2,"g":-1.5e-10,"h":123e-20}'),
    ("overflow", '{"inf":1e400,"ninf":-1e400,"tiny":1e-400,"max":1.7976931348623157e308,"min":5e-324}'),
    (
        "precision",
        '{"a":18446744073709551616,"b":9007199254740993,"c":123456789012345678901234567890,"d":0.1,"e":0.30000000000000004}',
    ),
    (
        "decimals",
        '{"a":1.50,"b":0.000001234,"c":1.234e-7,"d":12345678.9,"e":100000000000000000000,"f":999999999999999999999}',
    ),
    ("arrays", '[1,2.5e0,-0,[1e21,[0.0]],{"z":1}]'),
]


@pytest.mark.parametrize(("name", "metadata"), NUMBER_CASES, ids=[c[0] for c in NUMBER_CASES])
def test_number_formatting(pair: Pair, name: str, metadata: str) -> None:
    pair.append(_raw("n1", metadata))
    pair.update(_raw("n1", metadata))  # parses to the same stored bytes: no-op
    pair.import_(_raw("n2", metadata), parent="n1", created_at=1_600_000_000_000)
    pair.upsert(_raw("n3", metadata))


INFINITE_PARTS = [
    ("tool-output", '{"type":"tool-x","toolCallId":"c","input":1,"output":1e400}'),
    ("tool-input", '{"type":"tool-x","toolCallId":"c","input":-1e400}'),
    ("text", '{"type":"data-x","text":1e400}'),
    ("text-part", '{"type":"text","text":-1e400}'),
    ("reasoning-over-text", '{"type":"reasoning","text":1e400,"reasoning":"r r r r r r r r"}'),
]


@pytest.mark.parametrize(("name", "part"), INFINITE_PARTS, ids=[c[0] for c in INFINITE_PARTS])
def test_infinities_are_estimated_as_numbers_and_stored_as_null(pair: Pair, name: str, part: str) -> None:
    """JSON.parse gives Infinity, a number: its estimate counts its JSON text ("null"), and
    `text ?? reasoning` keeps it; only the stored JSON has null."""
    pair.append(f'{{"id":"i1","role":"user","parts":[{part}]}}')
    pair.update(f'{{"id":"i1","role":"user","parts":[{part},{{"type":"text","text":"more"}}]}}')


STRING_CASES = [
    ("lone-high", r'"a\ud800b"'),
    ("lone-low", r'"\udc00"'),
    ("reversed-pair", r'"\udc00\ud800"'),
    ("escaped-pair", r'"\ud83d\ude00"'),
    ("raw-emoji", '"😀👍🏽🇺🇳"'),
    ("line-separators", '"\u2028\u2029"'),
    ("escaped-line-separators", r'"\u2028\u2029"'),
    ("controls", r'"\u0000\u0001\b\t\n\u000b\f\r\u001f\u007f\u0080\u009f"'),
    ("escaped-solidus-and-unicode", r'"\/\u0041\u00e9\"\\"'),
    ("bom-and-nonchars", '"\ufeff\ufffe\uffff"'),
    ("astral", '"𝄞𐍈"'),
]


@pytest.mark.parametrize(("name", "text"), STRING_CASES, ids=[c[0] for c in STRING_CASES])
def test_string_escapes(pair: Pair, name: str, text: str) -> None:
    pair.append(_raw("s1", f'{{"k":{text}}}', text))
    pair.update(_raw("s1", f'{{"k":{text}}}', text))
    pair.import_(_raw("s2", f'{{"k":{text}}}', text), parent="s1", created_at=1_600_000_000_000)


LONE_SURROGATE_IDS = {"lone-high", "lone-low", "reversed-pair"}


@pytest.mark.parametrize(
    ("name", "text"),
    [c for c in STRING_CASES if c[0] not in LONE_SURROGATE_IDS],
    ids=[c[0] for c in STRING_CASES if c[0] not in LONE_SURROGATE_IDS],
)
def test_string_as_message_id(pair: Pair, name: str, text: str) -> None:
    pair.append(f'{{"id":{text},"role":"user","parts":[]}}')
    pair.append('{"id":"child","role":"user","parts":[]}')


KEY_CASES = [
    ("index-like", '{"b":1,"2":2,"1":3,"01":4,"-1":5,"4294967294":6,"4294967295":7,"1.5":8,"0":9," 1":10}'),
    ("duplicate-keys", '{"a":1,"b":2,"a":3}'),
    ("nested-index-like", '{"x":{"10":1,"9":2,"a":3},"y":[{"3":1,"2":2}]}'),
    ("proto-key", '{"__proto__":{"polluted":1},"constructor":2}'),
    ("empty-key", '{"":1,"a":{"":{}}}'),
]


@pytest.mark.parametrize(("name", "metadata"), KEY_CASES, ids=[c[0] for c in KEY_CASES])
def test_key_order(pair: Pair, name: str, metadata: str) -> None:
    pair.append(_raw("k1", metadata))
    pair.import_(_raw("k2", metadata), parent="k1", created_at=1_600_000_000_000)


def test_top_level_key_order_and_whitespace(pair: Pair) -> None:
    pair.append('  {\n  "parts" : [ { "text" : "hi" , "type" : "text" } ] ,\n "role":"user", "id" : "w1" }  ')
    pair.append('{"role":"assistant","extra":{"1":true},"id":"w2","parts":[],"createdAt":"2024-01-01T00:00:00.000Z"}')
    pair.append('{"id":"w3","role":"user","parts":[{"type":"text","text":"\\u0068i"}],"metadata":null}')


TOKEN_TEXTS = [
    ("ascii-words", "one two  three\tfour\nfive"),
    ("utf16-units", "😀" * 10),
    ("js-whitespace-splits", "a\u00a0b\u3000c\u2028d\ufeffe\u1680f\u205fg"),
    ("not-whitespace", "a\x1cb\x1dc\x85d\u200be\u180ef"),
    ("word-heuristic", "a " * 50),
    ("long-word", "x" * 101),
    ("mixed", "Hello, world! Ünïcödé and 中文字符 and emoji 👍🏽 " * 3),
]


@pytest.mark.parametrize(("name", "text"), TOKEN_TEXTS, ids=[c[0] for c in TOKEN_TEXTS])
def test_token_estimates(pair: Pair, name: str, text: str) -> None:
    pair.append({"id": "t1", "role": "user", "parts": [{"type": "text", "text": text}]})
    pair.append(
        {
            "id": "t2",
            "role": "assistant",
            "parts": [{"type": "reasoning", "text": text}, {"type": "text", "text": text}],
        }
    )
    pair.append(
        {
            "id": "t3",
            "role": "assistant",
            "parts": [
                {
                    "type": "tool-search",
                    "toolCallId": "c1",
                    "state": "output-available",
                    "input": {"q": text},
                    "output": text,
                },
                {"type": "dynamic-tool", "toolName": "x", "toolCallId": "c2", "input": text, "result": [text, 1]},
                {"type": "source-url", "url": "https://example.com", "text": text},
                {"type": "data-x", "result": {"v": text}},
                {"type": "file", "mediaType": "text/plain", "url": "https://example.com/a.txt"},
                {"type": "step-start"},
            ],
        }
    )


def test_tool_parts_without_output(pair: Pair) -> None:
    pair.append(
        {
            "id": "t1",
            "role": "assistant",
            "parts": [
                {"type": "tool-a", "toolCallId": "c1", "state": "input-streaming"},
                {"type": "tool-b", "toolCallId": "c2", "input": None, "output": None},
                {"type": "tool-c", "toolCallId": "c3", "input": 0, "output": False},
                {"type": "tool-d", "toolCallId": "c4", "input": "", "errorText": "boom"},
                {"type": "text"},
                {"type": "text", "text": None},
                {"type": "reasoning", "text": "r", "providerMetadata": {}},
            ],
        }
    )


def test_text_data_urls_stay_inline(pair: Pair) -> None:
    """`text/*` data URLs are never extracted, but are charged in the estimate (reference notes §2.3)."""
    pair.append(
        {
            "id": "d1",
            "role": "user",
            "parts": [
                {"type": "file", "mediaType": "text/plain", "url": "data:text/plain;base64,aGVsbG8gd29ybGQ="},
                {"type": "file", "mediaType": "text/csv", "url": "data:text/csv,a%2Cb"},
                {"type": "file", "url": "data:text/plain,plain"},
                {"type": "file", "mediaType": "image/png", "url": "https://example.com/x.png"},
            ],
        }
    )
