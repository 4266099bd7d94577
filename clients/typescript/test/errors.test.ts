import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { SessionsClient, SessionsError } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;
let client: SessionsClient;

before(async () => {
  server = await TestServer.start();
  client = server.client();
});
after(async () => {
  await server?.stop();
});

function expectError(code: string, reason: string, field?: string) {
  return (e: unknown) => {
    assert.ok(e instanceof SessionsError, `expected SessionsError, got ${String(e)}`);
    assert.equal(e.code, code);
    assert.equal(e.reason, reason);
    assert.equal(e.domain, "sessions.v1");
    if (field !== undefined) assert.equal(e.metadata["field"], field);
    assert.match(e.message, new RegExp(`^${code}: `));
    return true;
  };
}

test("invalid JSON text is INVALID_ARGUMENT / INVALID_JSON", async () => {
  const s = client.object(freshKey()).session();
  await assert.rejects(s.appendMessage('{"id": "a", '), expectError("INVALID_ARGUMENT", "INVALID_JSON", "message_json"));
  await assert.rejects(s.upsertMessage("not json"), expectError("INVALID_ARGUMENT", "INVALID_JSON"));
  await assert.rejects(s.updateMessage("[1,"), expectError("INVALID_ARGUMENT", "INVALID_JSON"));
  await assert.rejects(s.importMessages(["{bad"]), expectError("INVALID_ARGUMENT", "INVALID_JSON"));
});

test("JSON that is not a message is INVALID_ARGUMENT / INVALID_MESSAGE", async () => {
  const s = client.object(freshKey()).session();
  await assert.rejects(s.appendMessage({ id: "a", role: "user" }), expectError("INVALID_ARGUMENT", "INVALID_MESSAGE"));
  await assert.rejects(s.appendMessage({ id: 1, role: "user", parts: [] }), expectError("INVALID_ARGUMENT", "INVALID_MESSAGE"));
  await assert.rejects(s.appendMessage({ id: "a", role: "user", parts: [1] }), expectError("INVALID_ARGUMENT", "INVALID_MESSAGE"));
  await assert.rejects(s.appendMessage("[]"), expectError("INVALID_ARGUMENT", "INVALID_MESSAGE"));
  await assert.rejects(s.updateMessage({ role: "user", parts: [] }), expectError("INVALID_ARGUMENT", "INVALID_MESSAGE"));
  assert.equal(await s.getLatestLeaf(), null, "nothing was written");
});

test("bad input over the UploadMessage path (> 3 MiB) carries the same reasons", async () => {
  const s = client.object(freshKey()).session();
  const big = "x".repeat(4 * 1024 * 1024);
  await assert.rejects(s.appendMessage(`{"id":"a","role":"user","parts":[],"pad":"${big}"`), expectError("INVALID_ARGUMENT", "INVALID_JSON"));
  await assert.rejects(s.appendMessage({ id: "a", role: "user", parts: "no", pad: big }), expectError("INVALID_ARGUMENT", "INVALID_MESSAGE"));
});

test("a key longer than the server takes is INVALID_OBJECT_KEY whatever its header's size, never retried", async () => {
  // Node sent no header block past 64 KiB, and gRPC refused one past 36 KiB: both failed as a
  // stream the server refused (UNAVAILABLE), retried as an outage.
  const retries: string[] = [];
  const watched = new SessionsClient(server.address, { onRetry: (n) => void retries.push(n.method) });
  try {
    for (const [key, words] of [
      ["中".repeat(4_200), "object_key is 12600 bytes; the limit is 1024 bytes"],
      ["😀".repeat(16_384), "object_key is 65536 bytes; the limit is 1024 bytes"],
      ["k".repeat(300_000), "object_key is 300000 bytes; no server takes more than 65536 bytes"],
    ] as const) {
      await assert.rejects(watched.object(key).session().appendMessage(msg("a")), (e: unknown) => {
        expectError("INVALID_ARGUMENT", "INVALID_OBJECT_KEY", "object_key")(e);
        assert.ok((e as SessionsError).rawMessage.startsWith(words), (e as SessionsError).rawMessage);
        return true;
      });
      await assert.rejects(watched.object(key).session().getHistory(), expectError("INVALID_ARGUMENT", "INVALID_OBJECT_KEY"));
    }
    assert.deepEqual(retries, []);
  } finally {
    watched.close();
  }
});

test("an invalid object key is INVALID_ARGUMENT / INVALID_OBJECT_KEY", async () => {
  await assert.rejects(client.object("").session().appendMessage(msg("a")), expectError("INVALID_ARGUMENT", "INVALID_OBJECT_KEY"));
  await assert.rejects(client.object("a\u0001b").session().getMessage("a"), expectError("INVALID_ARGUMENT", "INVALID_OBJECT_KEY"));
  await assert.rejects(client.object("k".repeat(5000)).session().getHistory(), expectError("INVALID_ARGUMENT", "INVALID_OBJECT_KEY"));
});

test("non-serializable input fails locally with a TypeError", async () => {
  const s = client.object(freshKey()).session();
  await assert.rejects(s.appendMessage(undefined as never), TypeError);
  await assert.rejects(s.appendMessage(msg("a"), { parentId: 5 as never }), TypeError);
  await assert.rejects(s.appendMessage(msg("a"), { source: "robot" as never }), TypeError);
});

test("an unreachable server is UNAVAILABLE", async () => {
  const { SessionsClient } = await import("../src/index.js");
  const dead = new SessionsClient("127.0.0.1:1");
  try {
    await assert.rejects(dead.object("k").session().getMessage("a"), (e: unknown) => {
      assert.ok(e instanceof SessionsError);
      assert.equal(e.code, "UNAVAILABLE");
      return true;
    });
  } finally {
    dead.close();
  }
});

test("pieces() cuts on UTF-8 boundaries and loses nothing", async () => {
  const { pieces } = await import("../src/index.js");
  const text = "a🙂漢é".repeat(1000);
  for (const size of [4, 5, 7, 64, 1000]) {
    const parts = [...pieces(text, size)];
    assert.equal(parts.join(""), text);
    for (const part of parts) {
      assert.ok(Buffer.byteLength(part, "utf8") <= size);
      assert.ok(!part.includes("\uFFFD"));
    }
  }
  assert.deepEqual([...pieces("", 4)], [""]);
  assert.throws(() => [...pieces("🙂🙂", 3)], RangeError);
});
