// Per-call cancellation (`{ signal }`, AbortOptions) against a real server: a signal aborted
// already sends nothing; an abort ends a retry's wait (and a retry observer's pending promise) at
// once with no attempt after it; an abort cancels an attempt in flight, here one whose answer a
// relay holds back, so that only the cancellation can end it; a signal never aborted changes no
// result and keeps no listener. Every abort comes from the retry observer or after an event the
// test waits for (the request seen on the wire), never from a timer racing the call.
import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import net, { type AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";
import {
  SessionsClient,
  SessionsError,
  routingHeaders,
  type ClientOptions,
  type RetryNotice,
  type SessionHandle,
} from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;
/** Setup and read-back through the generated client or the wrapper, with retries off. */
let raw: SessionsClient;

before(async () => {
  server = await TestServer.start();
  raw = server.client({ retry: false });
});
after(async () => {
  await server?.stop();
});

/** A client (of the test server when `address` is null) that logs each attempt's RPC and each retry notice. */
function observed(address: string | null, options: ClientOptions = {}) {
  const attempts: string[] = [];
  const notices: RetryNotice[] = [];
  const log: Interceptor = (next) => (req) => {
    attempts.push(req.method.name);
    return next(req);
  };
  const onRetry = options.onRetry;
  const all: ClientOptions = {
    ...options,
    interceptors: [log, ...(options.interceptors ?? [])],
    onRetry: (notice) => {
      notices.push(notice);
      return onRetry?.(notice);
    },
  };
  const client = address === null ? server.client(all) : new SessionsClient(address, all);
  return { client, attempts, notices };
}

/** A loopback address where nothing listens: a port bound by the OS, then released. */
async function deadAddress(): Promise<string> {
  const socket = net.createServer();
  await new Promise<void>((resolve) => socket.listen(0, "127.0.0.1", resolve));
  const { port } = socket.address() as AddressInfo;
  await new Promise<void>((resolve) => socket.close(() => resolve()));
  return `127.0.0.1:${port}`;
}

/** The error every cancelled call must fail with: CANCELLED, caused by the signal's reason. */
function cancelledBy(reason: unknown) {
  return (e: unknown) => {
    assert.ok(e instanceof SessionsError, `expected SessionsError, got ${String(e)}`);
    assert.equal(e.code, "CANCELLED", e.message);
    assert.equal(e.grpcCode, 1);
    assert.equal(e.reason, null);
    assert.equal(e.cause, reason, "the cause is signal.reason");
    return true;
  };
}

async function drain<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}

function abortListeners(signal: AbortSignal): number {
  return getEventListeners(signal, "abort").length;
}

/**
 * A TCP relay to the server that can hold back the server's bytes. After `hold()` what the server
 * sends waits in the relay until `release()`, while the client's bytes still pass; `sent(marker)`
 * resolves once the client has sent `marker` since `hold()`. A request carrying the marker has
 * then left the client, and no answer can reach it.
 */
class Gate {
  private readonly clients: net.Socket[] = [];
  private readonly upstreams: net.Socket[] = [];
  private readonly held = new Map<net.Socket, Buffer[]>();
  private holding = false;
  private fromClient = "";
  private waiters: { marker: string; resolve: () => void }[] = [];

  private constructor(private readonly listener: net.Server) {}

  static async start(target: string): Promise<Gate> {
    const colon = target.lastIndexOf(":");
    let gate: Gate | undefined;
    const listener = net.createServer((client) => {
      const upstream = net.connect(Number(target.slice(colon + 1)), target.slice(0, colon));
      gate!.clients.push(client);
      gate!.upstreams.push(upstream);
      client.on("data", (chunk: Buffer) => {
        upstream.write(chunk);
        if (gate!.holding) gate!.saw(chunk);
      });
      upstream.on("data", (chunk: Buffer) => {
        if (gate!.holding) gate!.held.set(client, [...(gate!.held.get(client) ?? []), chunk]);
        else client.write(chunk);
      });
      for (const socket of [client, upstream]) socket.on("error", () => {});
      client.on("close", () => upstream.destroy());
      upstream.on("close", () => client.destroy());
    });
    gate = new Gate(listener);
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    return gate;
  }

  get address(): string {
    return `127.0.0.1:${(this.listener.address() as AddressInfo).port}`;
  }

