"""The Python client decodes a read's messages with the C scanner `json.loads` runs, called
directly (`loads_message`): it must give `json.loads`' value, types included, or raise its
error, for any text, not only the compact JSON the server writes."""

from __future__ import annotations

import json
import math

import pytest

from sessions_client._common import loads_message

TEXTS = [
    '{"id":"m1","role":"user","parts":[{"type":"text","text":"hi"}]}',
    '{"a":123456789012345678901234567890,"b":18446744073709552000,"c":-9223372036854775809}',
    '{"a":1e400,"b":-1e400,"c":1.5e-400,"d":-0,"e":-0.0,"f":2.0,"g":1E2,"h":0.1}',
    '{"a":NaN,"b":Infinity,"c":-Infinity}',
    '{"a":"\\ud800","b":"\\ud83d\\ude00","c":"\\u0000","d":"é"}',
    '{"a":1,"a":2}',
    '[1,"x",null,true,false,{}]',
    '"a string"',
    "42",
    ' {"a":1}',  # whitespace first
    '{"a":1} ',  # after
    '{"a":1}\n',
    '{"a":1}{"b":2}',  # extra data
    '{"a":1',
    '{"a":}',
    "",
    "   ",
    "nul",
    "[" * 100_000 + "]" * 100_000,  # deeper than the interpreter recurses
]


def _outcome(decode: object, text: str) -> tuple[str, str]:
    try:
        value = decode(text)  # type: ignore[operator]
    except RecursionError:
        return ("RecursionError", "")
    except ValueError as error:
        return (type(error).__name__, str(error))
    return ("value", repr(value))


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_the_same_value_or_the_same_error_as_json_loads(text: str) -> None:
    assert _outcome(loads_message, text) == _outcome(json.loads, text)


def test_values_keep_their_types() -> None:
    value = loads_message('{"big":18446744073709552000,"nan":NaN,"float":2.0}')
    assert type(value["big"]) is int and value["big"] == 18446744073709552000
    assert math.isnan(value["nan"]) and type(value["float"]) is float
