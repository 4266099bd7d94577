import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import type { Interceptor } from "@connectrpc/connect";
import { ImportItem, SessionsError, routingHeaders, encodeObjectKey, type SessionsClient } from "../src/index.js";
import { AppendMessageRequestSchema, ParentMode } from "../src/gen/sessions/v1/sessions_pb.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;
let client: SessionsClient;

before(async () => {
  server = await TestServer.start(["--reserved-metadata-key", "secret"]);
  client = server.client();
});
after(async () => {
  await server?.stop();
});

describe("appendMessage", () => {
  test("auto parent chains, returns the stored message and the parent used", async () => {
    const s = client.object(freshKey()).session("chat");
    const first = await s.appendMessage(msg("a"));
    assert.equal(first.inserted, true);
    assert.equal(first.parentId, null);
    assert.deepEqual(first.message, msg("a"));
    const second = await s.appendMessage(msg("b", "hello", "assistant"));
    assert.equal(second.inserted, true);
    assert.equal(second.parentId, "a");
    assert.deepEqual(second.message, msg("b", "hello", "assistant"));
  });

  test("null parent starts a root, an explicit id attaches there", async () => {
    const s = client.object(freshKey()).session();
    await s.appendMessage(msg("a"));
    await s.appendMessage(msg("b"));
    const root = await s.appendMessage(msg("r"), { parentId: null });
    assert.equal(root.parentId, null);
    const child = await s.appendMessage(msg("c"), { parentId: "a" });
    assert.equal(child.parentId, "a");
    const unknown = await s.appendMessage(msg("d"), { parentId: "nope" });
    assert.equal(unknown.parentId, null, "an unknown parent id makes a root, as upstream");
  });

  test("a duplicate id writes nothing and returns the stored message", async () => {
    const s = client.object(freshKey()).session();
    await s.appendMessage(msg("a", "original"));
    const dup = await s.appendMessage(msg("a", "changed"));
    assert.equal(dup.inserted, false);
    assert.deepEqual(dup.message, msg("a", "original"));
    assert.deepEqual(await s.getHistory(), [msg("a", "original")]);
  });

  test("a compaction overlay id is not written (inserted=false, as upstream)", async () => {
    const s = client.object(freshKey()).session();
    const r = await s.appendMessage(msg("compaction_x"));
    assert.equal(r.inserted, false);
    assert.equal(r.message.id, "compaction_x");
    assert.equal(await s.getLatestLeaf(), null);
  });

  test("JSON text is sent as is", async () => {
    const s = client.object(freshKey()).session();
    const r = await s.appendMessage('{"id":"t","role":"user","parts":[],"n":1}');
    assert.deepEqual(r.message, { id: "t", role: "user", parts: [], n: 1 });
  });

  test('source "client" strips reserved metadata keys, "server" keeps them', async () => {
    const s = client.object(freshKey()).session();
    const fromClient = await s.appendMessage({ ...msg("c"), metadata: { secret: 1, keep: 2 } }, { source: "client" });
    assert.deepEqual(fromClient.message["metadata"], { keep: 2 });
    const fromServer = await s.appendMessage({ ...msg("s"), metadata: { secret: 1 } });
    assert.deepEqual(fromServer.message["metadata"], { secret: 1 });
  });

  test("sessions and objects are isolated", async () => {
    const key = freshKey();
    await client.object(key).session("one").appendMessage(msg("a"));
    assert.equal(await client.object(key).session("two").getMessage("a"), null);
    assert.equal(await client.object(freshKey()).session("one").getMessage("a"), null);
  });
});

describe("appendMessages", () => {
  test("appends a chain in one call; parentId applies to the first", async () => {
    const s = client.object(freshKey()).session();
    await s.appendMessage(msg("x"));
    const results = await s.appendMessages([msg("a"), msg("b"), msg("c")], { parentId: null });
    assert.deepEqual(
      results.map((r) => [r.inserted, r.message.id, r.parentId]),
      [
        [true, "a", null],
        [true, "b", "a"],
        [true, "c", "b"],
      ],
    );
    const again = await s.appendMessages([msg("c"), msg("d")]);
    assert.deepEqual(
      again.map((r) => [r.inserted, r.message.id]),
      [
        [false, "c"],
        [true, "d"],
      ],
    );
  });

  test("is one transaction: a bad item stores nothing", async () => {
    const s = client.object(freshKey()).session();
    await assert.rejects(s.appendMessages([msg("a"), '{"id":"b"'] as never), (e: unknown) => {
      assert.ok(e instanceof SessionsError);
      assert.equal(e.code, "INVALID_ARGUMENT");
      assert.equal(e.reason, "INVALID_JSON");
      return true;
    });
    assert.equal(await s.getMessage("a"), null);
  });
});