  hold(): void {
    this.holding = true;
    this.fromClient = "";
  }

  release(): void {
    this.holding = false;
    for (const [client, chunks] of this.held) for (const chunk of chunks) client.write(chunk);
    this.held.clear();
  }

  sent(marker: string): Promise<void> {
    return new Promise((resolve) => {
      this.waiters.push({ marker, resolve });
      this.saw(Buffer.alloc(0));
    });
  }

  private saw(chunk: Buffer): void {
    // latin1 maps each byte to one character: a marker split across chunks is still found.
    this.fromClient += chunk.toString("latin1");
    this.waiters = this.waiters.filter(({ marker, resolve }) => {
      if (!this.fromClient.includes(marker)) return true;
      resolve();
      return false;
    });
  }

  close(): void {
    this.listener.close();
    for (const socket of [...this.clients, ...this.upstreams]) socket.destroy();
  }
}

describe("a signal aborted before the call", () => {
  test("every call fails CANCELLED with the signal's reason and sends nothing", async () => {
    const key = freshKey("pre");
    const seeded = raw.object(key).session("s");
    await seeded.appendMessages([msg("a"), msg("b")]);
    const { client, attempts } = observed(null);
    const o = client.object(key);
    const s = o.session("s");
    const reason = new Error("the caller gave up");
    const stop = new AbortController();
    stop.abort(reason);
    const signal = stop.signal;
    const big = { ...msg("big"), pad: "x".repeat(4 * 1024 * 1024) }; // goes through UploadMessage
    const calls: [string, () => Promise<unknown>][] = [
      ["appendMessage", () => s.appendMessage(msg("x"), { signal })],
      ["appendMessage (upload)", () => s.appendMessage(big, { signal })],
      ["appendMessages", () => s.appendMessages([msg("y"), msg("z")], { signal })],
      ["updateMessage", () => s.updateMessage(msg("a", "changed"), { signal })],
      ["updateMessage (upload)", () => s.updateMessage({ ...big, id: "a" }, { signal })],
      ["upsertMessage", () => s.upsertMessage(msg("w"), { signal })],
      ["upsertMessage (upload)", () => s.upsertMessage(big, { signal })],
      ["deleteMessages", () => s.deleteMessages(["a"], { signal })],
      ["clearMessages", () => s.clearMessages({ signal })],
      ["importMessage", () => s.importMessage(msg("i"), { parentId: null, signal })],
      ["importMessages", () => s.importMessages([msg("j")], { signal })],
      ["getMessage", () => s.getMessage("a", { signal })],
      ["getMessages", () => s.getMessages(["a", "b"], { signal })],
      ["getLatestLeaf", () => s.getLatestLeaf({ signal })],
      ["getBranches", () => s.getBranches("a", { signal })],
      ["getHistory", () => s.getHistory({ signal })],
      ["history", () => drain(s.history({ signal }))],
      ["historyBatches", () => drain(s.historyBatches({ signal }))],
      ["getRecentHistory", () => s.getRecentHistory(1000, { signal })],
      ["getHistoryRowStats", () => s.getHistoryRowStats({ signal })],
      ["listSessions", () => o.listSessions({ signal })],
      ["getObjectStats", () => o.getObjectStats({ signal })],
      ["readAttachment", () => o.readAttachment("0".repeat(64), { signal })],
      ["search", () => s.search("text", { signal })],
      ["addCompaction", () => s.addCompaction("summary", "a", "b", { signal })],
      ["listCompactions", () => s.listCompactions({ signal })],
      ["planCompaction", () => s.planCompaction({ signal })],
      ["compact", () => s.compact({ signal })],
      ["compact (summarize)", () => s.compact(() => "summary", { signal })],
      ["setCompactionPolicy", () => s.setCompactionPolicy(0, { signal })],
      ["getCompactionPolicy", () => s.getCompactionPolicy({ signal })],
      ["getMessage (pointers)", () => s.getMessage("a", { pointers: true, signal })],
      ["subscribe (pointers)", () => drain(s.subscribe({ pointers: true, signal }))],
      ["object subscribe", () => drain(o.subscribe({ signal }))],
      ["session subscribe", () => drain(s.subscribe({ signal }))],
    ];
    for (const [name, call] of calls) await assert.rejects(call(), cancelledBy(reason), name);
    assert.deepEqual(attempts, [], "no call started an RPC");
    // Nothing was written: the seeded state is intact.
    assert.deepEqual(await seeded.getHistory(), [msg("a"), msg("b")]);
    assert.deepEqual(await raw.object(key).listSessions(), [{ sessionId: "s", messageCount: 2 }]);
  });

  test("a plain abort() gives its AbortError as the cause", async () => {
    const { client, attempts } = observed(null);
    const stop = new AbortController();
    stop.abort();
    const s = client.object(freshKey("plain")).session();
    await assert.rejects(s.appendMessage(msg("a"), { signal: stop.signal }), cancelledBy(stop.signal.reason));
    assert.equal((stop.signal.reason as Error).name, "AbortError");
    assert.deepEqual(attempts, []);
  });
});

