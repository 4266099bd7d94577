// The wrappers of search, compaction and attachments, and attachment pointers on every read and
// on the change feed, against a real server (and, for the server's own summarizer, a second one
// run with --summarizer-url pointing at a stub of an OpenAI-compatible API in this process).
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";
import {
  SessionsError,
  type ChangeEvent,
  type Message,
  type SearchResult,
  type SessionHandle,
  type SessionsClient,
} from "../src/index.js";
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

function expectFailure(code: string, reason: string | null) {
  return (e: unknown) => {
    assert.ok(e instanceof SessionsError, `expected SessionsError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    assert.equal(e.reason, reason, e.message);
    return true;
  };
}

async function drain<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}

/** The request of each call (of a streaming one, its first), as sent, in call order; by an interceptor. */
function requestLog(): { requests: { method: string; message: unknown }[]; interceptor: Interceptor } {
  const requests: { method: string; message: unknown }[] = [];
  return {
    requests,
    interceptor: (next) => async (req) => {
      const entry: { method: string; message: unknown } = { method: req.method.name, message: undefined };
      requests.push(entry);
      if (!req.stream) {
        entry.message = req.message;
        return next(req);
      }
      const sent = req.message;
      async function* tap() {
        for await (const message of sent) {
          entry.message ??= message;
          yield message;
        }
      }
      return next({ ...req, message: tap() } as typeof req);
    },
  };
}

/** Reads events until one of type `type` arrives (PROGRESS skipped unless asked for), with a deadline. */
async function nextOfType(iterator: AsyncIterator<ChangeEvent>, type: string, timeoutMs = 15_000): Promise<ChangeEvent> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const remaining = deadline - Date.now();
    if (remaining <= 0) throw new Error(`no ${type} event within ${timeoutMs} ms`);
    let timer: NodeJS.Timeout | undefined;
    const next = await Promise.race([
      iterator.next(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no ${type} event within ${timeoutMs} ms`)), remaining);
      }),
    ]).finally(() => clearTimeout(timer));
    assert.ok(!next.done, `the feed ended before a ${type} event`);
    if (next.value.type === type) return next.value;
  }
}

// ── attachments and pointers ────────────────────────────────────────────────

const payload = Buffer.alloc(32 * 1024);
for (let i = 0; i < payload.length; i++) payload[i] = [0x89, 0x50, 0x4e, 0x47, 0, 1, 2, 3][i % 8]!;
const dataUrl = `data:image/png;base64,${payload.toString("base64")}`;
const POINTER = /^attachment:sha256:([0-9a-f]{64})$/;

function image(id: string): Message {
  return { id, role: "user", parts: [{ type: "text", text: `picture ${id}` }, { type: "file", mediaType: "image/png", url: dataUrl }] };
}

/** The `url` of a message's file part. */
function fileUrl(message: Message | null | undefined): string {
  assert.ok(message, "a message");
  const part = message.parts.find((p) => (p as { type?: string }).type === "file") as { url?: string } | undefined;
  assert.ok(part?.url !== undefined, `a file part in ${JSON.stringify(message).slice(0, 200)}`);
  return part.url;
}

function assertPointer(message: Message | null | undefined, what: string): string {
  const url = fileUrl(message);
  const match = POINTER.exec(url);
  assert.ok(match, `${what}: a pointer, got ${url.slice(0, 60)}`);
  return match[1]!;
}

