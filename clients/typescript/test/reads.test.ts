import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { SessionsError, type SessionHandle, type SessionsClient } from "../src/index.js";
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

/** a → b → c, and a → d (the newest message, so the active leaf). */
async function tree(): Promise<SessionHandle> {
  const s = client.object(freshKey()).session("t");
  await s.appendMessages([msg("a"), msg("b"), msg("c")]);
  await s.appendMessage(msg("d", "branch", "assistant"), { parentId: "a" });
  return s;
}

const ids = (messages: { id: string }[]) => messages.map((m) => m.id);

describe("single reads", () => {
  test("getMessage returns the message, or null", async () => {
    const s = await tree();
    assert.deepEqual(await s.getMessage("b"), msg("b"));
    assert.equal(await s.getMessage("missing"), null);
  });

  test("getMessages keeps request order and gives null for missing ids", async () => {
    const s = await tree();
    const found = await s.getMessages(["c", "missing", "a"]);
    assert.deepEqual(found, [msg("c"), null, msg("a")]);
    assert.deepEqual(await s.getMessages([]), []);
  });

  test("getLatestLeaf is the newest message, null for an empty session", async () => {
    const s = await tree();
    assert.deepEqual(await s.getLatestLeaf(), msg("d", "branch", "assistant"));
    assert.equal(await client.object(freshKey()).session().getLatestLeaf(), null);
  });

  test("getBranches lists direct children oldest first", async () => {
    const s = await tree();
    assert.deepEqual(ids(await s.getBranches("a")), ["b", "d"]);
    assert.deepEqual(await s.getBranches("c"), []);
    assert.deepEqual(await s.getBranches("missing"), []);
  });
});

