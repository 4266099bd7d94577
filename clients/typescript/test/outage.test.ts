// A server that dies or stalls under a client's calls, as the Python and Go clients handle it.
//
// Killed (SIGKILL) with a write in flight, a server leaves the client a reset connection (Connect:
// ABORTED "read ECONNRESET") or one closed under the call (Connect: CANCELLED, "http/2 stream
// closed with error code CANCEL"): both are connection failures, UNAVAILABLE, and a repeatable
// write is retried until the server is back. A server that accepts connections but never speaks
// HTTP/2 (a plain TCP listener; a stopped process whose kernel still completes the TCP handshake)
// fails a new connection after `connectTimeoutMs` instead of holding the call forever.
import assert from "node:assert/strict";
import net, { type AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { SessionsClient, SessionsError } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;

before(async () => {
  server = await TestServer.start();
});
after(async () => {
  await server?.stop();
});

/** `promise`'s error (or "no error"), or "still waiting" when it takes longer than `ms`: the test then fails instead of hanging. */
async function failureWithin(promise: Promise<unknown>, ms: number): Promise<unknown> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise.then(
      () => "no error",
      (error: unknown) => error,
    ),
    new Promise<string>((resolve) => {
      timer = setTimeout(() => resolve(`still waiting ${ms} ms later`), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** A TCP listener that accepts connections and never answers (a stopped server's kernel does as much). */
async function silentListener(): Promise<{ silent: net.Server; sockets: net.Socket[]; address: string }> {
  const sockets: net.Socket[] = [];
  const silent = net.createServer((socket) => {
    sockets.push(socket);
    socket.on("error", () => {});
  });
  await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  return { silent, sockets, address: `127.0.0.1:${(silent.address() as AddressInfo).port}` };
}

/** Resolves once `condition()` holds, checked every few milliseconds; rejects after `ms`. */
async function until(condition: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = performance.now() + ms;
  while (!condition()) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

test("appends survive the server being killed and restarted under them: none fails, none is lost or doubled", { timeout: 120_000 }, async () => {
  const KILLS = 4;
  const BETWEEN = 40; // appends between kills
  // Retries outlast a restart of the server (a second or so, more on a busy machine).
  const notices: string[] = [];
  const client = server.client({
    retry: { maxAttempts: 200, maxBackoffMs: 100 },
    onRetry: ({ error }) => {
      notices.push(`${error.code} ${error.rawMessage}`);
    },
  });
  const session = client.object(freshKey("killed")).session();
  const results: { id: string; inserted: boolean; parentId: string | null }[] = [];
  const failures: string[] = [];
  let stop = false;
  const writer = (async () => {
    for (let i = 0; !stop; i++) {
      const id = `w${i}`;
      try {
        const result = await session.appendMessage(msg(id));
        results.push({ id, inserted: result.inserted, parentId: result.parentId });
      } catch (error) {
        failures.push(`${id}: ${String(error)}`);
        results.push({ id, inserted: false, parentId: "(failed)" });
      }
    }
  })();
  try {
    for (let kill = 1; kill <= KILLS; kill++) {
      const target = results.length + BETWEEN;
      await until(() => results.length >= target || failures.length > 0, 60_000, `${target} appends`);
      await server.kill(); // an append is in flight: the writer never waits between them
      await server.restart();
    }
    const target = results.length + BETWEEN;
    await until(() => results.length >= target || failures.length > 0, 60_000, `${target} appends`);
  } finally {
    stop = true;
    await writer;
  }
  assert.deepEqual(failures, [], `retried after: ${notices.slice(0, 5).join("; ")}`);
  // Each append attached to the one before (auto parent), whether its answer came from the
  // attempt that stored it or from a retry that found it stored (inserted: false).
  for (const [index, result] of results.entries()) {
    assert.equal(result.parentId, index === 0 ? null : results[index - 1]!.id, `parent of ${result.id}`);
  }
  const stored = (await session.getHistory()).map((m) => m.id);
  assert.deepEqual(stored, results.map((r) => r.id), "history holds every append once, in order");
  // Not only refused connections while the server was down: an append was in flight at a kill.
  const inFlight = notices.filter((notice) => !/ECONNREFUSED/.test(notice));
  assert.ok(inFlight.length > 0, `no append was in flight at a kill: ${notices.join("; ")}`);
});

test("a server that accepts connections but never speaks HTTP/2 fails the call UNAVAILABLE after connectTimeoutMs", { timeout: 30_000 }, async () => {
  const { silent, sockets, address } = await silentListener();
  // Keepalive off: only the connect deadline can end the wait.
  const client = new SessionsClient(address, { connectTimeoutMs: 300, keepaliveMs: 0, retry: false });
  try {
    const started = performance.now();
    const error = await failureWithin(client.object(freshKey()).session().appendMessage(msg("m1")), 10_000);
    assert.ok(error instanceof SessionsError, String(error));
    assert.equal(error.code, "UNAVAILABLE", error.message);
    assert.equal(error.reason, null);
    assert.match(error.message, /connectTimeoutMs/);
    assert.ok(performance.now() - started >= 250, "not before the deadline");
    assert.equal(sockets.length, 1);
  } finally {
    client.close();
    silent.close();
    for (const socket of sockets) socket.destroy();
  }
});

test("a connect deadline is retried as any connection failure: one new connection per attempt", { timeout: 30_000 }, async () => {
  const { silent, sockets, address } = await silentListener();
  const attempts: number[] = [];
  const client = new SessionsClient(address, {
    connectTimeoutMs: 200,
    keepaliveMs: 0,
    retry: { maxAttempts: 3, initialBackoffMs: 1 },
    onRetry: ({ attempt }) => {
      attempts.push(attempt);
    },
  });
  try {
    const error = await failureWithin(client.object(freshKey()).session().getHistory(), 10_000);
    assert.ok(error instanceof SessionsError, String(error));
    assert.equal(error.code, "UNAVAILABLE", error.message);
    assert.deepEqual(attempts, [1, 2]);
    assert.equal(sockets.length, 3, "each attempt gave up its connection and opened a new one");
  } finally {
    client.close();
    silent.close();
    for (const socket of sockets) socket.destroy();
  }
});

test("a stalled server (SIGSTOP) fails the calls of a connected client UNAVAILABLE instead of holding them", { timeout: 60_000 }, async () => {
  const stalled = await TestServer.start();
  try {
    const client = stalled.client({
      keepaliveMs: 300,
      keepaliveTimeoutMs: 300,
      connectTimeoutMs: 300,
      retry: { maxAttempts: 2, initialBackoffMs: 1 },
    });
    const session = client.object(freshKey()).session();
    await session.appendMessage(msg("warm"));
    stalled.signal("SIGSTOP");
    // The open connection is found dead by keepalive; the retry's new connection (the kernel
    // still completes TCP handshakes for a stopped process) by the connect deadline.
    const error = await failureWithin(session.appendMessage(msg("stalled")), 10_000);
    assert.ok(error instanceof SessionsError, String(error));
    assert.equal(error.code, "UNAVAILABLE", error.message);
    // A cold client too, with keepalive off: only the connect deadline ends its wait.
    const cold = stalled.client({ keepaliveMs: 0, connectTimeoutMs: 300, retry: false });
    const coldError = await failureWithin(cold.object(freshKey()).session().appendMessage(msg("cold")), 10_000);
    assert.ok(coldError instanceof SessionsError, String(coldError));
    assert.equal(coldError.code, "UNAVAILABLE", coldError.message);
    assert.match(coldError.message, /connectTimeoutMs/);
  } finally {
    stalled.signal("SIGCONT");
    await stalled.stop();
  }
});