describe("attachments", () => {
  test("pointers: true leaves pointers on every read; by default payloads come back inline", async () => {
    const o = client.object(freshKey("att"));
    const s = o.session("s");
    await s.appendMessage(msg("root"));
    await s.appendMessage(image("img1"));
    await s.appendMessage(image("img2"));
    const inline = [msg("root"), image("img1"), image("img2")];

    // Inline (the default, and pointers: false): exactly what was written.
    assert.deepEqual(await s.getMessage("img1"), image("img1"));
    assert.deepEqual(await s.getMessage("img1", { pointers: false }), image("img1"));
    assert.deepEqual(await s.getMessages(["img1", "img2"]), [image("img1"), image("img2")]);
    assert.deepEqual(await s.getLatestLeaf(), image("img2"));
    assert.deepEqual(await s.getBranches("img1"), [image("img2")]);
    assert.deepEqual(await s.getHistory(), inline);
    assert.deepEqual(await drain(s.history({ newestFirst: true })), [...inline].reverse());
    assert.deepEqual((await drain(s.historyBatches({ batchSize: 2 }))).flat(), inline);
    assert.deepEqual((await s.getRecentHistory(1 << 20)).messages, inline);

    // Pointers: every read that returns messages.
    const hash = assertPointer(await s.getMessage("img1", { pointers: true }), "getMessage");
    const [p1, p2, missing] = await s.getMessages(["img1", "img2", "nope"], { pointers: true });
    assert.equal(assertPointer(p1, "getMessages"), hash, "the same payload, the same hash");
    assert.equal(assertPointer(p2, "getMessages"), hash);
    assert.equal(missing, null);
    assertPointer(await s.getLatestLeaf({ pointers: true }), "getLatestLeaf");
    const [branch] = await s.getBranches("img1", { pointers: true });
    assertPointer(branch, "getBranches");
    for (const [name, messages] of [
      ["getHistory", await s.getHistory({ pointers: true })],
      ["history", await drain(s.history({ pointers: true, newestFirst: true, limit: 2 }))],
      ["historyBatches", (await drain(s.historyBatches({ pointers: true, batchSize: 1 }))).flat()],
      ["getRecentHistory", (await s.getRecentHistory(1 << 20, { pointers: true })).messages],
    ] as const) {
      const images = messages.filter((m) => m.id.startsWith("img"));
      assert.equal(images.length, 2, name);
      for (const m of images) assert.equal(assertPointer(m, name), hash, name);
      // Only the payload differs: the rest of the message is as written.
      const [first] = images;
      const restored = { ...first!, parts: first!.parts.map((p) => ((p as { type?: string }).type === "file" ? { ...(p as object), url: dataUrl } : p)) };
      assert.deepEqual(restored, image(first!.id), name);
    }

    // The payload, by its hash: bytes and media type as written, once for both messages.
    const attachment = await o.readAttachment(hash);
    assert.equal(attachment.hash, hash);
    assert.equal(attachment.mediaType, "image/png");
    assert.ok(Buffer.from(attachment.data).equals(payload), "the payload's bytes");
    const stats = await o.getObjectStats();
    assert.equal(stats.attachmentCount, 1);
    assert.equal(stats.attachmentBytes, payload.length);
  });

  test("readAttachment of a hash the object does not hold fails NOT_FOUND", async () => {
    const o = client.object(freshKey("att-missing"));
    await o.session().appendMessage(msg("a"));
    await assert.rejects(o.readAttachment("0".repeat(64)), (e: unknown) => {
      assert.ok(e instanceof SessionsError);
      assert.equal(e.code, "NOT_FOUND");
      return true;
    });
  });

  test("readAttachment joins a payload the server sends in several frames", async () => {
    const o = client.object(freshKey("att-big"));
    const big = Buffer.alloc(5 * 1024 * 1024); // 5 MiB: frames of at most 3 MiB
    for (let i = 0; i < big.length; i++) big[i] = (i * 7 + (i >> 12)) & 0xff;
    const message = { id: "big", role: "user", parts: [{ type: "file", mediaType: "application/octet-stream", url: `data:application/octet-stream;base64,${big.toString("base64")}` }] };
    await o.session().appendMessage(message);
    const hash = assertPointer(await o.session().getMessage("big", { pointers: true }), "getMessage");
    const attachment = await o.readAttachment(hash);
    assert.equal(attachment.mediaType, "application/octet-stream");
    assert.equal(attachment.data.length, big.length);
    assert.ok(Buffer.from(attachment.data).equals(big), "5 MiB joined byte-exact");
    assert.deepEqual(await o.session().getMessage("big"), message, "inline by default");
  });

  test("subscribe({ pointers: true }) delivers events with pointers; by default inline", async () => {
    const o = client.object(freshKey("att-feed"));
    const s = o.session("s");
    const withPointers = s.subscribe({ pointers: true, includeProgress: true })[Symbol.asyncIterator]();
    const inline = s.subscribe({ includeProgress: true })[Symbol.asyncIterator]();
    try {
      // A live feed opens with a PROGRESS: from then on no write is missed.
      assert.equal((await withPointers.next()).value?.type, "PROGRESS");
      assert.equal((await inline.next()).value?.type, "PROGRESS");
      await s.appendMessage(image("img"));
      await s.updateMessage({ ...image("img"), edited: true });

      const appended = await nextOfType(withPointers, "APPEND");
      const hash = assertPointer(appended.message, "APPEND event");
      assert.equal(assertPointer((await nextOfType(withPointers, "UPDATE")).message, "UPDATE event"), hash);
      assert.deepEqual((await nextOfType(inline, "APPEND")).message, image("img"));
      assert.deepEqual((await nextOfType(inline, "UPDATE")).message, { ...image("img"), edited: true });
      assert.ok(Buffer.from((await o.readAttachment(hash)).data).equals(payload));
    } finally {
      await withPointers.return?.(undefined);
      await inline.return?.(undefined);
    }
  });

  test("every read sends attachments: POINTER with pointers, else INLINE", async () => {
    const { requests, interceptor } = requestLog();
    const logged = server.client({ interceptors: [interceptor] });
    const o = logged.object(freshKey("att-wire"));
    const s = o.session();
    await s.appendMessage(image("img"));
    for (const pointers of [true, false]) {
      requests.length = 0;
      await s.getMessage("img", { pointers });
      await s.getMessages(["img"], { pointers });
      await s.getLatestLeaf({ pointers });
      await s.getBranches("img", { pointers });
      await s.getHistory({ pointers });
      await drain(s.historyBatches({ pointers }));
      await s.getRecentHistory(1000, { pointers });
      const feed = s.subscribe({ pointers, includeProgress: true })[Symbol.asyncIterator]();
      await feed.next();
      await feed.return?.(undefined);
      assert.deepEqual(
        requests.map((r) => [r.method, (r.message as { attachments?: number }).attachments]),
        [
          "GetMessage",
          "GetMessages",
          "GetLatestLeaf",
          "GetBranches",
          "StreamHistory",
          "StreamHistory",
          "GetRecentHistory",
          "Subscribe",
        ].map((method) => [method, pointers ? 2 : 1]),
      );
    }
  });
});

