// Packed reads: the client asks long reads for up to 400 messages per response
// (`max_messages_per_response`) and reassembles them from `frames`, including a message large
// enough to travel as pieces, and batch ends that the server marks at the end of a response.
// A recording interceptor checks what actually crossed the wire, so these tests fail if the
// client stops asking for packing as well as if it misreads packed responses.
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";
import type { Message, SessionHandle, SessionsClient } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

const PACKED = 400;
const MiB = 1024 * 1024;

interface SeenFrame {
  id: string | undefined;
  bytes: number;
  more: boolean;
}

interface SeenResponse {
  /** The single `frame` field was set. */
  frame: boolean;
  /** The packed `frames`. */
  frames: SeenFrame[];
  batchEnd: boolean;
}

interface SeenCall {
  method: string;
  maxMessagesPerResponse: number | undefined;
  responses: SeenResponse[];
}

interface FrameLike {
  info?: { id: string } | undefined;
  json: string;
  morePieces: boolean;
}

interface ReadRequestLike {
  maxMessagesPerResponse?: number;
}

interface ReadResponseLike {
  frame?: FrameLike | undefined;
  frames?: FrameLike[];
  batchEnd?: boolean;
}

const calls: SeenCall[] = [];

function seenFrame(f: FrameLike): SeenFrame {
  return { id: f.info?.id, bytes: Buffer.byteLength(f.json, "utf8"), more: f.morePieces };
}

/** Records every server-streaming call: its request's packing and each response's shape. */
const record: Interceptor = (next) => async (req) => {
  if (!req.stream) return next(req);
  const call: SeenCall = { method: req.method.name, maxMessagesPerResponse: undefined, responses: [] };
  calls.push(call);
  const requests = req.message as AsyncIterable<ReadRequestLike>;
  async function* tapRequests() {
    for await (const r of requests) {
      call.maxMessagesPerResponse = r.maxMessagesPerResponse;
      yield r;
    }
  }
  const res = await next({ ...req, message: tapRequests() } as typeof req);
  if (!res.stream) return res;
  const responses = res.message as AsyncIterable<ReadResponseLike>;
  async function* tapResponses() {
    for await (const r of responses) {
      call.responses.push({
        frame: r.frame !== undefined,
        frames: (r.frames ?? []).map(seenFrame),
        batchEnd: r.batchEnd ?? false,
      });
      yield r;
    }
  }
  return { ...res, message: tapResponses() } as typeof res;
};

let server: TestServer;
let client: SessionsClient;

before(async () => {
  server = await TestServer.start();
  client = server.client({ interceptors: [record] });
});
after(async () => {
  await server?.stop();
});
beforeEach(() => {
  calls.length = 0;
});

/** The one call of `method` made since the test began. */
function only(method: string): SeenCall {
  const found = calls.filter((c) => c.method === method);
  assert.equal(found.length, 1, `one ${method} call, saw ${calls.map((c) => c.method).join(",")}`);
  return found[0]!;
}

/** Asserts a call asked for packing and was answered packed: `frames` only, at most PACKED each. */
function assertPacked(call: SeenCall, messages: number): void {
  assert.equal(call.maxMessagesPerResponse, PACKED, `${call.method} asks for packed responses`);
  const data = call.responses.filter((r) => r.frame || r.frames.length > 0);
  assert.ok(data.every((r) => !r.frame), `${call.method}: no response uses the single frame field`);
  assert.ok(data.every((r) => r.frames.length <= PACKED), `${call.method}: at most ${PACKED} frames a response`);
  const wholeFrames = data.flatMap((r) => r.frames).filter((f) => f.id !== undefined).length;
  assert.equal(wholeFrames, messages, `${call.method}: one frame with info per message`);
  if (messages > 1) {
    assert.ok(
      data.length < messages,
      `${call.method}: ${messages} messages should arrive in fewer responses, got ${data.length}`,
    );
  }
}

const ids = (messages: { id: string }[]) => messages.map((m) => m.id);

