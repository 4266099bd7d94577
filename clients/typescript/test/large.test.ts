import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";
import { routingHeaders, type SessionsClient } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;
let client: SessionsClient;
const methods: string[] = [];
/** Unary requests as sent, with their method's name. */
const unaryRequests: Array<{ method: string; message: { omitJsonAsSent?: boolean } }> = [];

before(async () => {
  server = await TestServer.start();
  const record: Interceptor = (next) => (req) => {
    methods.push(req.method.name);
    if (!req.stream) unaryRequests.push({ method: req.method.name, message: req.message as { omitJsonAsSent?: boolean } });
    return next(req);
  };
  client = server.client({ interceptors: [record] });
});
after(async () => {
  await server?.stop();
});

const MiB = 1024 * 1024;

/** About `bytes` UTF-8 bytes of mixed ASCII, CJK, emoji (astral) and escapes-needing text. */
function bigText(bytes: number, seed: string): string {
  const unit = `${seed} 汉字かな한국어 🙂🚀👩‍💻 é ß "quote" \\ tab\t newline\n ∑≈ `;
  const unitBytes = Buffer.byteLength(unit, "utf8");
  return unit.repeat(Math.ceil(bytes / unitBytes));
}

function bigMessage(id: string, bytes: number) {
  return { id, role: "assistant", parts: [{ type: "text", text: bigText(bytes, id) }], metadata: { n: 1, z: [1.5, true, null] } };
}

test("a 20 MB message round-trips byte-exact through every read", async () => {
  const s = client.object(freshKey()).session("big");
  await s.appendMessage(msg("before"));
  const big = bigMessage("big", 20 * 1000 * 1000);
  const text = JSON.stringify(big);
  assert.ok(Buffer.byteLength(text, "utf8") >= 20 * 1000 * 1000);

  methods.length = 0;
  const appended = await s.appendMessage(big);
  assert.ok(methods.includes("UploadMessage"), `large writes use UploadMessage, saw ${methods.join(",")}`);
  assert.ok(!methods.includes("AppendMessage"));
  assert.equal(appended.inserted, true);
  assert.equal(appended.parentId, "before");
  assert.equal(JSON.stringify(appended.message), text);

  // Raw frames: more than one piece, none above 4 MiB, and their concatenation is the exact text.
  const frames: { json: string; more: boolean; hasInfo: boolean }[] = [];
  for await (const r of client.rpc.getMessage(
    { objectKey: s.key, sessionId: s.id, messageId: "big" },
    { headers: routingHeaders(s.key) },
  )) {
    frames.push({ json: r.frame!.json, more: r.frame!.morePieces, hasInfo: r.frame!.info !== undefined });
  }
  assert.ok(frames.length >= 5, `expected pieces, got ${frames.length} frame(s)`);
  assert.ok(frames.every((f) => Buffer.byteLength(f.json, "utf8") <= 4 * MiB));
  assert.deepEqual(
    frames.map((f) => f.more),
    [...Array(frames.length - 1).fill(true), false],
  );
  assert.equal(frames[0]!.hasInfo, true);
  assert.equal(frames.map((f) => f.json).join(""), text, "byte-exact");

  assert.equal(JSON.stringify(await s.getMessage("big")), text);
  const [got, missing, before] = await s.getMessages(["big", "missing", "before"]);
  assert.equal(JSON.stringify(got), text);
  assert.equal(missing, null);
  assert.deepEqual(before, msg("before"));
  assert.equal(JSON.stringify(await s.getLatestLeaf()), text);
  assert.equal(JSON.stringify((await s.getBranches("before"))[0]), text);
  const history = await s.getHistory();
  assert.deepEqual(history.map((m) => m.id), ["before", "big"]);
  assert.equal(JSON.stringify(history[1]), text);
  const batches: string[][] = [];
  for await (const batch of s.historyBatches({ batchSize: 10 })) batches.push(batch.map((m) => JSON.stringify(m)));
  assert.equal(batches.flat()[1], text);
  const recent = await s.getRecentHistory(1);
  assert.equal(recent.truncated, true);
  assert.equal(recent.messages.length, 1);
  assert.equal(JSON.stringify(recent.messages[0]), text);
  const stats = await s.getHistoryRowStats();
  assert.ok(stats[1]!.bytes >= Buffer.byteLength(text, "utf8"));
});

