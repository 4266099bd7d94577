"""Record golden vectors for the domain layer from the real upstream (`agents@0.32.0`).

Not a test module (pytest does not collect it); run it by hand when the vectors need refreshing:

    cd /tmp/oracle && (node serve.mjs --port 8790 > serve-8790.log 2>&1 &)
    curl -s http://127.0.0.1:8790/health          # wait until it answers
    python tests/domain/record_vectors.py [--url http://127.0.0.1:8790]
    kill <pid of that node process>

The oracle's Sessions is configured with `reservedMetadataKeys: ["reserved", "channel"]`. Each
message below is raw JSON TEXT: the HTTP body is built by string concatenation, so numbers such as
`1e400`, `-0` or `1.0` and escapes such as `\\ud800` reach upstream's `JSON.parse` unchanged. For
every message the script appends it to a fresh object, reads back the stored row with SQL and
writes `{input, source, content, content_chunks, token_estimate, content_hash}` to
`tests/domain/vectors/upstream_messages.json`, which `test_vectors.py` replays.

With `--numbers` it instead writes `vectors/js_numbers.json`: random number literals paired with
`JSON.stringify(JSON.parse(literal))` as computed by `node` (needs `node` on PATH, no oracle).

No attachment extraction may happen in these messages: file parts only use `text/*` base64 data
URLs, non-base64 data URLs, or non-data URLs.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "vectors" / "upstream_messages.json"
NUMBERS_OUT = Path(__file__).resolve().parent / "vectors" / "js_numbers.json"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _parts(*parts: str) -> str:
    return "[" + ",".join(parts) + "]"


def _text(value: str) -> str:
    """A text part whose `text` is the raw JSON value text `value`."""
    return '{"type":"text","text":' + value + "}"


# (source, raw JSON of the message without "id" (the id is prepended), repeat spec or None).
# A repeat spec [prefix, unit, count, suffix] stands for prefix + unit * count + suffix and keeps
# the big messages out of the vector file; for those only the hash of the content is kept.
RAW: list[tuple[str, str, list[Any] | None]] = []
MAX_INLINE_VECTOR_CHARS = 20_000


def add(body: str, source: str = "client") -> None:
    RAW.append((source, body, None))


def add_big(prefix: str, unit: str, count: int, suffix: str, source: str = "client") -> None:
    RAW.append((source, prefix + unit * count + suffix, [prefix, unit, count, suffix]))


# 1. Numbers of every kind, in a metadata object, a tool input, and bare arrays.
NUMBERS = [
    "0",
    "-0",
    "-0.0",
    "0.0",
    "1",
    "1.0",
    "-1.0",
    "1e2",
    "1E2",
    "1e+2",
    "100e-2",
    "1.5",
    "0.1",
    "0.30000000000000004",
    "123.456",
    "1e16",
    "1e20",
    "1e21",
    "1e-6",
    "1e-7",
    "0.000001",
    "0.0000001",
    "0.00001",
    "1.5e300",
    "1.5e-300",
    "5e-324",
    "2.2250738585072014e-308",
    "1.7976931348623157e308",
    "1e308",
    "1e400",
    "-1e400",
    "1e-400",
    "18446744073709551616",
    "12345678901234567890",
    "-12345678901234567890",
    "9007199254740991",
    "9007199254740992",
    "9007199254740993",
    "-9007199254740993",
    "123456789012345678901",
    "99999999999999999999",
    "999999999999999999999",
    "4.35",
    "1.23456789012345678901234",
    "0.1e1",
    "25e-1",
    "123456789e12",
    "1.0000000000000002",
    "3.14159265358979323846",
    "1e-5",
    "2e-7",
    "1234.5e-8",
    "100000000000000000000000",
    "1e+21",
    "-1.5e-9",
    "0e10",
    "6.02214076e23",
]
for i in range(0, len(NUMBERS), 8):
    group = NUMBERS[i : i + 8]
    body = '{"role":"user","parts":[' + _text('"numbers"') + "],"
    body += '"metadata":{' + ",".join(f'"n{j}":{n}' for j, n in enumerate(group)) + "}}"
    add(body)
    tool = '{"type":"tool-calc","toolCallId":"c","state":"output-available","input":['
    tool += ",".join(group) + '],"output":{"v":' + group[0] + ',"w":[' + ",".join(group) + "]}}"
    add('{"role":"assistant","parts":[' + tool + "]}")

# 2. Object key order: index-like keys, duplicates, numeric-looking non-index keys.
KEY_OBJECTS = [
    '{"b":1,"a":2,"10":3,"2":4,"0":5}',
    '{"01":1,"1":2,"-1":3,"1.5":4,"0":5}',
    '{"4294967295":1,"4294967294":2,"4294967296":3,"z":4,"3":5}',
    '{"a":1,"a":2,"b":3,"a":4}',
    '{"5":"x","5":"y","b":1,"3":2}',
    '{"0x1":1,"1e3":2,"00":3," 1":4,"1 ":5,"+1":6,"7":7}',
    '{"é":1,"😀":2,"中":3,"9":4,"":5}',
    '{"123456789012":1,"42":2,"4294967293":3}',
    '{"nested":{"b":{"2":1,"1":2,"x":3},"0":[{"1":1,"0":0}]},"1":true}',
    '{"__proto__":1,"constructor":2,"toString":3}',
]
for obj in KEY_OBJECTS:
    add('{"role":"user","parts":[' + _text('"keys"') + '],"metadata":' + obj + "}")
add('{"parts":[{"type":"text","text":"top"}],"9":1,"role":"user","0":2,"createdAt":"2024-01-01T00:00:00.000Z"}')

# 3. Strings: unicode, escapes, control characters, lone surrogates.
STRINGS = [
    r'"hello"',
    r'"héllo wörld"',
    r'"😀 emoji 👍🏽 family 👨‍👩‍👧"',
    r'"中文字符测试，你好世界"',
    r'"\ud800"',
    r'"\udc00"',
    r'"a\udc00\ud800b"',
    r'"\ud83d\ude00"',
    r'"\ud83d"',
    r'"x\ud83dy\ude00z"',
    r'"\u0000\u0001\u0002\u0007\u0008\u0009\u000a\u000b\u000c\u000d\u001b\u001f"',
    r'"\u007f\u0080\u009f\u00a0"',
    r'"line\u2028sep\u2029para"',
    r'"\/slash\\back\"quote"',
    r'"\u00e9\u4e2d\uFFFF\uFEFF"',
    r'"tab\there\nnewline\rcr\bbs\fff"',
    '"raw é 中 😀"',
    r'"\uD834\uDD1E G clef"',
    r'"\uDBFF\uDFFF max"',
    '""',
    r'"   "',
]
for s in STRINGS:
    add('{"role":"user","parts":[' + _text(s) + "]}")
add('{"role":"user","parts":[' + _text('"k"') + '],"metadata":{"\\ud800key":"\\udfff","\\u0001":1}}')

# 4. Whitespace: word counting and reasoning drop.
WS_TEXTS = [
    r'"a b c d e f g h i j k l m n o p"',
    r'"a\u001cb\u001cc\u001dd\u001ee\u001ff"',
    r'"a\u00a0b\u1680c\u2000d\u200ae\u2028f\u2029g\u202fh\u205fi\u3000j\ufeffk"',
    r'"a\u0085b\u200bc\u180ed"',
    r'"a\u000bb\u000cc\td\ne\rf g"',
    r'"  lead and trail  "',
    r'"one"',
    r'"x y"',
    r'"I a b c d e f g h i j k l m n o p q r s t u v w x y z"',
    r'"😀 😀 😀 😀 😀"',
    r'"中 中 中 中 中 中 中 中"',
]
for s in WS_TEXTS:
    add('{"role":"user","parts":[' + _text(s) + "]}")

REASONING_TEXTS = [
    '""',
    r'" "',
    r'"\t\n"',
    r'"\u00a0"',
    r'"\ufeff"',
    r'"\u2028\u2029"',
    r'"\u3000"',
    r'"\u001c"',
    r'"\u0085"',
    r'"\u200b"',
    r'"\u180e"',
    r'"x"',
    r'" thinking "',
    "null",
    "5",
    "[]",
    '{"a":1}',
    "true",
]
for s in REASONING_TEXTS:
    add('{"role":"assistant","parts":[{"type":"reasoning","text":' + s + "}," + _text('"after"') + "]}")
add('{"role":"assistant","parts":[{"type":"reasoning","reasoning":"legacy only"},{"type":"text","text":"t"}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":null,"reasoning":"legacy with null text"}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":"","providerMetadata":{}}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":"","providerMetadata":{"anthropic":{"s":"x"}}}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":"","providerMetadata":{"openai":{"itemId":"i"}}}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":" ","providerMetadata":{"openai":{"itemId":"i","x":1}}}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":"","providerMetadata":[1]}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":"","providerMetadata":[]}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":"","providerMetadata":"str"}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":"","providerMetadata":null}]}')
add('{"role":"assistant","parts":[{"type":"reasoning","text":"","callProviderMetadata":{"x":1}}]}')
add(
    '{"role":"assistant","parts":[{"type":"reasoning","text":"\\u00a0","providerMetadata":{"openai":{"reasoningEncryptedContent":"e"},"other":{}}}]}'
)

# 5. Provider metadata stripping.
OPENAI_VALUES = [
    '{"itemId":"i1"}',
    '{"itemId":"i1","reasoningEncryptedContent":"enc"}',
    '{"itemId":"i1","keep":true}',
    '{"keep":1,"itemId":"i1","also":[1,2]}',
    '{"z":1}',
    "{}",
    "null",
    "false",
    "0",
    '""',
    "true",
    "5",
    "-1",
    '"str"',
    '"😀x"',
    "[1,2]",
    "[]",
    '{"10":1,"2":2,"itemId":"i"}',
    '{"itemId":null}',
]
for ov in OPENAI_VALUES:
    add(
        '{"role":"assistant","parts":[{"type":"text","providerMetadata":{"openai":'
        + ov
        + ',"anthropic":{"a":1}},"text":"pm","state":"done"}]}'
    )
    add('{"role":"assistant","parts":[{"type":"text","text":"pm only","providerMetadata":{"openai":' + ov + "}}]}")
METADATA_VALUES = [
    '{"openai":{"itemId":"i"},"z":1}',
    '{"z":1,"openai":{"itemId":"i","other":2}}',
    '{"0":"a","openai":{"x":1}}',
    '{"openai":{"itemId":"i"},"0":1,"b":2}',
    "[1,2]",
    '"openai"',
    "null",
    "7",
    '{"OpenAI":{"itemId":"i"}}',
    '{"anthropic":{"cacheControl":"x"}}',
]
for mv in METADATA_VALUES:
    add(
        '{"role":"assistant","parts":[{"type":"tool-search","toolCallId":"t1",'
        '"callProviderMetadata":' + mv + ',"state":"output-available","input":{"q":"x"},'
        '"output":"found","providerMetadata":' + mv + "}]}"
    )
add(
    '{"role":"assistant","metadata":{"m":1},"parts":[{"providerMetadata":{"openai":{"itemId":"a"}},'
    '"type":"step-start"},{"type":"text","text":"x","callProviderMetadata":{"openai":{"itemId":"b",'
    '"reasoningEncryptedContent":"c","k":"v"},"google":{}}},{"type":"file","mediaType":"text/plain",'
    '"url":"https://example.com/a.txt","providerMetadata":{"openai":{"keep":"me"}}}],"id2":"x"}'
)

# 6. Reserved metadata, with source client and server.
RESERVED = [
    '{"reserved":1}',
    '{"reserved":1,"channel":"c"}',
    '{"reserved":1,"other":2}',
    '{"channel":{"x":1},"keep":[1],"reserved":null}',
    '{"other":1}',
    "{}",
    "null",
    "[1]",
    '"reserved"',
    '{"Reserved":1}',
    '{"0":1,"reserved":2}',
]
for md in RESERVED:
    for source in ("client", "server"):
        add('{"role":"user","metadata":' + md + ',"parts":[' + _text('"md"') + '],"after":1}', source)

# 7. Token estimates over part kinds.
TOOL_PARTS = [
    '{"type":"tool-weather","toolCallId":"w1","state":"output-available","input":{"city":"Paris",'
    '"days":[1,2,3]},"output":{"temp":21.5,"unit":"C","text":"sunny and warm today"}}',
    '{"type":"tool-weather","toolCallId":"w2","state":"input-available","input":"plain string input"}',
    '{"type":"tool-x","input":null,"output":null,"result":"result used when output is null"}',
    '{"type":"tool-x","input":{},"output":false,"result":"ignored"}',
    '{"type":"tool-x","input":0,"output":0}',
    '{"type":"tool-x","input":[1,2,3],"output":""}',
    '{"type":"tool-x","input":true,"result":{"legacy":"result object with several words in it"}}',
    '{"type":"dynamic-tool","toolName":"d","toolCallId":"d1","state":"output-available",'
    '"input":{"a":"b c d e f"},"output":[{"type":"text","value":"x y z"}]}',
    '{"type":"tool-","input":"empty name"}',
    '{"type":"tools-not","text":"not a tool part text"}',
    '{"type":"step-start"}',
    '{"type":"source-url","sourceId":"s","url":"https://example.com","title":"Example"}',
    '{"type":"data-custom","data":{"k":"v"},"text":null,"result":"skipped because text present"}',
    '{"type":"data-custom","data":{"k":"v"},"result":{"r":[1,2,3]}}',
    '{"type":"custom","text":{"object":"text"}}',
    '{"type":"text","text":null,"reasoning":"fallback reasoning words here"}',
    '{"type":"text","text":"","reasoning":"not used because empty string is not nullish"}',
    '{"type":"reasoning","text":"thinking hard about it","reasoning":"x"}',
    '{"type":"text","text":12345}',
    '{"type":"text","text":{"a":[1,2,{"b":"c"}]}}',
    '{"type":"text"}',
]
for tp in TOOL_PARTS:
    add('{"role":"assistant","parts":[' + tp + "]}")
add('{"role":"assistant","parts":[' + ",".join(TOOL_PARTS[:6]) + "]}")
add('{"role":"user","parts":[]}')
add('{"role":"system","parts":[' + _text('"' + "word " * 300 + '"') + "]}")
add('{"role":"user","parts":[' + _text('"' + "x" * 4001 + '"') + "]}")
add('{"role":"user","parts":[' + _text('"' + "😀" * 1001 + '"') + "]}")
add('{"role":"user","parts":[' + _text('"' + "a " * 777 + '"') + "]}")

# 8. File parts (never extracted: text/* payloads, non-base64 data URLs, remote URLs).
FILES = [
    '{"type":"file","mediaType":"text/plain","url":"data:text/plain;base64,' + _b64("hello world") + '"}',
    '{"type":"file","mediaType":"text/markdown","filename":"a.md","url":"data:text/markdown;base64,'
    + _b64("# Title\n\nbody " * 40)
    + '"}',
    '{"type":"file","mediaType":"text/csv","url":"data:text/csv,a,b,c%0A1,2,3"}',
    '{"type":"file","url":"data:text/plain,no media type"}',
    '{"type":"file","mediaType":"image/png","url":"data:image/png,not-base64"}',
    '{"type":"file","mediaType":"image/jpeg","url":"data:image/jpeg;charset=x,abc"}',
    '{"type":"file","mediaType":"text/plain","url":"data:text/plain;base64,' + _b64("z" * 1000) + '"}',
    '{"type":"file","mediaType":"text/html","url":"https://example.com/data:x"}',
    '{"type":"file","mediaType":"text/plain","url":"data:"}',
    '{"type":"file","mediaType":"text/plain","url":"data:text/plain;base64,"}',
    '{"type":"file","mediaType":null,"url":"data:text/plain,null media type"}',
    '{"type":"file","mediaType":"text/plain","url":"DATA:text/plain,upper"}',
    '{"type":"file","mediaType":"text/plain","url":"data:text/plain,é😀中"}',
    '{"type":"file","mediaType":"text/plain","url":"data:text/plain;base64,' + _b64("x") + '",'
    '"text":"file with text","providerMetadata":{"openai":{"itemId":"f"}}}',
]
for fp in FILES:
    add('{"role":"user","parts":[' + fp + "," + _text('"see file"') + "]}")
add('{"role":"user","parts":[' + ",".join(FILES[:4]) + "]}")

# 9. Bigger and nested documents.
add(
    '{"role":"assistant","parts":[{"type":"tool-deep","input":'
    + "[" * 40
    + "1"
    + "]" * 40
    + ',"output":'
    + '{"a":' * 30
    + "null"
    + "}" * 30
    + "}]}"
)
add_big('{"role":"user","parts":[{"type":"text","text":"', "big ascii ", 200_000, '"}]}')
for pad in ("", "a", "ab", "abc", "abcd", "abcde"):
    # The 10-byte unit puts the 1,572,864-byte cut at a different offset for each pad.
    add_big('{"role":"user","parts":[{"type":"text","text":"' + pad, "é😀中 ", 200_000, '"}]}')
for count in (1_572_800, 1_572_801, 1_572_802):
    # Stored JSON of 1,572,863 / 1,572,864 / 1,572,865 bytes: one under, at and over the budget.
    add_big('{"role":"user","parts":[{"type":"text","text":"', "x", count, '"}]}')
add_big('{"role":"user","parts":[{"type":"text","text":"', "y", 5_000_000, '"}]}')
add_big(
    '{"role":"user","parts":[{"type":"file","mediaType":"application/pdf","url":"data:application/pdf,',
    "p",
    90_000,
    '"}]}',
)
add_big(
    '{"role":"user","parts":[{"type":"file","mediaType":"text/plain","url":"data:;base64,',
    "QUJD",
    30_000,
    '"}]}',
)
add(
    '{"id_is_not_first":true,"role":"user","parts":[{"type":"text","text":"x","extra":{"deep":'
    '{"list":[{"x":1.25e-3},{"y":-2.5e+25},{"z":[0.5,-0.0,1e-9]}]}}}],"metadata":{"reserved":'
    '{"nested":1},"channel":0,"keep":1.0}}'
)


def post(url: str, path: str, body_text: str) -> Any:
    req = urllib.request.Request(
        url + path,
        data=body_text.encode("utf-8"),
        method="POST",
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            payload = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        payload = json.loads(exc.read().decode("utf-8"))
    if not payload.get("ok"):
        raise RuntimeError(f"{path}: {payload.get('error')}")
    return payload["result"]


def _random_number_literals(count: int) -> list[str]:
    rng = random.Random(20251130)
    out: list[str] = []
    while len(out) < count:
        kind = rng.random()
        if kind < 0.4:
            x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if x != x or x in (float("inf"), float("-inf")):
                continue
            out.append(repr(x))
        elif kind < 0.6:
            out.append(str(rng.randint(-(10**25), 10**25)))
        elif kind < 0.8:
            out.append(f"{rng.randint(1, 10 ** rng.randint(1, 20))}e{rng.randint(-330, 330)}")
        else:
            whole = rng.randint(0, 10 ** rng.randint(1, 17))
            frac = rng.randint(0, 10 ** rng.randint(1, 12))
            out.append(f"{'-' if rng.random() < 0.5 else ''}{whole}.{frac}")
    return out


def record_numbers() -> int:
    literals = _random_number_literals(1500)
    script = (
        "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>{"
        "const t=JSON.parse(s);"
        "process.stdout.write(JSON.stringify(t.map(x=>[x,JSON.stringify(JSON.parse(x))])))})"
    )
    done = subprocess.run(
        ["node", "-e", script], input=json.dumps(literals), capture_output=True, text=True, check=True
    )
    pairs = json.loads(done.stdout)
    lines = ",\n".join(json.dumps(pair) for pair in pairs)
    NUMBERS_OUT.write_text("[\n" + lines + "\n]\n", encoding="utf-8")
    print(f"wrote {len(pairs)} number vectors to {NUMBERS_OUT}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8790")
    ap.add_argument("--numbers", action="store_true", help="record js_numbers.json with node")
    args = ap.parse_args()
    if args.numbers:
        return record_numbers()
    key = f"vectors-{int(time.time() * 1000)}"
    vectors: list[dict[str, Any]] = []
    for n, (source, body, repeat) in enumerate(RAW):
        msg_id = f"v{n:03d}"
        assert body.startswith("{")
        message = '{"id":"' + msg_id + '",' + body[1:]
        batch_key = f"{key}-{n // 50}"
        post(
            args.url,
            f"/obj/{batch_key}/-/appendMessage",
            '{"message":' + message + ',"options":{"source":"' + source + '"}}',
        )
        rows = post(
            args.url,
            f"/obj/{batch_key}/-/sql",
            json.dumps(
                {
                    "query": "SELECT id, content, content_chunks, token_estimate, content_hash "
                    f"FROM cf_agents_session_messages WHERE id = '{msg_id}'"
                }
            ),
        )
        (row,) = rows
        content = row["content"]
        slice_bytes = [len(content.encode("utf-8"))]
        if row["content_chunks"]:
            chunks = post(
                args.url,
                f"/obj/{batch_key}/-/sql",
                json.dumps(
                    {
                        "query": "SELECT content FROM cf_agents_session_message_chunks "
                        f"WHERE id = '{msg_id}' ORDER BY idx"
                    }
                ),
            )
            content += "".join(c["content"] for c in chunks)
            slice_bytes += [len(c["content"].encode("utf-8")) for c in chunks]
        vector: dict[str, Any] = {"source": source}
        if repeat is None:
            vector["input"] = message
        else:
            prefix, unit, count, suffix = repeat
            vector["input_repeat"] = ['{"id":"' + msg_id + '",' + prefix[1:], unit, count, suffix]
        if len(content) <= MAX_INLINE_VECTOR_CHARS:
            vector["content"] = content
        vector["content_length"] = len(content)
        vector["content_chunks"] = row["content_chunks"]
        vector["slice_utf8_bytes"] = slice_bytes
        vector["token_estimate"] = row["token_estimate"]
        vector["content_hash"] = row["content_hash"]
        vectors.append(vector)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(vectors, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(vectors)} vectors to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