describe("an abort during a retry's wait", () => {
  // The first wait is at least 30 s: a call that ended well before did not wait it out.
  const slow = { maxAttempts: 5, initialBackoffMs: 60_000, maxBackoffMs: 60_000 };

  test("ends the call at once, with no further attempt", { timeout: 20_000 }, async () => {
    let stop = new AbortController();
    const reason = new Error("no longer needed");
    const { client, attempts, notices } = observed(await deadAddress(), {
      retry: slow,
      onRetry: () => stop.abort(reason),
    });
    try {
      const o = client.object("k");
      for (const [method, call] of [
        ["AppendMessage", (signal: AbortSignal) => o.session().appendMessage(msg("a"), { signal })], // unary
        ["GetMessage", (signal: AbortSignal) => o.session().getMessage("a", { signal })], // server stream
        ["ListSessions", (signal: AbortSignal) => o.listSessions({ signal })],
      ] as const) {
        stop = new AbortController();
        attempts.length = 0;
        notices.length = 0;
        const started = performance.now();
        await assert.rejects(call(stop.signal), cancelledBy(reason), method);
        const elapsed = performance.now() - started;
        assert.ok(elapsed < 10_000, `${method} took ${Math.round(elapsed)} ms`);
        assert.deepEqual(attempts, [method], `${method}: one attempt, none after the abort`);
        assert.deepEqual(notices.map((n) => [n.method, n.attempt]), [[method, 1]]);
        assert.ok(notices[0]!.delayMs >= 30_000, "the wait cut short was a long one");
        assert.equal(abortListeners(stop.signal), 0, `${method} left a listener`);
      }
    } finally {
      client.close();
    }
  });

  test("a write the server refused (object locked for a move) is not sent again", async () => {
    const key = freshKey("moving");
    const s = raw.object(key).session();
    await s.appendMessage(msg("a"));
    // Lock the object as a mover does: ExportObject with lock_for_move, read to its end.
    for await (const _ of raw.rpc.exportObject(
      { objectKey: key, lockForMove: true, leaseSeconds: 3600 },
      { headers: routingHeaders(key) },
    ));
    const stop = new AbortController();
    const reason = new Error("user navigated away");
    const { client, attempts, notices } = observed(null, { onRetry: () => stop.abort(reason) });
    try {
      await assert.rejects(
        client.object(key).session().appendMessage(msg("b"), { signal: stop.signal }),
        cancelledBy(reason),
      );
      assert.deepEqual(attempts, ["AppendMessage"]);
      assert.deepEqual(notices.map((n) => [n.attempt, n.error.code, n.error.reason]), [[1, "UNAVAILABLE", "OBJECT_MOVING"]]);
    } finally {
      const unlocked = await raw.rpc.abortMove({ objectKey: key }, { headers: routingHeaders(key) });
      assert.equal(unlocked.wasLocked, true, "the lock was held throughout");
    }
    assert.deepEqual(await s.getHistory(), [msg("a")], "b was never stored");
  });

  test("the retry observer's pending promise does not hold the call", { timeout: 20_000 }, async () => {
    const stop = new AbortController();
    const reason = new Error("stop waiting");
    const { client, attempts, notices } = observed(await deadAddress(), {
      retry: { maxAttempts: 3, initialBackoffMs: 0 },
      onRetry: () => {
        // Aborted once the observer has returned its promise, which never settles.
        setImmediate(() => stop.abort(reason));
        return new Promise<void>(() => {});
      },
    });
    try {
      await assert.rejects(client.object("k").session().appendMessage(msg("a"), { signal: stop.signal }), cancelledBy(reason));
      assert.deepEqual(attempts, ["AppendMessage"]);
      assert.equal(notices.length, 1);
    } finally {
      client.close();
    }
  });
});