describe("update, upsert, delete, clear", () => {
  test("updateMessage replaces content, keeps the parent; null for a missing id", async () => {
    const s = client.object(freshKey()).session();
    await s.appendMessages([msg("a"), msg("b")]);
    const updated = await s.updateMessage(msg("b", "new text"));
    assert.deepEqual(updated, msg("b", "new text"));
    assert.deepEqual(await s.getMessage("b"), msg("b", "new text"));
    assert.deepEqual((await s.getHistory()).map((m) => m.id), ["a", "b"]);
    assert.equal(await s.updateMessage(msg("zzz")), null);
  });

  test("upsertMessage inserts new ids and updates existing ones without re-parenting", async () => {
    const s = client.object(freshKey()).session();
    await s.appendMessages([msg("a"), msg("b")]);
    const inserted = await s.upsertMessage(msg("c"), { parentId: "a" });
    assert.deepEqual([inserted.inserted, inserted.changed], [true, false]);
    const changed = await s.upsertMessage(msg("b", "v2"), { parentId: null });
    assert.deepEqual([changed.inserted, changed.changed], [false, true]);
    assert.deepEqual(changed.message, msg("b", "v2"));
    const same = await s.upsertMessage(msg("b", "v2"));
    assert.deepEqual([same.inserted, same.changed], [false, false]);
    assert.deepEqual((await s.getHistory({ leafId: "b" })).map((m) => m.id), ["a", "b"]);
    assert.deepEqual((await s.getBranches("a")).map((m) => m.id), ["b", "c"]);
  });

  test("deleteMessages re-parents children; clearMessages empties the session", async () => {
    const s = client.object(freshKey()).session();
    await s.appendMessages([msg("a"), msg("b"), msg("c")]);
    assert.equal(await s.deleteMessages(["b", "unknown"]), 1);
    assert.deepEqual((await s.getHistory()).map((m) => m.id), ["a", "c"]);
    assert.equal(await s.clearMessages(), 2);
    assert.deepEqual(await s.getHistory(), []);
    assert.equal(await s.getLatestLeaf(), null);
  });
});

describe("importMessages", () => {
  test("plain messages chain; existing ids are skipped", async () => {
    const s = client.object(freshKey()).session("imp");
    const result = await s.importMessages([msg("a"), msg("b"), msg("c")]);
    assert.deepEqual(result, { imported: 3, skipped: 0 });
    assert.deepEqual((await s.getHistory()).map((m) => m.id), ["a", "b", "c"]);
    const again = await s.importMessages([msg("c"), msg("d")]);
    assert.deepEqual(again, { imported: 1, skipped: 1 });
  });

  test("explicit items keep parent and created time verbatim; async iterables work", async () => {
    const s = client.object(freshKey()).session();
    async function* items() {
      yield new ImportItem(msg("r1"), null, new Date("2024-01-01T00:00:00Z"));
      yield { message: msg("r2"), parentId: null, createdAt: 1_700_000_000_000 };
      yield { message: msg("k"), parentId: "r1" };
    }
    assert.deepEqual(await s.importMessages(items()), { imported: 3, skipped: 0 });
    assert.deepEqual((await s.getBranches("r1")).map((m) => m.id), ["k"]);
    assert.equal(await s.importMessage(msg("solo"), { parentId: "r2" }), true);
    assert.equal(await s.importMessage(msg("solo"), { parentId: "r2" }), false);
  });

  test("an array goes packed and an iterable a message a frame; both import the same chain", async () => {
    const messages = Array.from({ length: 2500 }, (_, i) => ({
      id: `p${String(i).padStart(4, "0")}`,
      role: "user",
      parts: [{ type: "text", text: (i === 1200 ? "x" : "t").repeat(i === 1200 ? 400_000 : 1_000) }],
    }));
    const ids = messages.map((m) => m.id);
    const packed = client.object(freshKey()).session();
    assert.deepEqual(await packed.importMessages(messages), { imported: 2500, skipped: 0 });
    const streamed = client.object(freshKey()).session();
    function* one() {
      yield* messages;
    }
    assert.deepEqual(await streamed.importMessages(one()), { imported: 2500, skipped: 0 });
    for (const s of [packed, streamed]) {
      assert.deepEqual((await s.getHistory()).map((m) => m.id), ids);
    }
  });

  test("an empty import succeeds; a bad message fails with INVALID_MESSAGE", async () => {
    const s = client.object(freshKey()).session();
    assert.deepEqual(await s.importMessages([]), { imported: 0, skipped: 0 });
    await assert.rejects(s.importMessages([{ id: "x", role: "user" }]), (e: unknown) => {
      assert.ok(e instanceof SessionsError);
      assert.equal(e.code, "INVALID_ARGUMENT");
      assert.equal(e.reason, "INVALID_MESSAGE");
      return true;
    });
  });
});

