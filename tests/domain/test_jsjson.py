"""JS-compatible JSON: parse normalisation, stringify bytes, UTF-16 length, JS whitespace."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions_server.domain import jsjson
from sessions_server.domain.jsjson import (
    MAX_JSON_DEPTH,
    JsonInputError,
    format_number,
    is_array_index,
    js_is_whitespace,
    js_key_order,
    js_trim,
    js_word_count,
    parse,
    stringify,
    utf16_length,
)


def roundtrip(text: str) -> str:
    return stringify(parse(text))


# ── numbers ──────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.0", "1"),
        ("-1.0", "-1"),
        ("1e2", "100"),
        ("1E+2", "100"),
        ("100e-2", "1"),
        ("1e16", "10000000000000000"),
        ("1e20", "100000000000000000000"),
        ("1e21", "1e+21"),
        ("999999999999999999999", "1e+21"),
        ("1e-7", "1e-7"),
        ("2e-7", "2e-7"),
        ("1e-6", "0.000001"),
        ("0.00001", "0.00001"),
        ("1.5e-9", "1.5e-9"),
        ("-0", "0"),
        ("-0.0", "0"),
        ("0e10", "0"),
        ("18446744073709551616", "18446744073709552000"),
        ("12345678901234567890", "12345678901234567000"),
        ("-12345678901234567890", "-12345678901234567000"),
        ("9007199254740993", "9007199254740992"),
        ("9007199254740991", "9007199254740991"),
        ("1e400", "null"),
        ("-1e400", "null"),
        ("1e-400", "0"),
        ("1.5e300", "1.5e+300"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("0.1", "0.1"),
        ("0.30000000000000004", "0.30000000000000004"),
        ("123.456", "123.456"),
        ("6.02214076e23", "6.02214076e+23"),
        ("1" + "0" * 400, "null"),
        ("1" * 30, "1.111111111111111e+29"),
    ],
)
def test_numbers_print_like_javascript(text: str, expected: str) -> None:
    assert roundtrip(text) == expected
    assert roundtrip(f"[{text}]") == f"[{expected}]"
    assert roundtrip(f'{{"n":{text}}}') == f'{{"n":{expected}}}'


def test_parsed_numbers_are_ints_when_integral() -> None:
    assert parse("1.0") == 1 and type(parse("1.0")) is int
    assert parse("1e16") == 10**16
    assert parse("18446744073709551616") == 18446744073709552000
    assert parse("1e400") == math.inf and stringify(parse("-1e400")) == "null"  # a number until written
    assert type(parse("1.5")) is float
    assert type(parse("1e21")) is float


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (1e21, "1e+21"),
        (1.5e-7, "1.5e-7"),
        (123e-20, "1.23e-18"),
        (float("inf"), "null"),
        (float("-inf"), "null"),
        (float("nan"), "null"),
        (2**64, "18446744073709552000"),
        (10**21, "1e+21"),
        (10**400, "null"),
        (-(2**53) - 1, "-9007199254740992"),
        (42, "42"),
    ],
)
def test_format_number(value: float, expected: str) -> None:
    assert format_number(value) == expected
    assert stringify([value]) == f"[{expected}]"


# ── key order ────────────────────────────────────────────────────────────────────────────────


def test_index_keys_first_then_insertion_order() -> None:
    text = '{"b":1,"10":2,"01":3,"-1":4,"4294967295":5,"4294967294":6,"0":7,"1.5":8,"2":9}'
    assert roundtrip(text) == ('{"0":7,"2":9,"10":2,"4294967294":6,"b":1,"01":3,"-1":4,"4294967295":5,"1.5":8}')
    assert list(parse(text)) == ["0", "2", "10", "4294967294", "b", "01", "-1", "4294967295", "1.5"]


def test_duplicate_keys_last_value_first_position() -> None:
    assert roundtrip('{"a":1,"b":2,"a":3}') == '{"a":3,"b":2}'
    assert roundtrip('{"5":1,"x":0,"5":2,"3":3}') == '{"3":3,"5":2,"x":0}'


def test_stringify_orders_dicts_built_in_python() -> None:
    assert stringify({"z": 1, "1": 2, "0": 3, "a": {"9": 0, "x": 1, "8": 2}}) == (
        '{"0":3,"1":2,"z":1,"a":{"8":2,"9":0,"x":1}}'
    )
    assert stringify({1: "a", "b": 2}) == '{"1":"a","b":2}'


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("0", True),
        ("10", True),
        ("4294967294", True),
        ("4294967295", False),
        ("01", False),
        ("-1", False),
        ("1.5", False),
        ("", False),
        ("١", False),
        ("²", False),
        ("1a", False),
        ("99999999999", False),
    ],
)
def test_is_array_index(key: str, expected: bool) -> None:
    assert is_array_index(key) is expected


def test_js_key_order_keeps_ordered_dict_identity() -> None:
    d = {"0": 1, "a": 2}
    assert js_key_order(d) is d
    assert list(js_key_order({"a": 1, "0": 2})) == ["0", "a"]


# ── strings ──────────────────────────────────────────────────────────────────────────────────


def test_string_escapes() -> None:
    text = '"\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \\" \\\\ \\/ \\u007f \\u2028\\u2029 é 中 😀"'
    assert roundtrip(text) == '"\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \\" \\\\ / \x7f \u2028\u2029 é 中 😀"'


def test_lone_surrogates_escaped_lowercase_and_pairs_joined() -> None:
    assert roundtrip('"\\uD800"') == '"\\ud800"'
    assert roundtrip('"a\\uDC00\\uD800b"') == '"a\\udc00\\ud800b"'
    assert roundtrip('"\\uD83D\\uDE00"') == '"😀"'
    assert roundtrip('{"\\ud800k":"\\udfff"}') == '{"\\ud800k":"\\udfff"}'
    assert parse('"\\ud83d\\ude00"') == "😀"
    assert stringify("x\ud83d") == '"x\\ud83d"'


def test_stringify_compact_and_non_ascii_raw() -> None:
    value = {"a": [1, True, None, False, "é"], "b": {}, "c": []}
    assert stringify(value) == '{"a":[1,true,null,false,"é"],"b":{},"c":[]}'


def test_stringify_rejects_unserializable() -> None:
    with pytest.raises(TypeError):
        stringify({"a": object()})
    with pytest.raises(TypeError):
        stringify({(1, 2): 1})


# ── rejection ────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "text",
    [
        "NaN",
        "[Infinity]",
        '{"a":-Infinity}',
        "\ufeff{}",
        "",
        " ",
        "{'a':1}",
        '{"a":1,}',
        "[1,]",
        "01",
        "1.",
        ".5",
        "+1",
        "0x10",
        '"\x01"',
        '"\\x"',
        '"\\u12"',
        "[1] 2",
        "\u00a0[]",
        "undefined",
        '{"a"}',
        "[",
    ],
)
def test_rejects_what_json_parse_rejects(text: str) -> None:
    with pytest.raises(JsonInputError):
        parse(text)


def test_error_message_is_readable() -> None:
    with pytest.raises(JsonInputError, match=r"line 1 column 8"):
        parse('{"a":1 "b":2}')
    assert issubclass(JsonInputError, ValueError)


def test_depth_limit() -> None:
    assert MAX_JSON_DEPTH == 1000
    deepest = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert roundtrip(deepest) == deepest
    objects = '{"a":' * MAX_JSON_DEPTH + "1" + "}" * MAX_JSON_DEPTH
    assert roundtrip(objects) == objects
    for depth in (MAX_JSON_DEPTH + 1, 5000, 200_000):
        with pytest.raises(JsonInputError, match="nesting"):
            parse("[" * depth + "]" * depth)
    # Brackets inside strings do not count as nesting.
    text = '["' + "[{" * 3000 + '"]'
    assert roundtrip(text) == text
    text = '["' + '\\"[\\\\' * 3000 + '",[[]]]'
    assert roundtrip(text) == text
    assert parse(text)[0] == '"[\\' * 3000


def test_accepts_json_whitespace_and_any_top_level() -> None:
    assert parse(' \t\n\r{"a" : [ 1 , 2 ] }\n') == {"a": [1, 2]}
    assert parse('"s"') == "s"
    assert parse("null") is None
    assert parse("true") is True


# ── round trips ──────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "value",
    [
        {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello"}]},
        {"a": [1, 2.5, -3, "x", None, True, {"b": [[]]}]},
        ["é😀中", "\u2028", "\x7f", "\x00"],
        {"k" * 50: "v" * 500},
    ],
)
def test_roundtrip_matches_python_json(value: object) -> None:
    text = stringify(value)
    assert text == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert parse(text) == value
    assert stringify(parse(text)) == text


def test_large_strings() -> None:
    # Their speed is measured by bench/ (the 5 MB message row), not asserted here.
    big = "x" * 20_000_000
    text = stringify({"text": big})
    assert parse(text)["text"] == big
    assert utf16_length(big) == 20_000_000
    assert js_word_count(big) == 1
    mixed = "héllo wörld 😀 中 " * 1_000_000
    assert utf16_length(mixed) == len(mixed) + 1_000_000
    assert js_word_count(mixed) == 4_000_000
    assert stringify(mixed) == '"' + mixed + '"'


# ── UTF-16 length and whitespace ─────────────────────────────────────────────────────────────


def test_utf16_length() -> None:
    assert utf16_length("") == 0
    assert utf16_length("abc") == 3
    assert utf16_length("é中") == 2
    assert utf16_length("😀") == 2
    assert utf16_length("a😀b𝄞") == 6
    assert utf16_length("\ud800") == 1


JS_WS = "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2005\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NOT_JS_WS = "\x1c\x1d\x1e\x1f\x85\u200b\u180e\x00\x08\u2060a"


def test_js_whitespace_set() -> None:
    for ch in JS_WS:
        assert js_is_whitespace(ch), hex(ord(ch))
        assert jsjson.JS_WHITESPACE_RE.fullmatch(ch)
    for ch in NOT_JS_WS:
        assert not js_is_whitespace(ch), hex(ord(ch))
        assert jsjson.JS_WHITESPACE_RE.fullmatch(ch) is None
    for cp in range(0x2000, 0x200B):
        assert js_is_whitespace(chr(cp))


def test_js_trim() -> None:
    assert js_trim(JS_WS + "x y" + JS_WS) == "x y"
    assert js_trim("\x1cx\x1c") == "\x1cx\x1c"
    assert js_trim("\u200b") == "\u200b"
    assert js_trim("\x85") == "\x85"
    assert js_trim("\ufeff\u3000") == ""


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", 0),
        ("   ", 0),
        ("one", 1),
        (" a  b ", 2),
        ("a\x1cb\x1cc", 1),
        ("a\x85b\u200bc\u180ed", 1),
        ("a\xa0b\ufeffc\u3000d\u2028e\u2029f", 6),
        ("a\tb\nc\x0bd\x0ce\rf", 6),
        ("😀 😀", 2),
        ("é\xa0é", 2),
        ("\ud800 x", 2),
    ],
)
def test_js_word_count(text: str, words: int) -> None:
    assert js_word_count(text) == words
    assert js_word_count(text) == len([w for w in jsjson.JS_WHITESPACE_RE.split(text) if w])


# ── the fast path (orjson) agrees with the exact path ────────────────────────────────────────


def typed(value: object) -> object:
    """`value` with every type and every object's key order made explicit (1 == 1.0 == True in Python)."""
    if isinstance(value, dict):
        return ("object", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("array", [typed(item) for item in value])
    return (type(value).__name__, value)


def exact_stringify(value: object) -> str:
    parts: list[str] = []
    jsjson._encode(value, parts)
    return jsjson._SURROGATE_RE.sub(jsjson._escape_surrogate, "".join(parts))


_keys = st.one_of(
    st.text(max_size=6),
    st.integers(min_value=0, max_value=2**33).map(str),
    st.sampled_from(["0", "00", "01", "-1", "1.5", "4294967294", "4294967295", "a", "length"]),
)
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(2**53) - 2, max_value=2**53 + 2),
    st.floats(allow_nan=False, allow_infinity=False),
)
_strings = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["\x00\x1f\x7f", "\u2028"])
_values = st.recursive(
    st.none() | st.booleans() | _numbers | _strings,
    lambda inner: st.lists(inner, max_size=4) | st.lists(st.tuples(_keys, inner), max_size=5),
    max_leaves=25,
)