test("large update, upsert and import go through pieces too", async () => {
  const s = client.object(freshKey()).session();
  const small = msg("u");
  await s.appendMessage(small);

  const updatedBig = bigMessage("u", 5 * MiB);
  methods.length = 0;
  const updated = await s.updateMessage(updatedBig);
  // UploadMessage only: the stored JSON, too large for the response (json_omitted), is the JSON sent (json_as_sent).
  assert.deepEqual(methods, ["UploadMessage"]);
  assert.ok(!methods.includes("UpdateMessage"));
  assert.equal(JSON.stringify(updated), JSON.stringify(updatedBig));
  assert.equal(await s.updateMessage(bigMessage("absent", 4 * MiB)), null);

  const upserted = await s.upsertMessage(bigMessage("v", 4 * MiB), { parentId: null });
  assert.deepEqual([upserted.inserted, upserted.changed], [true, false]);
  assert.equal((await s.getHistory({ leafId: "v" })).length, 1, "a root");
  const again = await s.upsertMessage(bigMessage("v", 6 * MiB));
  assert.deepEqual([again.inserted, again.changed], [false, true]);

  const target = client.object(freshKey()).session("copy");
  const imported = bigMessage("imp", 9 * MiB);
  methods.length = 0;
  assert.deepEqual(await target.importMessages([msg("first"), imported, msg("last")]), { imported: 3, skipped: 0 });
  assert.deepEqual(methods, ["ImportMessages"]);
  const copy = await target.getHistory();
  assert.deepEqual(copy.map((m) => m.id), ["first", "imp", "last"]);
  assert.equal(JSON.stringify(copy[1]), JSON.stringify(imported));
});

test("a large written message is read back only when the server changed it", async () => {
  const s = client.object(freshKey()).session();
  const kept = msg("kept", "k".repeat(5_000_000));
  methods.length = 0;
  const appended = await s.appendMessage(kept);
  assert.deepEqual(appended.message, kept);
  assert.deepEqual(methods, ["UploadMessage"], "stored as sent: no GetMessage");

  // The server strips OpenAI's ephemeral item id: the stored form differs from what was sent.
  const stored = msg("changed", "c".repeat(5_000_000));
  const sent = { ...stored, parts: [{ ...stored.parts[0]!, providerMetadata: { openai: { itemId: "item_1" } } }] };
  methods.length = 0;
  const changed = await s.appendMessage(sent);
  assert.deepEqual(changed.message, stored);
  assert.deepEqual(methods, ["UploadMessage", "GetMessage"], "changed: read back once");

  // Unary paths too: AppendMessages carries each item's JSON by position.
  const a = msg("a", "a".repeat(3_000_000));
  const b = msg("b", "b".repeat(3_000_000));
  methods.length = 0;
  const results = await s.appendMessages([a, b]);
  assert.deepEqual(results.map((r) => r.message), [a, b]);
  assert.deepEqual(methods, ["AppendMessages"]);
});

test("a batch's changed JSON without room in the answer is read back in one call", async () => {
  const s = client.object(freshKey()).session();
  const stored = Array.from({ length: 1500 }, (_, i) => msg(`s${String(i).padStart(4, "0")}`, "x".repeat(2500), "assistant"));
  const sent = stored.map((m) => ({ ...m, parts: [{ ...m.parts[0]!, providerMetadata: { openai: { itemId: "item_1" } } }] }));
  methods.length = 0;
  const results = await s.appendMessages(sent);
  assert.deepEqual(results.map((r) => r.message), stored);
  assert.deepEqual(methods, ["AppendMessages", "GetMessages"], "about 3.9 MB of changed JSON: one read back");
});

test("writes ask the server to leave out JSON stored as sent, and take a changed message whole", async () => {
  const s = client.object(freshKey()).session();
  const stored = msg("s", "reply", "assistant");
  const sent = { ...stored, parts: [{ ...stored.parts[0]!, providerMetadata: { openai: { itemId: "item_1" } } }] };
  methods.length = 0;
  unaryRequests.length = 0;
  assert.deepEqual((await s.appendMessage(msg("a"))).message, msg("a"));
  assert.deepEqual((await s.appendMessage(sent)).message, stored); // inline: no read back
  const results = await s.appendMessages([msg("b"), msg("c")]);
  assert.deepEqual(results.map((r) => r.message), [msg("b"), msg("c")]);
  assert.deepEqual(await s.updateMessage(msg("a", "new")), msg("a", "new"));
  assert.deepEqual((await s.upsertMessage(msg("d"))).message, msg("d"));
  const writes = ["AppendMessage", "AppendMessage", "AppendMessages", "UpdateMessage", "UpsertMessage"];
  assert.deepEqual(methods, writes, "no GetMessage");
  assert.deepEqual(
    unaryRequests.map((r) => [r.method, r.message.omitJsonAsSent]),
    writes.map((w) => [w, true]),
  );
});