/** Small messages whose texts differ (multi-byte characters included), alternating roles. */
function smallMessages(prefix: string, count: number): Message[] {
  return Array.from({ length: count }, (_, i) =>
    msg(`${prefix}${i}`, `${prefix} #${i} ${"é😀中".repeat(i % 5)}`, i % 2 === 0 ? "user" : "assistant"),
  );
}

/** About `bytes` UTF-8 bytes mixing ASCII, CJK, emoji and characters JSON escapes. */
function bigMessage(id: string, bytes: number): Message {
  const unit = `${id} 汉字かな한국어 🙂🚀👩‍💻 é ß "quote" \\ tab\t newline\n ∑≈ `;
  const text = unit.repeat(Math.ceil(bytes / Buffer.byteLength(unit, "utf8")));
  return { id, role: "assistant", parts: [{ type: "text", text }] };
}

async function appendAll(s: SessionHandle, messages: Message[]): Promise<void> {
  for (let start = 0; start < messages.length; start += 100) await s.appendMessages(messages.slice(start, start + 100));
}

async function batchesOf(s: SessionHandle, options: Parameters<SessionHandle["historyBatches"]>[0]): Promise<Message[][]> {
  const out: Message[][] = [];
  for await (const batch of s.historyBatches(options)) out.push(batch);
  return out;
}

describe("a long history of small messages", () => {
  const N = 300;
  let s: SessionHandle;
  let all: Message[];

  before(async () => {
    s = client.object(freshKey("packed")).session("long");
    all = smallMessages("m", N);
    await appendAll(s, all);
  });

  test("history() reads all 300 in order, packed into few responses", async () => {
    const forward: Message[] = [];
    for await (const m of s.history()) forward.push(m);
    assert.deepEqual(forward, all);
    const call = only("StreamHistory");
    assertPacked(call, N);
    assert.ok(call.responses.every((r) => !r.batchEnd), "no batch ends on an unbatched read");
    assert.ok(
      call.responses.some((r) => r.frames.length > 1),
      "at least one response carries several messages",
    );
  });

  test("getHistory newest first, and from another leaf", async () => {
    assert.deepEqual(await s.getHistory({ newestFirst: true }), [...all].reverse());
    assertPacked(only("StreamHistory"), N);
    calls.length = 0;
    assert.deepEqual(await s.getHistory({ leafId: "m199" }), all.slice(0, 200));
    assertPacked(only("StreamHistory"), 200);
  });

  test("getMessages keeps request order across packed responses", async () => {
    const wanted = [...all].reverse().map((m) => m.id);
    wanted.splice(150, 0, "missing");
    const found = await s.getMessages(wanted);
    assert.equal(found.length, N + 1);
    assert.equal(found[150], null);
    assert.deepEqual(
      found.filter((m) => m !== null),
      [...all].reverse(),
    );
    assertPacked(only("GetMessages"), N);
  });

  test("getRecentHistory reads the whole path, or the suffix that fits", async () => {
    const whole = await s.getRecentHistory(100 * MiB);
    assert.equal(whole.truncated, false);
    assert.deepEqual(whole.messages, all);
    assertPacked(only("GetRecentHistory"), N);
    const stats = await s.getHistoryRowStats();
    const budget = stats.slice(-170).reduce((sum, r) => sum + r.bytes, 0);
    calls.length = 0;
    const recent = await s.getRecentHistory(budget);
    assert.equal(recent.truncated, true);
    assert.deepEqual(recent.messages, all.slice(-170));
    assertPacked(only("GetRecentHistory"), 170);
  });

  test("historyBatches: batch ends survive packing, small batches and batches over 400", async () => {
    const sevens = await batchesOf(s, { batchSize: 7 });
    assert.deepEqual(
      sevens.map((b) => b.length),
      [...Array(42).fill(7), 6],
    );
    assert.deepEqual(sevens.flat(), all);
    const call = only("StreamHistory");
    assertPacked(call, N);
    // A batch end closes its response: one marked response per batch, ending on its last message.
    assert.equal(call.responses.filter((r) => r.batchEnd).length, 43);

    // Batches larger than a packed response span several responses: 900 messages in batches
    // of 500, so the first batch needs at least two responses of 400 and the second one more.
    const longer = client.object(freshKey("packed")).session("longer");
    const many = smallMessages("n", 900);
    await appendAll(longer, many);
    calls.length = 0;
    const large = await batchesOf(longer, { batchSize: 500 });
    assert.deepEqual(
      large.map((b) => b.length),
      [500, 400],
    );
    assert.deepEqual(large.flat(), many);
    const spanning = only("StreamHistory");
    assertPacked(spanning, many.length);
    const firstEnd = spanning.responses.findIndex((r) => r.batchEnd);
    assert.ok(firstEnd >= 1, `a batch of 500 spans at least two responses of ${PACKED}, ended in response ${firstEnd}`);
    assert.ok(spanning.responses.length >= 3, "900 messages in batches of 500 need at least three responses of 400");
    assert.equal(spanning.responses.filter((r) => r.batchEnd).length, 2);

    // By bytes, newest first.
    calls.length = 0;
    const sizes = all.map((m) => Buffer.byteLength(JSON.stringify(m), "utf8"));
    const limit = 2000;
    const byBytes = await batchesOf(s, { batchSize: 1000, maxBatchBytes: limit, newestFirst: true });
    assert.deepEqual(byBytes.flat(), [...all].reverse());
    assert.deepEqual(
      byBytes.map((b) => b.length),
      upstreamBatches([...sizes].reverse(), 1000, limit),
    );
    assertPacked(only("StreamHistory"), N);
  });

  test("getBranches: 300 children of one parent, oldest first", async () => {
    const t = client.object(freshKey("packed")).session("children");
    await t.appendMessage(msg("root"));
    const children = smallMessages("c", N);
    const imported = await t.importMessages(children.map((m, i) => ({ message: m, parentId: "root", createdAt: 1_000 + i })));
    assert.deepEqual(imported, { imported: N, skipped: 0 });
    calls.length = 0;
    assert.deepEqual(await t.getBranches("root"), children);
    assertPacked(only("GetBranches"), N);
  });
});