describe("history", () => {
  test("history() streams the active branch root first, or newest first", async () => {
    const s = await tree();
    const forward: string[] = [];
    for await (const m of s.history()) forward.push(m.id);
    assert.deepEqual(forward, ["a", "d"]);
    const backward: string[] = [];
    for await (const m of s.history({ newestFirst: true })) backward.push(m.id);
    assert.deepEqual(backward, ["d", "a"]);
  });

  test("getHistory reads any leaf's path; an unknown leaf reads nothing", async () => {
    const s = await tree();
    assert.deepEqual(ids(await s.getHistory({ leafId: "c" })), ["a", "b", "c"]);
    assert.deepEqual(ids(await s.getHistory({ leafId: "c", newestFirst: true })), ["c", "b", "a"]);
    assert.deepEqual((await s.getHistory({ leafId: "b" }))[1], msg("b"));
    assert.deepEqual(await s.getHistory({ leafId: "nope" }), []);
    assert.deepEqual(await client.object(freshKey()).session().getHistory(), []);
  });

  test("historyBatches groups by count and by bytes", async () => {
    const s = client.object(freshKey()).session();
    await s.appendMessages(Array.from({ length: 10 }, (_, i) => msg(`m${i}`, "x".repeat(100))));
    const byCount: string[][] = [];
    for await (const batch of s.historyBatches({ batchSize: 3 })) byCount.push(ids(batch));
    assert.deepEqual(
      byCount.map((b) => b.length),
      [3, 3, 3, 1],
    );
    assert.deepEqual(byCount.flat(), Array.from({ length: 10 }, (_, i) => `m${i}`));
    const size = JSON.stringify(msg("m0", "x".repeat(100))).length;
    const byBytes: number[] = [];
    for await (const batch of s.historyBatches({ batchSize: 100, maxBatchBytes: size * 2 + 1 })) byBytes.push(batch.length);
    assert.deepEqual(byBytes, [2, 2, 2, 2, 2]);
    const newest: string[] = [];
    for await (const batch of s.historyBatches({ batchSize: 4, newestFirst: true, leafId: "m5" })) newest.push(...ids(batch));
    assert.deepEqual(newest, ["m5", "m4", "m3", "m2", "m1", "m0"]);
    const limited: string[][] = [];
    for await (const batch of s.historyBatches({ batchSize: 2, newestFirst: true, limit: 5 })) limited.push(ids(batch));
    assert.deepEqual(limited, [["m9", "m8"], ["m7", "m6"], ["m5"]]);
    await assert.rejects(async () => {
      for await (const _ of s.historyBatches({ limit: 0 })) void _;
    }, RangeError);
  });

  test("limit keeps the first messages of the read's order: newest first, the newest", async () => {
    const calls: string[] = [];
    const count: Interceptor = (next) => (req) => {
      calls.push(req.method.name);
      return next(req);
    };
    const s = server.client({ interceptors: [count] }).object(freshKey()).session();
    const all = Array.from({ length: 30 }, (_, i) => `m${i}`);
    await s.appendMessages(all.map((id) => msg(id)));
    assert.deepEqual(ids(await s.getHistory({ newestFirst: true, limit: 3 })), ["m29", "m28", "m27"]);
    const newest: string[] = [];
    for await (const m of s.history({ newestFirst: true, limit: 3 })) newest.push(m.id);
    assert.deepEqual(newest, ["m29", "m28", "m27"]);
    assert.deepEqual(ids(await s.getHistory({ limit: 3 })), ["m0", "m1", "m2"]);
    const oldest: string[] = [];
    for await (const m of s.history({ limit: 3 })) oldest.push(m.id);
    assert.deepEqual(oldest, ["m0", "m1", "m2"]);
    assert.deepEqual(ids(await s.getHistory({ limit: 1000 })), all);
    assert.deepEqual(ids(await s.getHistory({ newestFirst: true, limit: 30 })), [...all].reverse());
    assert.deepEqual(ids(await s.getHistory({ leafId: "m4", newestFirst: true, limit: 2 })), ["m4", "m3"]);
    assert.deepEqual(ids(await s.getHistory({ limit: undefined })), all);
    calls.length = 0;
    for (const limit of [0, -1, 1.5, 2 ** 32, Number.NaN, Infinity]) {
      await assert.rejects(s.getHistory({ limit }), (e: unknown) => {
        assert.ok(e instanceof RangeError);
        assert.match(e.message, /^limit must be a positive number of messages, got /);
        return true;
      });
      await assert.rejects(s.history({ newestFirst: true, limit }).next(), RangeError);
    }
    assert.deepEqual(calls, [], "an invalid limit makes no call");
    assert.equal((await s.getHistory({ limit: 2 ** 32 - 1 })).length, 30);
  });

  test("getHistoryRowStats gives stored sizes and token estimates root first", async () => {
    const s = await tree();
    const stats = await s.getHistoryRowStats({ leafId: "c" });
    assert.deepEqual(
      stats.map((r) => [r.id, r.role]),
      [
        ["a", "user"],
        ["b", "user"],
        ["c", "user"],
      ],
    );
    for (const r of stats) {
      assert.ok(r.bytes >= JSON.stringify(msg(r.id)).length, `bytes of ${r.id}`);
      assert.ok(r.tokenEstimate > 0, `token estimate of ${r.id}`);
    }
    assert.deepEqual(
      (await s.getHistoryRowStats()).map((r) => r.id),
      ["a", "d"],
    );
  });

  test("getRecentHistory keeps the newest suffix within the byte budget", async () => {
    const s = client.object(freshKey()).session();
    await s.appendMessages(Array.from({ length: 6 }, (_, i) => msg(`m${i}`, "y".repeat(200))));
    const stats = await s.getHistoryRowStats();
    const total = stats.reduce((sum, r) => sum + r.bytes, 0);
    const all = await s.getRecentHistory(10 * total);
    assert.equal(all.truncated, false);
    assert.equal(all.totalContentBytes, total);
    assert.equal(all.messages.length, 6);
    const budget = stats[4]!.bytes + stats[5]!.bytes;
    const recent = await s.getRecentHistory(budget);
    assert.equal(recent.truncated, true);
    assert.equal(recent.totalContentBytes, total);
    assert.deepEqual(ids(recent.messages), ["m4", "m5"]);
    const tiny = await s.getRecentHistory(1);
    assert.deepEqual(ids(tiny.messages), ["m5"], "always at least the newest message");
    const onPath = await s.getRecentHistory(10 * total, { leafId: "m2" });
    assert.deepEqual(ids(onPath.messages), ["m0", "m1", "m2"]);
    const empty = await client.object(freshKey()).session().getRecentHistory(1000);
    assert.deepEqual(empty, { messages: [], truncated: false, totalContentBytes: 0 });
  });
});