// ── search ──────────────────────────────────────────────────────────────────

describe("search", () => {
  test("phrase (default) and all_words, this session or all, with a limit", async () => {
    const o = client.object(freshKey("search"));
    const s = o.session("s");
    await s.appendMessage(msg("fox", "the quick brown fox jumps"));
    await s.appendMessage(msg("dog", "a lazy dog sleeps", "assistant"));
    await o.session("other").appendMessage(msg("fox2", "another quick brown fox"));

    const hits = await s.search("quick brown");
    assert.equal(hits.length, 1);
    assert.deepEqual({ ...hits[0]!, content: undefined }, { id: "fox", role: "user", sessionId: "s", content: undefined });
    assert.ok(hits[0]!.content.includes("quick brown fox"), hits[0]!.content);
    assert.deepEqual(await s.search("brown quick"), [], "a phrase is in order");
    assert.deepEqual(await s.search("brown quick", { mode: "phrase" }), []);
    assert.deepEqual((await s.search("brown quick", { mode: "all_words" })).map((h) => h.id), ["fox"]);
    assert.deepEqual((await s.search("dog")).map((h) => [h.id, h.role]), [["dog", "assistant"]]);
    const everywhere = await s.search("quick", { allSessions: true });
    assert.deepEqual(everywhere.map((h) => `${h.sessionId}/${h.id}`).sort(), ["other/fox2", "s/fox"]);
    assert.equal((await s.search("quick", { allSessions: true, limit: 1 })).length, 1);
    assert.deepEqual(await s.search("quick", { allSessions: true, limit: 0 }), [], "0 returns none, as upstream");
    assert.deepEqual(await s.search("nowhere"), []);
  });

  test("the default limit is 20, hits come packed, and a hit sent in pieces is joined", async () => {
    const { requests, interceptor } = requestLog();
    const logged = server.client({ interceptors: [interceptor] });
    const s = logged.object(freshKey("search-packed")).session("s");
    await s.appendMessages(Array.from({ length: 30 }, (_, i) => msg(`p${String(i).padStart(2, "0")}`, `packed hit ${i}`)));
    requests.length = 0;
    const hits: SearchResult[] = await s.search("packed");
    assert.equal(hits.length, 20, "upstream's default limit");
    assert.equal(new Set(hits.map((h) => h.id)).size, 20);
    for (const hit of hits) {
      assert.match(hit.id, /^p\d\d$/);
      assert.equal(hit.sessionId, "s");
      assert.match(hit.content, /^packed hit \d+/);
    }
    assert.equal(requests.length, 1);
    const request = requests[0]!.message as { limit?: number; maxHitsPerResponse: number; mode: number };
    assert.equal(requests[0]!.method, "SearchMessages");
    assert.equal(request.limit, 20);
    assert.equal(request.maxHitsPerResponse, 1000);
    assert.equal(request.mode, 1, "PHRASE");
    assert.equal((await s.search("packed", { limit: 25 })).length, 25);

    // Over one response's 3 MiB: the server sends the hit's text in pieces.
    const colossal = `${"w ".repeat(1_700_000)}colossal`;
    await s.appendMessage(msg("big", colossal));
    const [big, ...rest] = await s.search("colossal");
    assert.equal(rest.length, 0);
    assert.equal(big!.id, "big");
    assert.equal(big!.content.length, colossal.length);
    assert.ok(big!.content === colossal, "the pieces joined exactly");
  });

  test("bad options are refused before any call; the server's refusals come back as SessionsError", async () => {
    const s = client.object(freshKey("search-bad")).session();
    await s.appendMessage(msg("a", "alpha"));
    await assert.rejects(s.search("alpha", { limit: 1.5 }), RangeError);
    await assert.rejects(s.search("alpha", { limit: 2 ** 31 }), RangeError);
    await assert.rejects(s.search("alpha", { mode: "fuzzy" as "phrase" }), TypeError);
    const words = Array.from({ length: 33 }, (_, i) => `w${i}`).join(" ");
    await assert.rejects(s.search(words, { mode: "all_words" }), expectFailure("INVALID_ARGUMENT", "LIMIT_EXCEEDED"));
  });
});

