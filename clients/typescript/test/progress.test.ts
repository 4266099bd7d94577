// PROGRESS events of Subscribe: dropped by default (as by the Python and Go clients), yielded
// with `includeProgress: true`, and, dropped or not, moving the revision a reconnect resumes
// after. The server runs with a short --progress-seconds, so it sends a PROGRESS frame after
// every short quiet spell; an interceptor records what each Subscribe call sent and received,
// which proves those frames reached the client even when the subscription did not yield them,
// and can cut a call (UNAVAILABLE) right after a given frame was handed to the client. The
// tests wait for frames seen on the wire, never for time to pass.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { pb, type ChangeEvent, type ChangeTypeName } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

const WAIT_MS = 20_000;

let server: TestServer;

before(async () => {
  server = await TestServer.start(["--progress-seconds", "0.2"]);
});
after(async () => {
  await server?.stop();
});

interface Frame {
  type: ChangeTypeName;
  revision: bigint;
  messageId: string | undefined;
}

interface SubscribeCall {
  resumeAfterRevision: bigint | undefined;
  frames: Frame[];
}

/** Records every Subscribe call of a client: its request's resume revision and each response. */
class WireTap {
  readonly calls: SubscribeCall[] = [];
  /** When set, the call is cut (UNAVAILABLE) right after the first frame it matches reached the client. */
  breakAfter: ((frame: Frame) => boolean) | null = null;
  private readonly waiters = new Set<() => void>();

  readonly interceptor: Interceptor = (next) => async (req) => {
    if (req.method.name !== "Subscribe" || !req.stream) return next(req);
    const call: SubscribeCall = { resumeAfterRevision: undefined, frames: [] };
    this.calls.push(call);
    const requests = req.message as AsyncIterable<pb.SubscribeRequest>;
    async function* tapRequests() {
      for await (const r of requests) {
        call.resumeAfterRevision = r.resumeAfterRevision;
        yield r;
      }
    }
    const res = await next({ ...req, message: tapRequests() } as typeof req);
    if (!res.stream) return res;
    const responses = res.message as AsyncIterable<pb.SubscribeResponse>;
    const tap = this;
    async function* tapResponses() {
      for await (const r of responses) {
        const frame: Frame = {
          type: (pb.ChangeType[r.type] ?? "UNSPECIFIED") as ChangeTypeName,
          revision: r.revision,
          messageId: r.message?.info?.id,
        };
        call.frames.push(frame);
        tap.wake();
        yield r;
        // Resumed only when the client asks for the next response: it has taken this one in.
        if (tap.breakAfter?.(frame)) {
          tap.breakAfter = null;
          throw new ConnectError("connection cut by the test", Code.Unavailable);
        }
      }
    }
    return { ...res, message: tapResponses() } as typeof res;
  };

  /** Every frame received, in order, over all calls. */
  frames(): Frame[] {
    return this.calls.flatMap((c) => c.frames);
  }

  /** Resolves once `ready()` holds (checked now and after each frame); fails after WAIT_MS or when `stop` settles. */
  until(what: string, ready: () => boolean, stop?: Promise<unknown>): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const check = () => {
        if (!ready()) return;
        finish();
        resolve();
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`waited ${WAIT_MS} ms for ${what}; frames: ${describe(this.calls)}`));
      }, WAIT_MS);
      const finish = () => {
        clearTimeout(timer);
        this.waiters.delete(check);
      };
      this.waiters.add(check);
      stop?.then(
        () => {
          finish();
          reject(new Error(`the subscription ended while waiting for ${what}`));
        },
        (error: unknown) => {
          finish();
          reject(error);
        },
      );
      check();
    });
  }

  private wake(): void {
    for (const check of [...this.waiters]) check();
  }
}

function describe(calls: SubscribeCall[]): string {
  return calls
    .map((c, i) => `call ${i} (after ${c.resumeAfterRevision}): ${c.frames.map((f) => f.messageId ?? f.type).join(" ")}`)
    .join("; ");
}

