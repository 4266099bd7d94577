// Client-side retries (the contract shared with the Python and Go clients): calls the server
// refused before acting are tried again for every method; transport failures only for methods
// that are safe to repeat; server streams only before their first response; the call's deadline
// and close() bound the whole schedule. Refusals come from a real server (a move lock taken with
// the raw ExportObject, or an upload held open on a server with an 8 MiB --max-assembly-bytes,
// released from the retry observer); transport failures from a loopback
// port where nothing listens, or from an interceptor that drops an attempt before or after the
// server saw it. No passing run depends on a timer to order events.
import assert from "node:assert/strict";
import { createServer, type AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import {
  DEFAULT_RETRY_POLICY,
  SessionsClient,
  SessionsError,
  routingHeaders,
  type ClientOptions,
  type RetryNotice,
} from "../src/index.js";
import {
  Source,
  UploadMessageRequestSchema,
  UploadOperation,
  type UploadMessageRequest,
  type UploadMessageResponse,
} from "../src/gen/sessions/v1/sessions_pb.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;
/** Admin calls through the generated client, with retries off so they never hide a failure. */
let raw: SessionsClient;

before(async () => {
  server = await TestServer.start();
  raw = server.client({ retry: false });
});
after(async () => {
  await server?.stop();
});

/** A loopback address where nothing listens: a port bound by the OS, then released. */
async function deadAddress(): Promise<string> {
  const socket = createServer();
  await new Promise<void>((resolve) => socket.listen(0, "127.0.0.1", resolve));
  const { port } = socket.address() as AddressInfo;
  await new Promise<void>((resolve) => socket.close(() => resolve()));
  return `127.0.0.1:${port}`;
}

/** The RPCs each attempt started (one entry per attempt), recorded by an interceptor. */
function attemptLog(): { attempts: string[]; interceptor: Interceptor } {
  const attempts: string[] = [];
  return {
    attempts,
    interceptor: (next) => (req) => {
      attempts.push(req.method.name);
      return next(req);
    },
  };
}

/** A client (of the test server when `address` is null) with an attempt log and a notice log. */
function observed(address: string | null, options: ClientOptions = {}) {
  const { attempts, interceptor } = attemptLog();
  const notices: RetryNotice[] = [];
  const onRetry = options.onRetry;
  const all: ClientOptions = {
    ...options,
    interceptors: [interceptor, ...(options.interceptors ?? [])],
    onRetry: (notice) => {
      notices.push(notice);
      return onRetry?.(notice);
    },
  };
  const client = address === null ? server.client(all) : new SessionsClient(address, all);
  return { client, attempts, notices };
}

/** Locks `key` for a move, as a mover does: ExportObject with lock_for_move, read to its end. */
async function lockForMove(key: string): Promise<void> {
  const frames = raw.rpc.exportObject(
    { objectKey: key, lockForMove: true, leaseSeconds: 3600 },
    { headers: routingHeaders(key) },
  );
  for await (const _ of frames);
}

async function abortMove(key: string): Promise<boolean> {
  const response = await raw.rpc.abortMove({ objectKey: key }, { headers: routingHeaders(key) });
  return response.wasLocked;
}

/** A ConnectError as the server sends it: a status with an ErrorInfo reason (or none). */
function statusError(code: Code, reason: string | null): ConnectError {
  const error = new ConnectError("injected by the test", code);
  if (reason !== null) {
    const info = new BinaryWriter()
      .tag(1, WireType.LengthDelimited)
      .string(reason)
      .tag(2, WireType.LengthDelimited)
      .string("sessions.v1")
      .finish();
    error.details.push({ type: "google.rpc.ErrorInfo", value: info });
  }
  return error;
}

/**
 * Fails the first attempt of the client's first call with `error`: "before" the request leaves
 * (the server never sees it), or "after" the server answered (a unary answer is lost; a stream
 * breaks after its first response).
 */
function failFirstAttempt(error: () => ConnectError, when: "before" | "after"): Interceptor {
  let armed = true;
  return (next) => async (req) => {
    if (!armed) return next(req);
    armed = false;
    if (when === "before") throw error();
    const res = await next(req);
    if (!res.stream) throw error();
    const responses = res.message;
    async function* breakAfterFirst() {
      for await (const response of responses) {
        yield response;
        throw error();
      }
    }
    return { ...res, message: breakAfterFirst() } as typeof res;
  };
}

function expectFailure(code: string, reason: string | null) {
  return (e: unknown) => {
    assert.ok(e instanceof SessionsError, `expected SessionsError, got ${String(e)}`);
    assert.equal(e.code, code);
    assert.equal(e.reason, reason);
    return true;
  };
}

const tiny = { maxAttempts: 3, initialBackoffMs: 1, maxBackoffMs: 1 };

describe("refused before acting (real server)", () => {
  test("an append refused OBJECT_MOVING succeeds once the observer releases the move lock", async () => {
    const key = freshKey("moving");
    const { client, attempts, notices } = observed(null, {
      // Awaited by the client before its next attempt: the lock is gone when attempt 2 starts.
      onRetry: async (notice) => {
        if (notice.attempt === 1) assert.equal(await abortMove(key), true, "the object was locked");
      },
    });
    const s = client.object(key).session();
    await s.appendMessage(msg("a"));
    await lockForMove(key);
    const appended = await s.appendMessage(msg("b"));
    assert.equal(appended.inserted, true);
    assert.equal(notices.length, 1);
    const [notice] = notices;
    assert.equal(notice!.method, "AppendMessage");
    assert.equal(notice!.attempt, 1);
    assert.ok(notice!.error instanceof SessionsError);
    assert.equal(notice!.error.code, "UNAVAILABLE");
    assert.equal(notice!.error.reason, "OBJECT_MOVING");
    const backoff = DEFAULT_RETRY_POLICY.initialBackoffMs;
    assert.ok(notice!.delayMs >= backoff / 2 && notice!.delayMs <= backoff, `delay ${notice!.delayMs}`);
    assert.equal(attempts.filter((m) => m === "AppendMessage").length, 3, "a, then b twice");
    assert.deepEqual(await s.getHistory(), [msg("a"), msg("b")]);
  });

  test("a large append (UploadMessage) is sent again whole after OBJECT_MOVING", async () => {
    const key = freshKey("moving-upload");
    const { client, attempts, notices } = observed(null, {
      onRetry: async () => {
        await abortMove(key);
      },
    });
    const s = client.object(key).session();
    await s.appendMessage(msg("a"));
    await lockForMove(key);
    const big = { ...msg("big"), pad: "é".repeat(2 * 1024 * 1024) }; // 4 MiB of UTF-8: streamed in pieces
    const appended = await s.appendMessage(big);
    assert.equal(appended.inserted, true);
    assert.deepEqual(notices.map((n) => [n.method, n.attempt, n.error.reason]), [["UploadMessage", 1, "OBJECT_MOVING"]]);
    assert.equal(attempts.filter((m) => m === "UploadMessage").length, 2);
    assert.deepEqual(await s.getMessage("big"), big);
  });

  test("with retry: false the append fails UNAVAILABLE / OBJECT_MOVING and stores nothing", async () => {
    const key = freshKey("moving-off");
    const { client, attempts, notices } = observed(null, { retry: false });
    const s = client.object(key).session();
    await s.appendMessage(msg("a"));
    await lockForMove(key);
    try {
      await assert.rejects(s.appendMessage(msg("b")), expectFailure("UNAVAILABLE", "OBJECT_MOVING"));
      assert.equal(notices.length, 0);
      assert.equal(attempts.filter((m) => m === "AppendMessage").length, 2, "a once, b once");
    } finally {
      assert.equal(await abortMove(key), true, "the lock was still held");
    }
    assert.deepEqual(await s.getHistory(), [msg("a")]);
  });

  test("an array's import is sent again whole after OBJECT_MOVING; another iterable's is not retried", async () => {
    const key = freshKey("moving-import");
    const { client, attempts, notices } = observed(null, {
      onRetry: async (notice) => {
        if (notice.attempt === 1) assert.equal(await abortMove(key), true, "the object was locked");
      },
    });
    const s = client.object(key).session();
    await s.appendMessage(msg("a"));
    await lockForMove(key);
    assert.deepEqual(await s.importMessages([msg("x"), msg("y")]), { imported: 2, skipped: 0 });
    assert.deepEqual(notices.map((n) => [n.method, n.attempt, n.error.reason]), [["ImportMessages", 1, "OBJECT_MOVING"]]);
    assert.equal(attempts.filter((m) => m === "ImportMessages").length, 2);
    assert.deepEqual(await s.getHistory({ leafId: "y" }), [msg("x"), msg("y")]);

    await lockForMove(key);
    try {
      await assert.rejects(s.importMessages([msg("z")].values()), expectFailure("UNAVAILABLE", "OBJECT_MOVING"));
      assert.equal(notices.length, 1);
      assert.equal(attempts.filter((m) => m === "ImportMessages").length, 3);
    } finally {
      assert.equal(await abortMove(key), true, "the lock was still held");
    }
    assert.equal(await s.getMessage("z"), null);
  });

  test("OBJECT_NOT_OWNED (the object moved away) is retried, then its error is thrown", async () => {
    const key = freshKey("moved");
    const { client, notices } = observed(null, { retry: tiny });
    const s = client.object(key).session();
    await s.appendMessage(msg("a"));
    await raw.rpc.deleteObject({ objectKey: key, movedTo: "elsewhere" }, { headers: routingHeaders(key) });
    await assert.rejects(s.appendMessage(msg("b")), expectFailure("FAILED_PRECONDITION", "OBJECT_NOT_OWNED"));
    assert.deepEqual(notices.map((n) => [n.method, n.attempt, n.error.reason]), [
      ["AppendMessage", 1, "OBJECT_NOT_OWNED"],
      ["AppendMessage", 2, "OBJECT_NOT_OWNED"],
    ]);
  });
});

/** The sessions_assembly_bytes gauge of a server's Prometheus endpoint. */
async function assemblyBytes(metricsAddress: string): Promise<number> {
  const text = await (await fetch(`http://${metricsAddress}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("sessions_assembly_bytes "));
  assert.ok(line !== undefined, "the endpoint has sessions_assembly_bytes");
  return Number(line.slice("sessions_assembly_bytes ".length));
}

/**
 * Streams a message of about `size` bytes of text through the raw UploadMessage (retries off)
 * and holds back its last piece until `released` settles: until then the server holds what came
 * of it.
 */
function heldUpload(
  client: SessionsClient,
  key: string,
  sessionId: string,
  size: number,
  released: Promise<void>,
): Promise<UploadMessageResponse> {
  async function* frames(): AsyncGenerator<UploadMessageRequest> {
    const header = { objectKey: key, sessionId, operation: UploadOperation.APPEND, source: Source.SERVER };
    yield create(UploadMessageRequestSchema, { header, jsonPiece: '{"id":"held","role":"user","parts":[{"type":"text","text":"' });
    const piece = 256 * 1024;
    for (let sent = 0; sent + piece <= size; sent += piece) {
      yield create(UploadMessageRequestSchema, { jsonPiece: "h".repeat(piece) });
    }
    await released;
    yield create(UploadMessageRequestSchema, { jsonPiece: '"}]}' });
  }
  return client.rpc.uploadMessage(frames(), { headers: routingHeaders(key) });
}

describe("refused while the server is busy with large messages (a server with an 8 MiB budget)", () => {
  const budget = 8 * 1024 * 1024;
  let busy: TestServer;
  let metricsAddress: string;
  before(async () => {
    metricsAddress = await deadAddress(); // a free port for the metrics endpoint
    busy = await TestServer.start(["--max-assembly-bytes", String(budget), "--metrics-listen", metricsAddress]);
  });
  after(async () => {
    await busy?.stop();
  });

  test("an append refused SERVER_BUSY lands once the observer lets the held upload finish; one over the budget fails LIMIT_EXCEEDED", async () => {
    const key = freshKey("busy");
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    // The upload keeps 7 MiB of the 8 MiB while its last piece is held back.
    const upload = heldUpload(busy.client({ retry: false }), key, "s", 7 * 1024 * 1024, released);
    const settled = upload.then(
      () => "stored",
      (e: unknown) => `failed: ${String(e)}`,
    );
    try {
      // Poll (with a deadline) until the server holds the upload's bytes.
      const deadline = performance.now() + 30_000;
      let held = 0;
      let ended: string | null = null;
      void settled.then((outcome) => (ended = outcome));
      while (held < 7 * 1024 * 1024) {
        assert.equal(ended, null, "the held upload ended before the server held its bytes");
        assert.ok(performance.now() < deadline, `the server held ${held} bytes after 30 s`);
        await new Promise((resolve) => setTimeout(resolve, 10)); // polling interval, not synchronisation
        held = await assemblyBytes(metricsAddress).catch(() => 0);
      }

      const { client, attempts, notices } = observed(busy.address, {
        // Awaited by the client before its next attempt: the upload is stored and its bytes
        // given back when attempt 2 starts.
        onRetry: async () => {
          release();
          await settled;
        },
      });
      try {
        const s = client.object(key).session("s");
        const appended = await s.appendMessage(msg("m1", "t".repeat(2 * 1024 * 1024)));
        assert.equal(await settled, "stored");
        assert.equal((await upload).inserted, true);
        assert.equal(appended.inserted, true);
        assert.equal(appended.parentId, "held", "appended after the upload's message");
        assert.deepEqual(notices.map((n) => [n.method, n.attempt, n.error.code, n.error.reason]), [
          ["AppendMessage", 1, "RESOURCE_EXHAUSTED", "SERVER_BUSY"],
        ]);
        assert.deepEqual(attempts, ["AppendMessage", "AppendMessage"]);

        // Larger than the whole budget: nothing else holds any of it, and no retry could help.
        notices.length = 0;
        attempts.length = 0;
        await assert.rejects(
          s.appendMessage(msg("huge", "t".repeat(9 * 1024 * 1024))),
          expectFailure("RESOURCE_EXHAUSTED", "LIMIT_EXCEEDED"),
        );
        assert.equal(notices.length, 0);
        assert.deepEqual(attempts, ["UploadMessage"]);
        assert.deepEqual((await s.getHistory()).map((m) => m.id), ["held", "m1"]);
      } finally {
        client.close();
      }
    } finally {
      release();
      await settled;
    }
  });
});

describe("transport failures (nothing listening)", () => {
  test("repeatable calls fail UNAVAILABLE after exactly maxAttempts attempts", async () => {
    const { client, attempts, notices } = observed(await deadAddress(), { retry: tiny });
    try {
      const s = client.object("k").session();
      for (const [method, call] of [
        ["GetMessage", () => s.getMessage("a")],
        ["AppendMessage", () => s.appendMessage(msg("a"))],
        ["StreamHistory", () => s.getHistory()],
        ["ListSessions", () => client.object("k").listSessions()],
        ["ImportMessages", () => s.importMessages([msg("a")])],
        ["SearchMessages", () => s.search("a")],
        ["ReadAttachment", () => client.object("k").readAttachment("0".repeat(64))],
        ["ListCompactions", () => s.listCompactions()],
        ["PlanCompaction", () => s.planCompaction()],
        ["PlanCompaction", () => s.compact(() => "summary")], // plans first; never reaches AddCompaction
        ["GetCompactionPolicy", () => s.getCompactionPolicy()],
        ["SetCompactionPolicy", () => s.setCompactionPolicy(0, { keepRecentTokens: 100 })],
        ["GetMessage", () => s.getMessage("a", { pointers: true })],
      ] as const) {
        attempts.length = 0;
        notices.length = 0;
        await assert.rejects(call(), expectFailure("UNAVAILABLE", null), method);
        assert.deepEqual(attempts, [method, method, method], method);
        assert.deepEqual(notices.map((n) => [n.method, n.attempt, n.error.code]), [
          [method, 1, "UNAVAILABLE"],
          [method, 2, "UNAVAILABLE"],
        ]);
      }
    } finally {
      client.close();
    }
  });

  test("ClearMessages, AddCompaction, Compact and an import from a non-array iterable fail at once", async () => {
    // A repeated clear could remove what others appended in between, a repeated AddCompaction or
    // Compact would store a second record (no id); an iterable may not yield twice.
    const { client, attempts, notices } = observed(await deadAddress(), { retry: tiny });
    try {
      const s = client.object("k").session();
      await assert.rejects(s.clearMessages(), expectFailure("UNAVAILABLE", null));
      await assert.rejects(s.importMessages([msg("a")].values()), expectFailure("UNAVAILABLE", null));
      await assert.rejects(s.addCompaction("summary", "a", "b"), expectFailure("UNAVAILABLE", null));
      await assert.rejects(s.compact(), expectFailure("UNAVAILABLE", null));
      await assert.rejects(s.compact({ keepRecentTokens: 100 }), expectFailure("UNAVAILABLE", null));
      assert.deepEqual(attempts, ["ClearMessages", "ImportMessages", "AddCompaction", "Compact", "Compact"]);
      assert.equal(notices.length, 0);
    } finally {
      client.close();
    }
  });

  test("waits follow the policy: min(max, initial * multiplier^(n-1)) times a factor in [0.5, 1]", async () => {
    const policy = { maxAttempts: 5, initialBackoffMs: 2, multiplier: 3, maxBackoffMs: 10 };
    const { client, notices } = observed(await deadAddress(), { retry: policy });
    try {
      await assert.rejects(client.object("k").session().getMessage("a"), expectFailure("UNAVAILABLE", null));
      assert.deepEqual(notices.map((n) => n.attempt), [1, 2, 3, 4]);
      for (const [index, backoff] of [2, 6, 10, 10].entries()) {
        const { delayMs } = notices[index]!;
        assert.ok(delayMs >= backoff / 2 && delayMs <= backoff, `wait ${index + 1}: ${delayMs} for ${backoff}`);
      }
    } finally {
      client.close();
    }
  });

  test("the per-call timeout bounds attempts and waits together", async () => {
    const timeoutMs = 300;
    const policy = { maxAttempts: 50, initialBackoffMs: 100, maxBackoffMs: 100, multiplier: 1 };
    const sentTimeouts: number[] = [];
    const recordTimeout: Interceptor = (next) => (req) => {
      const header = req.header.get("grpc-timeout");
      if (header !== null) sentTimeouts.push(Number(/^(\d+)m$/.exec(header)?.[1]));
      return next(req);
    };
    const { client, notices } = observed(await deadAddress(), {
      retry: policy,
      timeoutMs,
      interceptors: [recordTimeout],
    });
    try {
      const s = client.object("k").session();
      for (const [method, call] of [
        ["AppendMessage", () => s.appendMessage(msg("a"))], // unary: Connect's deadline per attempt
        ["GetMessage", () => s.getMessage("a")], // server stream: the client's own deadline timer
      ] as const) {
        notices.length = 0;
        await assert.rejects(
          call(),
          (e: unknown) => {
            // The last attempt's error: the refusal, or, when that attempt began with little of the
            // deadline left on a loaded machine, its own deadline (a CI run saw it once).
            assert.ok(e instanceof SessionsError, `expected SessionsError, got ${String(e)}`);
            assert.ok(e.code === "UNAVAILABLE" || e.code === "DEADLINE_EXCEEDED", `${method}: ${e.message}`);
            assert.equal(e.reason, null);
            return true;
          },
          method,
        );
        assert.ok(notices.length >= 1, `${method} was retried`);
        assert.ok(notices.length < policy.maxAttempts - 1, `${method}: ${notices.length} waits, not the whole schedule`);
        // No wait is begun that would end past the deadline, so the waits fit inside it.
        const waited = notices.reduce((sum, n) => sum + n.delayMs, 0);
        assert.ok(waited < timeoutMs, `${method} waited ${waited} ms in all`);
        if (method === "AppendMessage") {
          // Each unary attempt is given only what is left: at most the timeout less the waits so far.
          // An attempt follows every wait, unless the wait's timer fired so late (a loaded machine)
          // that less than 1 ms of the deadline was left: then the call ends without it.
          assert.ok(
            sentTimeouts.length === notices.length + 1 || sentTimeouts.length === notices.length,
            `${sentTimeouts.length} attempts after ${notices.length} waits`,
          );
          assert.equal(sentTimeouts[0], timeoutMs);
          let left = timeoutMs;
          for (const [index, notice] of notices.entries()) {
            left -= notice.delayMs;
            if (index + 1 < sentTimeouts.length) {
              assert.ok(sentTimeouts[index + 1]! <= left, `attempt ${index + 2} was given ${sentTimeouts[index + 1]} ms of ${left}`);
            }
          }
        }
      }
    } finally {
      client.close();
    }
  });

  test("every wait lasts its whole delay by performance.now(), though Node's timers may fire early", async () => {
    // Node's timers run on libuv's coarse whole-millisecond clock: a timer for a fractional delay
    // often fires up to a millisecond or two before that delay has passed. Short waits make it likely.
    const policy = { maxAttempts: 40, initialBackoffMs: 3, maxBackoffMs: 3, multiplier: 1 };
    const started: number[] = [];
    const failed: number[] = [];
    const stamp: Interceptor = (next) => async (req) => {
      started.push(performance.now());
      try {
        return await next(req);
      } catch (error) {
        failed.push(performance.now());
        throw error;
      }
    };
    const { client, notices } = observed(await deadAddress(), { retry: policy, interceptors: [stamp] });
    try {
      await assert.rejects(client.object("k").session().appendMessage(msg("a")), expectFailure("UNAVAILABLE", null));
      assert.equal(notices.length, policy.maxAttempts - 1);
      assert.equal(started.length, policy.maxAttempts);
      for (const [index, notice] of notices.entries()) {
        const waited = started[index + 1]! - failed[index]!;
        assert.ok(waited >= notice.delayMs, `attempt ${index + 2} began ${waited} ms after a failure, not ${notice.delayMs}`);
      }
    } finally {
      client.close();
    }
  });

  test("close() ends a wait at once; the call fails as closed (CANCELLED), as in Python and Go", { timeout: 20_000 }, async () => {
    const policy = { maxAttempts: 5, initialBackoffMs: 60_000, maxBackoffMs: 60_000 };
    const { client, attempts, notices } = observed(await deadAddress(), {
      retry: policy,
      onRetry: () => client.close(),
    });
    const s = client.object("k").session();
    // It rejected with the last attempt's UNAVAILABLE, which reads as an outage (client audit).
    await assert.rejects(s.getMessage("a"), /CANCELLED: the client is closed/);
    // The first call's notice closed the client; the second call is refused without an attempt.
    await assert.rejects(s.appendMessage(msg("a")), /CANCELLED: the client is closed/);
    assert.equal(notices.length, 1);
    assert.deepEqual(attempts, ["GetMessage"]);
  });
});

describe("which failures are retried (injected on the first attempt, real server behind)", () => {
  const cases: {
    name: string;
    code: Code;
    reason: string | null;
    clear: boolean;
    append: boolean;
  }[] = [
    { name: "UNAVAILABLE / DRAINING", code: Code.Unavailable, reason: "DRAINING", clear: true, append: true },
    { name: "UNAVAILABLE / OBJECT_MOVING", code: Code.Unavailable, reason: "OBJECT_MOVING", clear: true, append: true },
    { name: "FAILED_PRECONDITION / OBJECT_NOT_OWNED", code: Code.FailedPrecondition, reason: "OBJECT_NOT_OWNED", clear: true, append: true },
    { name: "UNAVAILABLE without a reason", code: Code.Unavailable, reason: null, clear: false, append: true },
    { name: "UNAVAILABLE / another reason", code: Code.Unavailable, reason: "SOMETHING_ELSE", clear: false, append: false },
    { name: "FAILED_PRECONDITION without a reason", code: Code.FailedPrecondition, reason: null, clear: false, append: false },
    { name: "RESOURCE_EXHAUSTED / SERVER_BUSY", code: Code.ResourceExhausted, reason: "SERVER_BUSY", clear: true, append: true },
    { name: "RESOURCE_EXHAUSTED", code: Code.ResourceExhausted, reason: null, clear: false, append: false },
    { name: "RESOURCE_EXHAUSTED / LIMIT_EXCEEDED", code: Code.ResourceExhausted, reason: "LIMIT_EXCEEDED", clear: false, append: false },
    { name: "INTERNAL / STORAGE_FAILURE", code: Code.Internal, reason: "STORAGE_FAILURE", clear: false, append: false },
    { name: "DEADLINE_EXCEEDED", code: Code.DeadlineExceeded, reason: null, clear: false, append: false },
    // The server's (a stopping server's gRPC cancels the calls that reached it), not the caller's.
    { name: "CANCELLED", code: Code.Canceled, reason: null, clear: false, append: true },
  ];
  for (const c of cases) {
    for (const method of ["ClearMessages", "AppendMessage"] as const) {
      const retried = method === "ClearMessages" ? c.clear : c.append;
      test(`${c.name}: ${method} ${retried ? "is" : "is not"} retried`, async () => {
        const inject = failFirstAttempt(() => statusError(c.code, c.reason), "before");
        const { client, attempts, notices } = observed(null, { retry: tiny, interceptors: [inject] });
        const s = client.object(freshKey("classify")).session();
        const call = method === "ClearMessages" ? () => s.clearMessages() : () => s.appendMessage(msg("a"));
        if (retried) {
          await call();
          assert.deepEqual(attempts, [method, method]);
          assert.deepEqual(notices.map((n) => [n.method, n.attempt, n.error.grpcCode, n.error.reason]), [
            [method, 1, c.code, c.reason],
          ]);
        } else {
          await assert.rejects(call(), (e: unknown) => e instanceof SessionsError && e.grpcCode === c.code);
          assert.deepEqual(attempts, [method]);
          assert.equal(notices.length, 0);
        }
      });
    }
  }

  test("an append whose answer was lost is retried and finds its own message (inserted: false)", async () => {
    const inject = failFirstAttempt(() => statusError(Code.Unavailable, null), "after");
    const { client, attempts } = observed(null, { retry: tiny, interceptors: [inject] });
    const s = client.object(freshKey("lost")).session();
    const appended = await s.appendMessage(msg("a"));
    assert.equal(appended.inserted, false, "the first attempt stored it");
    assert.deepEqual(appended.message, msg("a"));
    assert.deepEqual(attempts, ["AppendMessage", "AppendMessage"]);
    assert.deepEqual(await s.getHistory(), [msg("a")]);
  });
});

describe("server streams", () => {
  test("a history read that fails before its first response is read again whole", async () => {
    const key = freshKey("stream");
    await raw.object(key).session().appendMessages([msg("a"), msg("b"), msg("c")]);
    const inject = failFirstAttempt(() => statusError(Code.Unavailable, null), "before");
    const { client, attempts, notices } = observed(null, { retry: tiny, interceptors: [inject] });
    assert.deepEqual(await client.object(key).session().getHistory(), [msg("a"), msg("b"), msg("c")]);
    assert.deepEqual(attempts, ["StreamHistory", "StreamHistory"]);
    assert.deepEqual(notices.map((n) => [n.method, n.attempt]), [["StreamHistory", 1]]);
  });

  test("a history read that fails after its first response is not retried: the caller has the data", async () => {
    const key = freshKey("stream-late");
    await raw.object(key).session().appendMessages([msg("a"), msg("b"), msg("c")]);
    const inject = failFirstAttempt(() => statusError(Code.Unavailable, null), "after");
    const { client, attempts, notices } = observed(null, { retry: tiny, interceptors: [inject] });
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const m of client.object(key).session().history()) seen.push(m.id);
      })(),
      expectFailure("UNAVAILABLE", null),
    );
    assert.deepEqual(seen, ["a", "b", "c"], "the first (packed) response was delivered once");
    assert.deepEqual(attempts, ["StreamHistory"]);
    assert.equal(notices.length, 0);
  });

  // A wrapped subscribe would connect again and wait for events: the timeout fails the test.
  test("subscribe is not wrapped: its reconnect loop alone decides", { timeout: 10_000 }, async () => {
    const inject = failFirstAttempt(() => statusError(Code.Unavailable, "DRAINING"), "before");
    const { client, attempts, notices } = observed(null, { interceptors: [inject] });
    const stop = new AbortController();
    const feed = client.object(freshKey("feed")).subscribe({ reconnectAttempts: 0, signal: stop.signal });
    try {
      await assert.rejects(feed.next(), expectFailure("UNAVAILABLE", "DRAINING"));
    } finally {
      stop.abort();
    }
    assert.deepEqual(attempts, ["Subscribe"]);
    assert.equal(notices.length, 0);
  });
});

describe("observer", () => {
  test("the next attempt waits for the promise onRetry returns", async () => {
    const events: string[] = [];
    const log: Interceptor = (next) => (req) => {
      events.push("attempt");
      return next(req);
    };
    const { client } = observed(await deadAddress(), {
      retry: { maxAttempts: 2, initialBackoffMs: 0 },
      interceptors: [log],
      onRetry: async () => {
        // Longer than the (zero) backoff: an observer not waited for would be overtaken here.
        await new Promise((resolve) => setTimeout(resolve, 20));
        events.push("observer done");
      },
    });
    try {
      await assert.rejects(client.object("k").session().getMessage("a"), expectFailure("UNAVAILABLE", null));
      assert.deepEqual(events, ["attempt", "observer done", "attempt"]);
    } finally {
      client.close();
    }
  });

  test("an observer that throws fails the call with its own error, and no attempt follows", async () => {
    const boom = new Error("observer failed");
    const { client, attempts } = observed(await deadAddress(), {
      retry: tiny,
      onRetry: () => {
        throw boom;
      },
    });
    try {
      await assert.rejects(client.object("k").session().appendMessage(msg("a")), (e: unknown) => e === boom);
      assert.deepEqual(attempts, ["AppendMessage"]);
    } finally {
      client.close();
    }
  });
});

describe("policy", () => {
  test("defaults are the shared contract's", () => {
    assert.deepEqual({ ...DEFAULT_RETRY_POLICY }, { maxAttempts: 10, initialBackoffMs: 50, maxBackoffMs: 2000, multiplier: 2 });
    assert.ok(Object.isFrozen(DEFAULT_RETRY_POLICY));
  });

  test("an out-of-range policy is a RangeError at construction", () => {
    for (const retry of [{ maxAttempts: 0 }, { maxAttempts: 1.5 }, { initialBackoffMs: -1 }, { maxBackoffMs: Number.NaN }, { multiplier: Infinity }]) {
      assert.throws(() => new SessionsClient("127.0.0.1:1", { retry }), RangeError, JSON.stringify(retry));
    }
  });

  test("a timeoutMs of 0 or less, or past Node's timers, is a RangeError, as Python's ValueError: it failed every call at once", () => {
    for (const timeoutMs of [0, -1, Number.NaN, Infinity, 2 ** 31]) {
      assert.throws(
        () => new SessionsClient("127.0.0.1:1", { timeoutMs }),
        (e: unknown) => e instanceof RangeError && e.message.includes("timeoutMs must be a number > 0 and at most 2147483647"),
        `timeoutMs ${timeoutMs}`,
      );
    }
    new SessionsClient("127.0.0.1:1", { timeoutMs: 1 }).close();
    new SessionsClient("127.0.0.1:1", { timeoutMs: 2 ** 31 - 1 }).close();
  });

  test("a multiplier below 1 is a RangeError (waits never shrink), as Python's ValueError", () => {
    for (const multiplier of [0.5, 0, 0.999, -1]) {
      assert.throws(
        () => new SessionsClient("127.0.0.1:1", { retry: { multiplier } }),
        (e: unknown) => e instanceof RangeError && e.message.includes("retry.multiplier must be a finite number >= 1"),
        `multiplier ${multiplier}`,
      );
    }
    for (const multiplier of [1, 1.5]) new SessionsClient("127.0.0.1:1", { retry: { multiplier } }).close();
  });
});

describe("many calls backing off at once", () => {
  test("waiting out their backoffs together raises no listener-leak warning", async () => {
    // Twenty reads to a port nobody listens on: each fails its connection and waits out a
    // backoff, listening on the client's close signal meanwhile. Past ten, Node warned of a leak.
    const warnings: Error[] = [];
    const onWarning = (warning: Error): void => {
      warnings.push(warning);
    };
    process.on("warning", onWarning);
    const nowhere = new SessionsClient("127.0.0.1:1", {
      retry: { maxAttempts: 2, initialBackoffMs: 50, maxBackoffMs: 50 },
    });
    try {
      const session = nowhere.object(freshKey("backoffs")).session();
      const outcomes = await Promise.allSettled(Array.from({ length: 20 }, () => session.getMessage("m")));
      assert.ok(outcomes.every((outcome) => outcome.status === "rejected"));
      await new Promise((resolve) => setImmediate(resolve)); // a warning is emitted on the next tick
    } finally {
      nowhere.close();
      process.off("warning", onWarning);
    }
    assert.deepEqual(
      warnings.filter((warning) => warning.name === "MaxListenersExceededWarning").map((w) => w.message),
      [],
    );
  });
});