describe("routing metadata", () => {
  test("keys are percent-encoded like Python's quote(safe='')", () => {
    assert.equal(encodeObjectKey("a b/c?é!*'()~_-."), "a%20b%2Fc%3F%C3%A9%21%2A%27%28%29~_-.");
    assert.deepEqual(routingHeaders("k/1"), { "x-object-key": "k%2F1" });
  });

  test("unusual object keys round-trip through the header check", async () => {
    const key = `tenant/élan 🧪 ${freshKey()}?x=1&y=%41`;
    const s = client.object(key).session();
    assert.equal((await s.appendMessage(msg("a"))).inserted, true);
    assert.deepEqual(await s.getMessage("a"), msg("a"));
  });

  test("a header that differs from object_key is refused with OBJECT_KEY_MISMATCH", async () => {
    const request = create(AppendMessageRequestSchema, {
      objectKey: "one",
      messageJson: JSON.stringify(msg("a")),
      parentMode: ParentMode.AUTO,
    });
    await assert.rejects(
      client.call("AppendMessage", "two", (o) => client.rpc.appendMessage(request, o)),
      (e: unknown) => {
        assert.ok(e instanceof SessionsError);
        assert.equal(e.code, "INVALID_ARGUMENT");
        assert.equal(e.reason, "OBJECT_KEY_MISMATCH");
        assert.equal(e.domain, "sessions.v1");
        return true;
      },
    );
  });

  test("every call carries x-object-key; a token is sent as a bearer authorization header", async () => {
    const seen: [string, string | null, string | null][] = [];
    const spy: Interceptor = (next) => (req) => {
      seen.push([req.method.name, req.header.get("x-object-key"), req.header.get("authorization")]);
      return next(req);
    };
    const withToken = server.client({ token: "t0k3n", timeoutMs: 30_000, interceptors: [spy] });
    const key = `k/${freshKey()} ü`;
    const s = withToken.object(key).session();
    assert.equal((await s.appendMessage(msg("a"))).inserted, true);
    await s.getHistory();
    await s.importMessages([msg("b")]);
    await s.appendMessage({ ...msg("big"), pad: "p".repeat(3 * 1024 * 1024) });
    await s.getMessage("big"); // the append needs no read back: its JSON is stored as sent
    assert.deepEqual(
      seen.map(([method]) => method),
      ["AppendMessage", "StreamHistory", "ImportMessages", "UploadMessage", "GetMessage"],
    );
    for (const [, header, auth] of seen) {
      assert.equal(header, encodeObjectKey(key));
      assert.equal(decodeURIComponent(header!), key);
      assert.equal(auth, "Bearer t0k3n");
    }
  });
});

test("what an import's items throw while the stream is sent is thrown as itself, not as INTERNAL", async () => {
  // Connect reported the caller's error as SessionsError INTERNAL, a status no server sent.
  const s = client.object(freshKey()).session();
  const broken = new Error("the source server went away");
  async function* source() {
    yield msg("a");
    throw broken;
  }
  await assert.rejects(s.importMessages(source()), (error: unknown) => error === broken);
  const unserializable = { ...msg("b"), count: 1n };
  await assert.rejects(s.importMessages([msg("c"), unserializable]), TypeError);
  assert.equal(await s.getMessage("c"), null);
  assert.equal((await s.importMessages([msg("d")])).imported, 1); // the client goes on
});

test("message JSON with a lone UTF-16 surrogate is refused before it is sent", async () => {
  // Encoded to UTF-8 it became U+FFFD: stored so, while the write answered with the text as given.
  const s = client.object(freshKey()).session();
  for (const text of ['{"id":"a","role":"user","parts":[{"type":"text","text":"A\ud800B"}]}', `{"id":"a","role":"user","parts":[{"type":"text","text":"${"x".repeat(4 << 20)}\udc00"}]}`]) {
    await assert.rejects(s.appendMessage(text), (error: unknown) => {
      assert.equal((error as { code: string }).code, "INVALID_ARGUMENT");
      assert.equal((error as { reason: string }).reason, "INVALID_JSON");
      return true;
    });
  }
  assert.equal(await s.getMessage("a"), null);
  const escaped = await s.appendMessage('{"id":"a","role":"user","parts":[{"type":"text","text":"A\\ud800B"}]}');
  assert.ok(escaped.inserted); // the same surrogate, escaped, is JSON's to carry
});