// ── compaction ──────────────────────────────────────────────────────────────

/** Twelve alternating user and assistant turns of about 3 KB each, m00 to m11. */
async function appendTurns(s: SessionHandle): Promise<void> {
  await s.appendMessages(
    Array.from({ length: 12 }, (_, i) =>
      msg(`m${String(i).padStart(2, "0")}`, `turn ${i} words `.repeat(200), i % 2 === 0 ? "user" : "assistant"),
    ),
  );
}

/** Text of the turn `id` (m00 to m11) that a prompt summarizing it holds. */
function spanText(id: string): string {
  return `turn ${Number(id.slice(1))} words`;
}

describe("compaction (a server without a summarizer)", () => {
  test("planCompaction, compact(summarize), addCompaction, listCompactions and the policy", async () => {
    const s = client.object(freshKey("compact")).session("s");
    await appendTurns(s);

    // The server's own summarizer: none configured.
    await assert.rejects(s.compact(), expectFailure("FAILED_PRECONDITION", "NO_SUMMARIZER"));
    await assert.rejects(s.compact({ keepRecentTokens: 500 }), expectFailure("FAILED_PRECONDITION", "NO_SUMMARIZER"));

    assert.equal(await s.planCompaction(), null, "everything fits the default 20,000-token tail");
    const plan = await s.planCompaction({ keepRecentTokens: 500 });
    assert.ok(plan !== null);
    assert.match(plan.fromMessageId, /^m\d\d$/);
    assert.match(plan.toMessageId, /^m\d\d$/);
    assert.ok(plan.fromMessageId < plan.toMessageId && plan.toMessageId < "m11", `${plan.fromMessageId}..${plan.toMessageId}`);
    assert.ok(plan.prompt.includes(spanText(plan.fromMessageId)), "the prompt holds the span's text");
    assert.ok(plan.budgetTokens > 0);
    assert.equal(typeof plan.budgetTokens, "number");

    // A summary blank as JavaScript trims it (U+FEFF included) stores nothing; a summarizer
    // that returns no string fails the call; nothing is stored either way.
    let asked = 0;
    const blank = (p: string) => {
      asked += 1;
      assert.equal(p, plan.prompt);
      return " \ufeff\n ";
    };
    assert.equal(await s.compact(blank, { keepRecentTokens: 500 }), null);
    assert.equal(asked, 1, "the summarizer was asked");
    await assert.rejects(s.compact(() => 42 as unknown as string, { keepRecentTokens: 500 }), TypeError);
    assert.deepEqual(await s.listCompactions(), []);

    // A summarizer here: given the plan's prompt (and the call's signal), its summary is stored.
    let prompt: string | undefined;
    let given: object | undefined;
    const record = await s.compact(
      async (p, options) => {
        prompt = p;
        given = options;
        return "the summary";
      },
      { keepRecentTokens: 500 },
    );
    assert.ok(record !== null);
    assert.equal(prompt, plan.prompt);
    assert.deepEqual(given, {});
    assert.equal(record.summary, "the summary");
    assert.equal(record.fromMessageId, plan.fromMessageId);
    assert.equal(record.toMessageId, plan.toMessageId);
    assert.ok(record.id !== "" && record.seq >= 1 && record.createdAtMs > 0);
    const history = await s.getHistory();
    const overlays = history.filter((m) => m.id === `compaction_${record.id}`);
    assert.equal(overlays.length, 1);
    assert.ok(JSON.stringify(overlays[0]).includes("the summary"));
    assert.ok(history.length < 12, `${history.length} messages read after compaction`);

    // Nothing (more) to compact: the summarizer is not asked.
    assert.equal(await s.compact(() => assert.fail("not asked")), null);
    assert.equal(await s.compact(() => assert.fail("not asked"), { keepRecentTokens: 500 }), null);

    const added = await s.addCompaction("manual", "m00", "m01");
    assert.equal(added.summary, "manual");
    assert.equal(added.fromMessageId, "m00");
    assert.equal(added.toMessageId, "m01");
    assert.ok(added.seq > record.seq);
    const list = await s.listCompactions();
    assert.deepEqual(list.map((c) => c.id), [record.id, added.id], "oldest first");
    assert.deepEqual(list[1], added);
    assert.deepEqual(await client.object(freshKey("none")).session().listCompactions(), []);

    // The policy: none yet; a threshold needs a summarizer (refused, nothing stored); a tail alone is stored.
    assert.deepEqual(await s.getCompactionPolicy(), { thresholdTokens: 0, keepRecentTokens: 0 });
    await assert.rejects(
      s.setCompactionPolicy(100_000, { keepRecentTokens: 4000 }),
      expectFailure("FAILED_PRECONDITION", "NO_SUMMARIZER"),
    );
    assert.deepEqual(await s.getCompactionPolicy(), { thresholdTokens: 0, keepRecentTokens: 0 });
    assert.deepEqual(await s.setCompactionPolicy(0, { keepRecentTokens: 4000 }), { thresholdTokens: 0, keepRecentTokens: 4000 });
    assert.deepEqual(await s.getCompactionPolicy(), { thresholdTokens: 0, keepRecentTokens: 4000 });

    // Bad numbers are refused here (RangeError) or by the server (INVALID_ARGUMENT).
    await assert.rejects(s.planCompaction({ keepRecentTokens: 1.5 }), RangeError);
    await assert.rejects(s.setCompactionPolicy(Number.NaN), RangeError);
    await assert.rejects(s.planCompaction({ keepRecentTokens: -1 }), (e: unknown) => {
      assert.ok(e instanceof SessionsError);
      assert.equal(e.code, "INVALID_ARGUMENT");
      return true;
    });
  });

  test("listCompactions follows the server's pages (100 records each)", async () => {
    const s = client.object(freshKey("compact-pages")).session("s");
    await s.appendMessages([msg("m1"), msg("m2")]);
    const added: string[] = [];
    for (let i = 0; i < 205; i++) added.push((await s.addCompaction(`summary ${i}`, "m1", "m2")).id);
    const list = await s.listCompactions();
    assert.deepEqual(list.map((c) => c.id), added);
    assert.deepEqual(list.map((c) => c.summary).slice(-2), ["summary 203", "summary 204"]);
  });

  test("compact(summarize) emits COMPACT; addCompaction COMPACTION with the record, or COMPACT with fromCompact", async () => {
    const s = client.object(freshKey("compact-feed")).session("s");
    await appendTurns(s);
    const feed = s.subscribe({ includeProgress: true })[Symbol.asyncIterator]();
    try {
      assert.equal((await feed.next()).value?.type, "PROGRESS");
      const record = await s.compact(() => "SUMMARY", { keepRecentTokens: 500 });
      assert.ok(record !== null);
      const compacted = await nextOfType(feed, "COMPACT");
      assert.equal(compacted.compaction, undefined, "COMPACT carries no payload");

      const plain = await s.addCompaction("manual", "m00", "m01");
      const event = await nextOfType(feed, "COMPACTION");
      assert.deepEqual(event.compaction, plain);

      await s.addCompaction("ran it myself", "m00", "m01", { fromCompact: true });
      assert.equal((await nextOfType(feed, "COMPACT")).compaction, undefined);
    } finally {
      await feed.return?.(undefined);
    }
  });
});