describe("an abort while the call is in flight", () => {
  let gate: Gate;
  before(async () => {
    gate = await Gate.start(server.address);
  });
  after(() => gate.close());

  test("cancels a unary call and a stream whose answers are held back", { timeout: 20_000 }, async () => {
    const { client, attempts } = observed(gate.address, { keepaliveMs: 0 });
    try {
      const key = freshKey("inflight");
      const s = client.object(key).session("held");
      await s.appendMessage(msg("first")); // the connection is up before anything is held
      const marker = `marker-${freshKey()}`;
      for (const [method, call] of [
        ["AppendMessage", (signal: AbortSignal) => s.appendMessage(msg(marker), { signal })],
        ["StreamHistory", (signal: AbortSignal) => s.getHistory({ signal, leafId: marker })],
      ] as const) {
        attempts.length = 0;
        const stop = new AbortController();
        const reason = new Error(`abandon ${method}`);
        gate.hold();
        const pending = call(stop.signal);
        await gate.sent(marker); // the request is on the wire; its answer stays in the relay
        stop.abort(reason);
        await assert.rejects(pending, cancelledBy(reason), method);
        assert.deepEqual(attempts, [method], `${method} was not tried again`);
        gate.release();
      }
      // The cancelled streams did not harm the connection.
      assert.deepEqual(await s.getMessage("first"), msg("first"));
    } finally {
      gate.release();
      client.close();
    }
  });

  test("AbortSignal.timeout() ends a call whose answer does not come", { timeout: 20_000 }, async () => {
    const client = new SessionsClient(gate.address, { keepaliveMs: 0 });
    try {
      const s = client.object(freshKey("timeout-signal")).session();
      await s.appendMessage(msg("first"));
      gate.hold();
      const signal = AbortSignal.timeout(200);
      // The reason exists only once the signal has fired: read it when the call has failed.
      await assert.rejects(s.appendMessage(msg("second"), { signal }), (e: unknown) => cancelledBy(signal.reason)(e));
      assert.equal((signal.reason as Error).name, "TimeoutError");
    } finally {
      gate.release();
      client.close();
    }
  });

  test("the client's timeoutMs still ends a call that also has a signal (DEADLINE_EXCEEDED)", { timeout: 20_000 }, async () => {
    const key = freshKey("deadline");
    // The object is made by a client without the short timeout: a first write (the object's
    // file created) on a loaded machine may take longer than the deadline under test.
    const setup = new SessionsClient(gate.address, { keepaliveMs: 0 });
    try {
      await setup.object(key).session().appendMessage(msg("first"));
    } finally {
      setup.close();
    }
    const client = new SessionsClient(gate.address, { keepaliveMs: 0, timeoutMs: 300 });
    try {
      const s = client.object(key).session();
      const signal = new AbortController().signal;
      gate.hold();
      for (const [method, call] of [
        ["AppendMessage", () => s.appendMessage(msg("second"), { signal })], // Connect's deadline
        ["StreamHistory", () => s.getHistory({ signal })], // the client's own deadline timer
      ] as const) {
        await assert.rejects(
          call(),
          (e: unknown) => e instanceof SessionsError && e.code === "DEADLINE_EXCEEDED",
          method,
        );
      }
      assert.equal(signal.aborted, false);
      assert.equal(abortListeners(signal), 0);
    } finally {
      gate.release();
      client.close();
    }
  });
});