/** Batch sizes by upstream's historyBatches rules: close before a message that would overflow, after one that fills. */
function upstreamBatches(sizes: number[], batchSize: number, maxBytes: number): number[] {
  const out: number[] = [];
  let count = 0;
  let used = 0;
  for (const size of sizes) {
    if (count > 0 && used + size > maxBytes) {
      out.push(count);
      count = 0;
      used = 0;
    }
    count += 1;
    used += size;
    if (count >= batchSize || used >= maxBytes) {
      out.push(count);
      count = 0;
      used = 0;
    }
  }
  if (count > 0) out.push(count);
  return out;
}

describe("a message over 3 MiB between small ones", () => {
  let s: SessionHandle;
  let before40: Message[];
  let after40: Message[];
  let big: Message;
  let bigText: string;
  let path: Message[];

  before(async () => {
    s = client.object(freshKey("packed")).session("big");
    before40 = smallMessages("s", 40);
    after40 = smallMessages("t", 40);
    big = bigMessage("big", 7 * MiB);
    bigText = JSON.stringify(big);
    await appendAll(s, before40);
    await s.appendMessage(msg("sib", "a sibling of big"), { parentId: "s39" });
    await s.appendMessage(big, { parentId: "s39" });
    await appendAll(s, after40); // auto parent: chains after big
    path = [...before40, big, ...after40];
  });

  /**
   * The big message's pieces: consecutive, each alone in its response, info on the first only,
   * `more_pieces` on all but the last, joining to the exact text. Returns the indexes of the
   * responses carrying the first and the last piece.
   */
  function assertPieces(call: SeenCall): { first: number; last: number } {
    const flat = call.responses.flatMap((r, response) =>
      r.frames.map((f) => ({ ...f, response, alone: r.frames.length === 1 })),
    );
    const first = flat.findIndex((f) => f.id === "big");
    assert.ok(first >= 0, `${call.method}: the large message was read`);
    let last = first;
    while (flat[last]!.more) last += 1;
    const pieces = flat.slice(first, last + 1);
    assert.ok(pieces.length >= 3, `a 7 MiB message arrives in several pieces, got ${pieces.length}`);
    assert.ok(pieces.slice(1).every((p) => p.id === undefined), "later pieces carry no info");
    assert.ok(pieces.every((p) => p.alone), "each piece travels in a response of its own");
    assert.deepEqual(
      pieces.map((p) => p.response),
      pieces.map((_, i) => pieces[0]!.response + i),
      "pieces arrive in consecutive responses",
    );
    assert.ok(pieces.every((p) => p.bytes <= 3 * MiB));
    assert.equal(
      pieces.reduce((sum, p) => sum + p.bytes, 0),
      Buffer.byteLength(bigText, "utf8"),
    );
    assert.equal(flat.filter((f) => f.more).length, pieces.length - 1, "only the large message is cut");
    return { first: pieces[0]!.response, last: pieces[pieces.length - 1]!.response };
  }

  test("history() returns every message in order, the large one byte-exact", async () => {
    const got: Message[] = [];
    for await (const m of s.history()) got.push(m);
    assert.deepEqual(ids(got), ids(path));
    assert.equal(JSON.stringify(got[40]), bigText);
    assert.deepEqual(got.slice(0, 40), before40);
    assert.deepEqual(got.slice(41), after40);
    const call = only("StreamHistory");
    assertPacked(call, path.length);
    assertPieces(call);

    calls.length = 0;
    const newest = await s.getHistory({ newestFirst: true });
    assert.deepEqual(ids(newest), ids([...path].reverse()));
    assert.equal(JSON.stringify(newest[40]), bigText);
  });

  test("getMessages, getBranches and getRecentHistory reassemble it among packed messages", async () => {
    const found = await s.getMessages(["t39", "s0", "big", "missing", "t0"]);
    assert.deepEqual(found[0], after40[39]);
    assert.deepEqual(found[1], before40[0]);
    assert.equal(JSON.stringify(found[2]), bigText);
    assert.equal(found[3], null);
    assert.deepEqual(found[4], after40[0]);
    assertPieces(only("GetMessages"));

    calls.length = 0;
    const children = await s.getBranches("s39");
    assert.deepEqual(ids(children), ["sib", "big"]);
    assert.equal(JSON.stringify(children[1]), bigText);
    assertPieces(only("GetBranches"));

    calls.length = 0;
    const recent = await s.getRecentHistory(100 * MiB);
    assert.equal(recent.truncated, false);
    assert.deepEqual(ids(recent.messages), ids(path));
    assert.equal(JSON.stringify(recent.messages[40]), bigText);
    assert.deepEqual(recent.messages.slice(41), after40);
    const call = only("GetRecentHistory");
    assertPacked(call, path.length);
    assertPieces(call);
  });

  test("historyBatches: the large message forms a batch alone, the others stay packed", async () => {
    const batches = await batchesOf(s, { batchSize: 16 });
    assert.deepEqual(
      batches.map((b) => b.length),
      [16, 16, 8, 1, 16, 16, 8],
    );
    assert.equal(batches[3]![0]!.id, "big");
    assert.equal(JSON.stringify(batches[3]![0]), bigText);
    assert.deepEqual(batches.slice(0, 3).flat(), before40);
    assert.deepEqual(batches.slice(4).flat(), after40);
    const call = only("StreamHistory");
    assertPacked(call, path.length);
    const pieces = assertPieces(call);
    // The batch before the large message ends just before its first piece; its own, on its last.
    assert.equal(call.responses[pieces.first - 1]!.batchEnd, true, "batch end before the first piece");
    assert.ok(call.responses.slice(pieces.first, pieces.last).every((r) => !r.batchEnd), "no batch end inside the message");
    assert.equal(call.responses[pieces.last]!.batchEnd, true, "batch end on the last piece");
    assert.equal(call.responses.filter((r) => r.batchEnd).length, 7);
  });
});