/** The index of the first frame of `frames` at or after `from` that `match` accepts (-1: none). */
function indexOf(frames: Frame[], match: (f: Frame) => boolean, from = 0): number {
  for (let i = from; i < frames.length; i++) if (match(frames[i]!)) return i;
  return -1;
}

const isProgress = (f: Frame) => f.type === "PROGRESS";
const isAppendOf = (id: string) => (f: Frame) => f.type === "APPEND" && f.messageId === id;

/** True when the frames hold an APPEND of `id` followed (later) by a PROGRESS. */
function progressAfter(frames: Frame[], id: string): boolean {
  const at = indexOf(frames, isAppendOf(id));
  return at >= 0 && indexOf(frames, isProgress, at + 1) >= 0;
}

/** The iterator's next value, failing after WAIT_MS. */
async function nextWithin<T>(iterator: AsyncIterator<T>): Promise<IteratorResult<T>> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    iterator.next(),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no event within ${WAIT_MS} ms`)), WAIT_MS);
    }),
  ]).finally(() => clearTimeout(timer));
}

test("by default PROGRESS is not yielded, yet reconnects resume after its revision", { timeout: 90_000 }, async () => {
  const tap = new WireTap();
  const client = server.client({ interceptors: [tap.interceptor] });
  const writer = server.client();
  const key = freshKey("quiet");
  const feedSession = writer.object(key).session("feed");
  const other = writer.object(key).session("other"); // not in the subscription's filter
  await other.appendMessage(msg("o0")); // the live start's revision is then this write's, not 0

  // Cut the first call right after its first frame, the PROGRESS saying where the live feed starts.
  tap.breakAfter = isProgress;
  const events: ChangeEvent[] = [];
  const reading = (async () => {
    for await (const event of client.object(key).subscribe({ sessionId: "feed" })) {
      events.push(event);
      if (events.length === 3) break;
    }
  })();
  reading.catch(() => {}); // awaited below; until() reports an early failure
  const calls = tap.calls;

  // 1. The reconnect resumes after the live start's revision (not 0: "live again", which would
  //    miss what was written in between), although that PROGRESS was never yielded.
  await tap.until("the first reconnect's first frame", () => calls.length >= 2 && calls[1]!.frames.length > 0, reading);
  const start = calls[0]!.frames;
  assert.equal(start.length, 1);
  assert.equal(start[0]!.type, "PROGRESS");
  assert.ok(start[0]!.revision > 0n);
  assert.equal(calls[0]!.resumeAfterRevision, 0n, "the first call starts live");
  assert.equal(calls[1]!.resumeAfterRevision, start[0]!.revision, "resumed after the dropped PROGRESS");

  // 2. A write to the subscribed session, then a quiet spell: the server sends PROGRESS after it.
  await feedSession.appendMessage(msg("a"));
  await tap.until("APPEND a, then PROGRESS", () => progressAfter(calls[1]!.frames, "a"), reading);
  const revisionA = calls[1]!.frames[indexOf(calls[1]!.frames, isAppendOf("a"))]!.revision;

  // 3. A write elsewhere raises the object's revision: the next PROGRESS carries it. Cut the call
  //    right after that PROGRESS: the reconnect must resume after it, not after APPEND a.
  tap.breakAfter = (f) => isProgress(f) && f.revision > revisionA;
  await other.appendMessage(msg("o1"));
  await tap.until("the second reconnect's first frame", () => calls.length >= 3 && calls[2]!.frames.length > 0, reading);
  const cutAt = calls[1]!.frames.at(-1)!;
  assert.equal(cutAt.type, "PROGRESS");
  assert.ok(cutAt.revision > revisionA, "the PROGRESS carries the other session's write");
  assert.equal(calls[2]!.resumeAfterRevision, cutAt.revision, "resumed after the dropped PROGRESS, not the last event");

  // 4. Two more writes with a quiet spell (and so a PROGRESS) between them.
  await feedSession.appendMessage(msg("b"));
  await tap.until("APPEND b, then PROGRESS", () => progressAfter(calls[2]!.frames, "b"), reading);
  await feedSession.appendMessage(msg("c"));
  await tap.until("APPEND c", () => indexOf(calls[2]!.frames, isAppendOf("c")) >= 0, reading);
  await reading; // it stops after its third event

  // Exactly the writes, in order, once each; PROGRESS frames reached the client before, between
  // and after them without being yielded.
  assert.deepEqual(
    events.map((e) => [e.type, e.sessionId, e.message?.id ?? null]),
    [
      ["APPEND", "feed", "a"],
      ["APPEND", "feed", "b"],
      ["APPEND", "feed", "c"],
    ],
  );
  const wire = tap.frames();
  assert.deepEqual(
    events.map((e) => e.revision),
    wire.filter((f) => !isProgress(f)).map((f) => f.revision),
    "every non-PROGRESS frame received was yielded, and nothing else",
  );
  for (let i = 1; i < events.length; i++) assert.ok(events[i]!.revision > events[i - 1]!.revision);
  const a = indexOf(wire, isAppendOf("a"));
  const b = indexOf(wire, isAppendOf("b"));
  const c = indexOf(wire, isAppendOf("c"));
  assert.ok(indexOf(wire, isProgress) < a, "PROGRESS before a");
  assert.ok(indexOf(wire, isProgress, a + 1) < b, "PROGRESS between a and b");
  assert.ok(indexOf(wire, isProgress, b + 1) < c, "PROGRESS between b and c");
  assert.equal(calls.length, 3, "exactly the two injected cuts reconnected");
});

test("includeProgress: true yields every PROGRESS received, in order with the writes", { timeout: 60_000 }, async () => {
  const tap = new WireTap();
  const client = server.client({ interceptors: [tap.interceptor] });
  const session = server.client().object(freshKey("chatty")).session("feed");
  const yielded: ChangeEvent[] = [];
  const it = client.object(session.key).subscribe({ sessionId: "feed", includeProgress: true })[Symbol.asyncIterator]();
  /** Reads events until `done` holds for what was yielded so far. */
  async function readUntil(done: (events: ChangeEvent[]) => boolean): Promise<void> {
    while (!done(yielded)) {
      const next = await nextWithin(it);
      assert.equal(next.done, false, "the subscription ended");
      yielded.push(next.value);
    }
  }
  const appendThenProgress = (id: string) => (events: ChangeEvent[]) => {
    const at = events.findIndex((e) => e.type === "APPEND" && e.message?.id === id);
    return at >= 0 && events.slice(at + 1).some((e) => e.type === "PROGRESS");
  };

  await readUntil((e) => e.length === 1);
  assert.equal(yielded[0]!.type, "PROGRESS", "a live subscription starts with a PROGRESS");
  await session.appendMessage(msg("a"));
  await readUntil(appendThenProgress("a"));
  await session.appendMessage(msg("b"));
  await readUntil(appendThenProgress("b"));
  await it.return?.(undefined);

  assert.equal(tap.calls.length, 1);
  assert.deepEqual(
    yielded.map((e) => [e.type, e.revision]),
    tap.calls[0]!.frames.map((f) => [f.type, f.revision]),
    "every frame received was yielded, in order",
  );
  assert.deepEqual(
    yielded.filter((e) => e.type !== "PROGRESS").map((e) => e.message?.id),
    ["a", "b"],
  );
  const a = yielded.findIndex((e) => e.type === "APPEND");
  // The PROGRESS after a quiet spell carries the revision the feed is at: the last write's.
  assert.equal(yielded[a + 1]!.type, "PROGRESS");
  assert.equal(yielded[a + 1]!.revision, yielded[a]!.revision);
  assert.ok(yielded.filter((e) => e.type === "PROGRESS").length >= 3);
});
