import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { resubscribeDelayMs, type ChangeEvent, type SessionsClient } from "../src/index.js";
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

/** Reads events until `until` says stop (PROGRESS events skipped), with a deadline. */
async function collect(
  iterator: AsyncIterator<ChangeEvent>,
  until: (events: ChangeEvent[]) => boolean,
  timeoutMs = 15_000,
): Promise<ChangeEvent[]> {
  const events: ChangeEvent[] = [];
  const deadline = Date.now() + timeoutMs;
  while (!until(events)) {
    const remaining = deadline - Date.now();
    if (remaining <= 0) throw new Error(`timed out with ${events.length} events: ${events.map((e) => e.type)}`);
    let timer: NodeJS.Timeout | undefined;
    const next = await Promise.race([
      iterator.next(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out with ${events.map((e) => e.type)}`)), remaining);
      }),
    ]).finally(() => clearTimeout(timer));
    if (next.done) break;
    if (next.value.type !== "PROGRESS") events.push(next.value);
  }
  return events;
}

test("subscribe streams every kind of write in order, reassembles large messages, resumes", async () => {
  const o = client.object(freshKey());
  const s = o.session("feed");
  const feed = s.subscribe({ includeProgress: true });
  const it = feed[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.value?.type, "PROGRESS", "a live subscription starts with its revision");
  const startRevision = first.value!.revision;

  await s.appendMessage(msg("a"));
  await s.appendMessage(msg("a")); // duplicate: an APPEND event with inserted=false
  await s.appendMessage(msg("b"), { parentId: "a" });
  await s.updateMessage(msg("b", "edited"));
  const big = { id: "big", role: "assistant", parts: [{ type: "text", text: "🙂漢".repeat(1024 * 1024) }] };
  await s.appendMessage(big, { parentId: null });
  await s.deleteMessages(["a"]);
  await o.session("other").appendMessage(msg("elsewhere")); // filtered out
  await s.importMessages([msg("i1")]);
  await s.clearMessages();

  const events = await collect(it, (e) => e.some((x) => x.type === "CLEAR"));
  await it.return?.(undefined);
  assert.deepEqual(
    events.map((e) => [e.type, e.sessionId, e.message?.id ?? null]),
    [
      ["APPEND", "feed", "a"],
      ["APPEND", "feed", "a"],
      ["APPEND", "feed", "b"],
      ["UPDATE", "feed", "b"],
      ["APPEND", "feed", "big"],
      ["DELETE", "feed", null],
      ["IMPORT", "feed", "i1"],
      ["CLEAR", "feed", null],
    ],
  );
  assert.deepEqual(
    events.map((e) => e.inserted),
    [true, false, true, false, true, false, false, false],
  );
  assert.equal(events[2]!.parentMode, "ID");
  assert.equal(events[2]!.parentId, "a");
  assert.equal(events[4]!.parentMode, "ROOT");
  assert.deepEqual(events[3]!.message, msg("b", "edited"));
  assert.equal(JSON.stringify(events[4]!.message), JSON.stringify(big), "reassembled byte-exact");
  assert.deepEqual(events[5]!.messageIds, ["a"]);
  for (let i = 1; i < events.length; i++) assert.ok(events[i]!.revision > events[i - 1]!.revision);
  assert.ok(events[0]!.revision > startRevision);
  assert.equal(typeof events[0]!.revision, "bigint");

  // Resume after the first event: the rest is replayed, in order.
  const replay = o.subscribe({ sessionId: "feed", resumeAfterRevision: events[0]!.revision });
  const replayed = await collect(replay[Symbol.asyncIterator](), (e) => e.some((x) => x.type === "CLEAR"));
  await replay.return(undefined);
  assert.deepEqual(
    replayed.map((e) => e.revision),
    events.slice(1).map((e) => e.revision),
  );
});

test("an unfiltered object subscription sees every session; break ends it", async () => {
  const o = client.object(freshKey());
  const seen: string[] = [];
  let started!: () => void;
  const ready = new Promise<void>((r) => (started = r));
  const reader = (async () => {
    for await (const event of o.subscribe({ includeProgress: true })) {
      if (event.type === "PROGRESS") {
        started();
        continue;
      }
      seen.push(`${event.sessionId}/${event.message?.id}`);
      if (seen.length === 2) break;
    }
  })();
  await ready;
  await o.session("one").appendMessage(msg("x"));
  await o.session("two").appendMessage(msg("y"));
  await reader;
  assert.deepEqual(seen, ["one/x", "two/y"]);
  // The connection is still fine after the cancelled subscription.
  assert.deepEqual(await o.session("two").getMessage("y"), msg("y"));
});

test("the client's default deadline does not end a subscription", async () => {
  const impatient = server.client({ timeoutMs: 300 });
  const o = impatient.object(freshKey());
  const it = o.subscribe({ includeProgress: true })[Symbol.asyncIterator]();
  assert.equal((await it.next()).value?.type, "PROGRESS");
  await new Promise((r) => setTimeout(r, 700));
  await o.session().appendMessage(msg("late"));
  const [event] = await collect(it, (e) => e.length > 0);
  await it.return?.(undefined);
  assert.equal(event!.message?.id, "late");
});

test("close() ends a running subscription: it does not reconnect, and calls after it fail", async () => {
  // close() ended the stream as a server going away does: the subscription reconnected on a new
  // connection and went on delivering events; a call after close() opened one too.
  const own = server.client();
  const key = freshKey();
  const it = own.object(key).subscribe({ includeProgress: true })[Symbol.asyncIterator]();
  assert.equal((await it.next()).value?.type, "PROGRESS");
  const ended = it.next();
  own.close();
  await assert.rejects(ended, (error: unknown) => {
    assert.ok(error instanceof Error && "code" in error, String(error));
    assert.equal((error as { code: string }).code, "CANCELLED");
    assert.match((error as Error).message, /the client is closed/);
    return true;
  });
  await client.object(key).session().appendMessage(msg("after-close")); // would reach a live subscription
  assert.deepEqual(await it.next(), { done: true, value: undefined });
  await assert.rejects(own.object(key).session().appendMessage(msg("late")), /CANCELLED: the client is closed/);
  assert.equal(await client.object(key).session().getMessage("late"), null);
});

test("a revision given as an unsafe JS number is refused: rounded, it would skip events without a RESET", async () => {
  const session = client.object(freshKey()).session("s");
  await session.appendMessage(msg("m1"));
  const unsafe = Number(2n ** 62n + 5n); // what a revision read into a number becomes
  await assert.rejects(async () => {
    // The signal bounds a client that takes the number: it would follow the feed from there.
    for await (const event of session.subscribe({ resumeAfterRevision: unsafe, signal: AbortSignal.timeout(10_000) })) {
      void event;
    }
  }, RangeError);
  // A bigint, or a decimal string, of the same revision is taken.
  const live = session.subscribe({ resumeAfterRevision: "0", includeProgress: true });
  const opening = await live.next();
  assert.equal(opening.done, false);
  await live.return(undefined);
});

test("a revision below 0 or past 64 bits is a RangeError, not the call's INTERNAL error", async () => {
  const session = client.object(freshKey()).session("s");
  for (const revision of [-1, -1n, "-5", 2n ** 64n]) {
    await assert.rejects(
      session.subscribe({ resumeAfterRevision: revision }).next(),
      (e: unknown) => e instanceof RangeError && e.message.includes("is no revision: revisions run from 0 to 2^64 - 1"),
      String(revision),
    );
  }
});

test("a subscription's reconnections wait longer each time, jittered: subscribers of a server that went away do not come back together", () => {
  for (const [attempt, ceiling] of [[1, 100], [2, 200], [4, 800], [5, 1600], [6, 2000], [20, 2000]] as const) {
    const waits = Array.from({ length: 200 }, () => resubscribeDelayMs(attempt));
    for (const wait of waits) assert.ok(wait >= ceiling / 2 && wait <= ceiling, `attempt ${attempt}: ${wait} ms`);
    assert.ok(Math.max(...waits) - Math.min(...waits) > ceiling / 10, `attempt ${attempt}: not jittered`);
  }
});