describe("early break", () => {
  test("breaking out of history() cancels the call and leaves the connection usable", async () => {
    const aborted: string[] = [];
    const watch: Interceptor = (next) => async (req) => {
      req.signal.addEventListener("abort", () => {
        // A finished call also aborts its signal (cleanup, no reason); count cancellations only.
        const reason: unknown = req.signal.reason;
        if (reason instanceof ConnectError && reason.code === Code.Canceled) aborted.push(req.method.name);
      });
      return next(req);
    };
    const watched = server.client({ interceptors: [watch] });
    const s = watched.object(freshKey()).session();
    const batch = 500;
    for (let start = 0; start < 3000; start += batch) {
      await s.appendMessages(Array.from({ length: batch }, (_, i) => msg(`m${start + i}`, "z".repeat(1000))));
    }
    for (let round = 0; round < 20; round++) {
      const seen: string[] = [];
      for await (const m of s.history({ newestFirst: round % 2 === 1 })) {
        seen.push(m.id);
        if (seen.length === 3) break;
      }
      assert.equal(seen.length, 3);
    }
    assert.equal(aborted.filter((m) => m === "StreamHistory").length, 20, "every broken stream was cancelled");
    // The connection still serves a full read after twenty abandoned streams.
    assert.equal((await s.getHistory()).length, 3000);
    // Explicitly closing the iterator cancels too.
    const iterator = s.history()[Symbol.asyncIterator]();
    assert.equal((await iterator.next()).value?.id, "m0");
    await iterator.return(undefined);
    assert.equal(aborted.filter((m) => m === "StreamHistory").length, 21);
    assert.deepEqual(await s.getMessage("m2999"), msg("m2999", "z".repeat(1000)));
  });
});

describe("deadlines", () => {
  test("timeoutMs bounds a stream with DEADLINE_EXCEEDED", async () => {
    const s0 = client.object(freshKey()).session();
    await s0.appendMessages(Array.from({ length: 20 }, (_, i) => msg(`m${i}`)));
    // Room for a new connection on a loaded machine, and a pause well past it below.
    const impatient = server.client({ timeoutMs: 500 });
    const s = impatient.object(s0.key).session();
    assert.equal((await s.getHistory()).length, 20, "a quick read finishes in time");
    // The messages arrive packed (up to 400 a response): those already received are still
    // delivered after the deadline, which surfaces when the stream is read past them.
    let read = 0;
    await assert.rejects(
      (async () => {
        for await (const _ of s.history()) {
          if (read++ === 0) await new Promise((r) => setTimeout(r, 1000));
        }
      })(),
      (e: unknown) => {
        assert.ok(e instanceof SessionsError);
        assert.equal(e.code, "DEADLINE_EXCEEDED");
        return true;
      },
    );
  });
});

describe("object reads", () => {
  test("listSessions and getObjectStats describe the object", async () => {
    const o = client.object(freshKey());
    await o.session("").appendMessage(msg("a"));
    await o.session("two").appendMessages([msg("a"), msg("b")]);
    const sessions = (await o.listSessions()).sort((x, y) => x.sessionId.localeCompare(y.sessionId));
    assert.deepEqual(sessions, [
      { sessionId: "", messageCount: 1 },
      { sessionId: "two", messageCount: 2 },
    ]);
    const stats = await o.getObjectStats();
    assert.equal(stats.messageRows, 3);
    assert.equal(stats.sessionCount, 2);
    assert.ok(stats.fileBytes > 0);
    assert.ok(stats.rowWrites >= 3);
  });

  test("getObjectStats counts the free pages a delete leaves in the file, and vacuum gives them back", async () => {
    const o = client.object(freshKey());
    await o.session("").appendMessages([msg("big", "x".repeat(600_000)), msg("small")]);
    const before = await o.getObjectStats();
    assert.equal(await o.session("").deleteMessages(["big"]), 1);
    const after = await o.getObjectStats();
    assert.ok(after.freeBytes - before.freeBytes >= 600_000, `${before.freeBytes} -> ${after.freeBytes}`);
    assert.ok(after.freeBytes < after.fileBytes);

    const report = await o.vacuum();
    const vacuumed = await o.getObjectStats();
    assert.equal(report.fileBytesBefore, after.fileBytes);
    assert.equal(report.fileBytesAfter, vacuumed.fileBytes);
    assert.ok(vacuumed.fileBytes <= after.fileBytes - 600_000, `${after.fileBytes} -> ${vacuumed.fileBytes}`);
    assert.equal(vacuumed.freeBytes, 0);
    assert.deepEqual(
      (await o.session("").getHistory()).map((m) => m.id),
      ["small"],
    );
  });

  test("listSessions follows next_page_token past the server's page of 1,000 sessions", async () => {
    const o = client.object(freshKey());
    const n = 1006;
    const name = (i: number) => `s${String(i).padStart(4, "0")}`;
    // Eight appends in flight at a time; every hundredth session gets two messages, so the
    // counts are checked too.
    let next = 0;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        for (let i = next++; i < n; i = next++) {
          await o.session(name(i)).appendMessages(i % 100 === 0 ? [msg("a"), msg("b")] : [msg("a")]);
        }
      }),
    );
    const sessions = await o.listSessions();
    assert.equal(sessions.length, n);
    assert.deepEqual(
      sessions,
      Array.from({ length: n }, (_, i) => ({ sessionId: name(i), messageCount: i % 100 === 0 ? 2 : 1 })),
    );
  });
});