describe("a signal that is never aborted", () => {
  /** Every call of a session and its object, with their results. */
  async function scenario(s: SessionHandle, signal?: AbortSignal) {
    const o = s.object;
    const opts = signal === undefined ? {} : { signal };
    const out: Record<string, unknown> = {};
    out.append = await s.appendMessage(msg("a"), opts);
    out.appendLarge = (await s.appendMessage({ ...msg("big"), pad: "é".repeat(2 * 1024 * 1024) }, opts)).inserted;
    out.appendMany = await s.appendMessages([msg("b"), msg("c")], opts);
    out.update = await s.updateMessage(msg("b", "changed"), opts);
    out.upsert = await s.upsertMessage(msg("d"), { parentId: "a", ...opts });
    out.getMessage = await s.getMessage("a", opts);
    out.getMessages = await s.getMessages(["c", "missing"], opts);
    out.latest = await s.getLatestLeaf(opts);
    out.branches = (await s.getBranches("a", opts)).map((m) => m.id);
    out.history = (await s.getHistory(opts)).map((m) => m.id);
    const firstTwo: string[] = [];
    for await (const m of s.history(opts)) {
      firstTwo.push(m.id);
      if (firstTwo.length === 2) break; // a stream left early
    }
    out.firstTwo = firstTwo;
    out.batches = (await drain(s.historyBatches({ batchSize: 1, ...opts }))).map((b) => b.map((m) => m.id));
    out.recent = (await s.getRecentHistory(10_000_000, opts)).messages.map((m) => m.id);
    out.rowStats = (await s.getHistoryRowStats(opts)).map((r) => r.id);
    out.sessions = await o.listSessions(opts);
    out.stats = (({ messageRows, sessionCount }) => ({ messageRows, sessionCount }))(await o.getObjectStats(opts));
    out.pointers = await s.getMessage("a", { pointers: true, ...opts });
    out.search = (await s.search("text", opts)).map((h) => h.id).sort();
    out.added = (await s.addCompaction("summary", "a", "b", opts)).summary;
    out.compactions = (await s.listCompactions(opts)).map((c) => [c.summary, c.fromMessageId, c.toMessageId]);
    out.policy = await s.setCompactionPolicy(0, { keepRecentTokens: 10, ...opts });
    out.policyRead = await s.getCompactionPolicy(opts);
    out.deleted = await s.deleteMessages(["d"], opts);
    out.imported = await s.importMessages([msg("i1"), msg("i2")], opts);
    out.importedOne = await s.importMessage(msg("i3"), { parentId: null, ...opts });
    const feed = o.subscribe({ ...opts, includeProgress: true })[Symbol.asyncIterator]();
    out.feed = (await feed.next()).value?.type;
    await feed.return(undefined);
    out.cleared = await s.clearMessages(opts);
    return out;
  }

  test("changes no result and leaves no listener on the signal", async () => {
    const signal = new AbortController().signal;
    let mostListeners = 0;
    const count: Interceptor = (next) => (req) => {
      mostListeners = Math.max(mostListeners, abortListeners(signal));
      return next(req);
    };
    // With a deadline too: the two work side by side.
    const client = server.client({ timeoutMs: 60_000, interceptors: [count] });
    const withSignal = await scenario(client.object(freshKey("signal")).session("s"), signal);
    const without = await scenario(client.object(freshKey("nosignal")).session("s"));
    assert.deepEqual(withSignal, without);
    assert.equal(withSignal.cleared, 7, "the scenario ran to its end");
    assert.ok(mostListeners >= 1, "calls followed the signal while they ran");
    assert.equal(abortListeners(signal), 0, "every call removed its listener");
    assert.equal(signal.aborted, false);
  });
});

describe("compact(summarize) and its signal", () => {
  test("the summarizer is given the signal; an abort while it runs stores nothing", async () => {
    const key = freshKey("summarize");
    const seeded = raw.object(key).session("s");
    await seeded.appendMessages(
      Array.from({ length: 12 }, (_, i) => msg(`m${String(i).padStart(2, "0")}`, `turn ${i} words `.repeat(200))),
    );
    const { client, attempts } = observed(null);
    const stop = new AbortController();
    const reason = new Error("the summary is no longer wanted");
    let given: AbortSignal | undefined;
    const s = client.object(key).session("s");
    await assert.rejects(
      s.compact(
        (_prompt, { signal }) => {
          given = signal;
          stop.abort(reason);
          return "a summary nobody waits for";
        },
        { keepRecentTokens: 500, signal: stop.signal },
      ),
      cancelledBy(reason),
    );
    assert.equal(given, stop.signal, "the summarizer was given the call's signal");
    assert.deepEqual(attempts, ["PlanCompaction"], "no AddCompaction after the abort");
    assert.deepEqual(await seeded.listCompactions(), []);
    assert.equal(abortListeners(stop.signal), 0);
  });
});