describe("compaction with the server's summarizer (a stub OpenAI-compatible API)", () => {
  let llm: Server;
  let prompts: string[];
  let summarizing: TestServer;

  before(async () => {
    prompts = [];
    llm = createServer((req: IncomingMessage, res) => {
      let body = "";
      req.setEncoding("utf8");
      req.on("data", (chunk: string) => (body += chunk));
      req.on("end", () => {
        try {
          const messages = (JSON.parse(body) as { messages?: { content?: string }[] }).messages ?? [];
          prompts.push(messages.map((m) => m.content ?? "").join("\n"));
        } catch {
          prompts.push("");
        }
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ choices: [{ index: 0, message: { role: "assistant", content: "the server's summary" } }] }));
      });
    });
    await new Promise<void>((resolve) => llm.listen(0, "127.0.0.1", resolve));
    const { port } = llm.address() as AddressInfo;
    summarizing = await TestServer.start(["--summarizer-url", `http://127.0.0.1:${port}/v1`, "--summarizer-model", "stub"]);
  });
  after(async () => {
    await summarizing?.stop();
    await new Promise<void>((resolve) => (llm ? llm.close(() => resolve()) : resolve()));
  });

  test("compact() uses it, keeping the tail it is given; the policy takes a threshold", async () => {
    const s = summarizing.client().object(freshKey("server-compact")).session("s");
    await appendTurns(s);
    assert.equal(await s.compact(), null, "everything fits the policy's default tail");
    assert.equal(prompts.length, 0, "the summarizer was not asked");
    const plan = await s.planCompaction({ keepRecentTokens: 500 });
    assert.ok(plan !== null);
    const record = await s.compact({ keepRecentTokens: 500 });
    assert.ok(record !== null);
    assert.equal(record.summary, "the server's summary");
    assert.equal(record.fromMessageId, plan.fromMessageId);
    assert.equal(record.toMessageId, plan.toMessageId);
    assert.equal(prompts.length, 1);
    assert.ok(prompts[0]!.includes(spanText(plan.fromMessageId)), "the summarizer got the span");
    assert.deepEqual((await s.listCompactions()).map((c) => c.id), [record.id]);
    assert.equal(await s.compact({ keepRecentTokens: 500 }), null, "nothing more to compact");
    // compact(undefined, options) is compact(options).
    const other = summarizing.client().object(freshKey("server-compact")).session("s");
    await appendTurns(other);
    assert.equal((await other.compact(undefined, { keepRecentTokens: 500 }))?.summary, "the server's summary");

    const policy = { thresholdTokens: 100_000, keepRecentTokens: 4000 };
    assert.deepEqual(await s.setCompactionPolicy(100_000, { keepRecentTokens: 4000 }), policy);
    assert.deepEqual(await s.getCompactionPolicy(), policy);
    assert.deepEqual(await s.setCompactionPolicy(0), { thresholdTokens: 0, keepRecentTokens: 0 });
  });
});