def _text_of(value: object, spaced: bool) -> str:
    """JSON text for a generated value; a list of pairs becomes an object (duplicate keys kept)."""
    sep, colon = (" , ", " : ") if spaced else (",", ":")
    if isinstance(value, list) and value and all(isinstance(p, tuple) for p in value):
        return "{" + sep.join(json.dumps(k) + colon + _text_of(v, spaced) for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + sep.join(_text_of(v, spaced) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, ensure_ascii=spaced)


@given(_values, st.booleans())
def test_parse_agrees_with_the_exact_parser(value: object, spaced: bool) -> None:
    text = _text_of(value, spaced)
    parsed, plain = jsjson.parse_checked(text)
    assert typed(parsed) == typed(jsjson._parse_exact(text))
    assert stringify(parsed) == exact_stringify(jsjson._parse_exact(text))
    assert stringify(parsed, plain=plain) == exact_stringify(jsjson._parse_exact(text))


@pytest.mark.parametrize(
    "text",
    [
        "[1e2]",
        "[1.0]",
        "[1e21]",
        "[0.000001]",
        "[9007199254740993]",
        "[-9007199254740993]",
        "[18446744073709551616]",
        '{"b":1,"1":2}',
        '{"2":1,"1":2}',
        '{"1":1,"1":2,"a":3}',
        '["\\ud800"]',
        '{"\\udc00x":1}',
        "[" * 300 + "]" * 300,
        '{"a":' * 300 + "1" + "}" * 300,
    ],
)
def test_values_the_fast_parser_would_get_wrong_take_the_exact_path(text: str) -> None:
    parsed, plain = jsjson.parse_checked(text)
    assert typed(parsed) == typed(jsjson._parse_exact(text))
    assert stringify(parsed, plain=plain) == exact_stringify(jsjson._parse_exact(text))
    assert roundtrip(text) == exact_stringify(jsjson._parse_exact(text))


def test_messages_are_plain_data_and_removing_keeps_them_plain() -> None:
    message, plain = jsjson.parse_checked(
        '{"id":"m1","role":"user","metadata":{"0":1,"k":[true,null]},"parts":[{"type":"text","text":"é"}]}'
    )
    assert plain
    del message["metadata"]["k"]
    message["parts"].pop()
    expected = '{"id":"m1","role":"user","metadata":{"0":1},"parts":[]}'
    assert stringify(message, plain=True) == stringify(message) == expected
    for text in ("[1.5]", "[1e2]", '{"b":1,"0":2}', "[9007199254740993]", '["\\ud800"]'):
        assert not jsjson.parse_checked(text)[1], text


def test_stringify_of_values_orjson_refuses() -> None:
    deep: object = "x"
    for _ in range(300):
        deep = [deep]
    assert stringify(deep) == "[" * 300 + '"x"' + "]" * 300
    assert stringify({"a": "\udfff\ud800"}) == '{"a":"\\udfff\\ud800"}'


@pytest.mark.parametrize(
    "text",
    [
        '{"id":"a","n":1}',
        '{"id":"é😀","parts":[]}',
        '{"t":"' + "x" * 3_000_000 + '"}',  # compared piece by piece
        '{"t":"' + "é中😀" * 700_000 + '"}',
    ],
)
def test_stringify_hands_back_the_text_it_would_write(text: str) -> None:
    value = jsjson.parse(text)
    for plain in (False, True):
        assert jsjson.stringify(value, plain=plain, like=text) is text
    # Another text, however close, is not taken for it.
    for other in (text.replace(":", ": ", 1), text[:-1] + " }", text[:-2] + "x" + text[-1]):
        result = jsjson.stringify(value, like=other)
        assert result is not other
        assert result == text


def test_stringify_writes_its_own_text_for_input_it_normalizes() -> None:
    text = '{"b":1.0,"a":"\\u00e9"}'
    assert jsjson.stringify(jsjson.parse(text), like=text) == '{"b":1,"a":"é"}'


@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != 0))
def test_numbers_python_writes_positionally_are_formatted_as_from_their_digits(x: float) -> None:
    """`format_number` takes Python's positional repr where it is JS's text; the digits path,
    which the tests above hold to JS, is the reference."""
    assert format_number(x) == jsjson._format_digits(x)


@pytest.mark.parametrize(
    "text",
    [
        '{"t":"' + "中é" * 600_000 + '"}',  # given to orjson as bytes
        '{"t":"' + "中" * 600_000 + '\ud800"}',  # a lone surrogate: orjson refuses it, the exact path reads it
        '{"t":"' + "中" * 600_000 + '\\ud800", "n": 1.5}',
    ],
)
def test_a_large_text_of_other_characters_parses_as_a_small_one(text: str) -> None:
    assert jsjson.parse(text) == json.loads(text)
