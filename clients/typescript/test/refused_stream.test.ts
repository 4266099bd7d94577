// Streams the server provably never processed (RFC 9113 §8.7) are retried for every method, even
// ClearMessages, which is not retried after other connection failures. ResettingProxy, an h2c
// front of a real sessions-server (`H2Front`), forwards every stream except the first stream of
// one method, which it answers itself: with RST_STREAM REFUSED_STREAM without forwarding it, with a
// GOAWAY whose last-stream-id is below the stream's id (NO_ERROR: Node's nghttp2 closes the
// stream with REFUSED_STREAM; an error code: Node fails the whole connection, not retried), or
// with RST_STREAM CANCEL after the server answered it (processed: not retried). Node's
// ERR_HTTP2_GOAWAY_SESSION (a stream Node would not open after a GOAWAY) never reaches a call
// through Connect, whose session manager opens a new connection itself, so an interceptor
// injects it. No passing run depends on a timer to order events.
import assert from "node:assert/strict";
import http2 from "node:http2";
import { after, before, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { SessionsClient, SessionsError } from "../src/index.js";
import { H2Front, failure, observed, summary } from "./h2front.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;
/** A client of the server itself, not through the proxy. */
let direct: SessionsClient;

before(async () => {
  server = await TestServer.start();
  direct = server.client({ retry: false });
});
after(async () => {
  await server?.stop();
});

/** What the proxy does with the first stream of its method. */
type Action = "refuse" | "goaway" | "goaway-error" | "cancel";

class ResettingProxy extends H2Front {
  /** The GOAWAY frames the proxy sent: the id of the stream it answered so, and the last-stream-id. */
  readonly goaways: { streamId: number; lastStreamId: number }[] = [];
  private armed = true;

  private constructor(
    target: string,
    private readonly method: string,
    private readonly action: Action,
  ) {
    super(target);
  }

  static async start(target: string, method: string, action: Action): Promise<ResettingProxy> {
    return H2Front.listening(new ResettingProxy(target, method, action));
  }

  protected override onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, method: string): void {
    const action = this.armed && method === this.method ? this.action : null;
    if (action !== null) this.armed = false;
    if (action === "refuse") {
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      return;
    }
    if (action === "goaway" || action === "goaway-error") {
      // Node sends the id of the last stream it received for a last-stream-id of 0 or less: the
      // stream must not be the connection's first (the test makes a call before it).
      const streamId = stream.id ?? 0;
      const lastStreamId = streamId - 2;
      this.goaways.push({ streamId, lastStreamId });
      const code = action === "goaway" ? http2.constants.NGHTTP2_NO_ERROR : http2.constants.NGHTTP2_INTERNAL_ERROR;
      stream.session?.goaway(code, lastStreamId);
      return;
    }
    if (action === "cancel") {
      // The server answers in full (it processed the call); the client gets a CANCEL instead.
      this.forward(stream, headers, (upstream) => {
        upstream.resume();
        upstream.once("end", () => stream.close(http2.constants.NGHTTP2_CANCEL));
      });
      return;
    }
    this.forward(stream, headers);
  }
}

test("a ClearMessages reset with REFUSED_STREAM is sent again and clears the session once", { timeout: 30_000 }, async () => {
  const proxy = await ResettingProxy.start(server.address, "ClearMessages", "refuse");
  const { client, notices } = observed(proxy.address);
  const key = freshKey("refused");
  try {
    const s = client.object(key).session("chat");
    await s.appendMessages([msg("a"), msg("b")]);
    // The refused attempt deleted nothing: the second one deleted both.
    assert.equal(await s.clearMessages(), 2);
    assert.equal(proxy.count("ClearMessages"), 2);
    assert.deepEqual(summary(notices), [["ClearMessages", 1, "UNAVAILABLE", null]]);
    assert.match(notices[0]!.error.message, /NGHTTP2_REFUSED_STREAM/);
    assert.deepEqual(await direct.object(key).session("chat").getHistory(), []);
  } finally {
    client.close();
    await proxy.close();
  }
});

test("a ClearMessages above a GOAWAY's last-stream-id is sent again on a new connection", { timeout: 30_000 }, async () => {
  const proxy = await ResettingProxy.start(server.address, "ClearMessages", "goaway");
  const { client, notices } = observed(proxy.address);
  const key = freshKey("goaway");
  try {
    const s = client.object(key).session("chat");
    await s.appendMessages([msg("a"), msg("b")]); // the connection's first stream
    assert.equal(await s.clearMessages(), 2);
    assert.equal(proxy.goaways.length, 1);
    const [goaway] = proxy.goaways;
    assert.ok(goaway!.lastStreamId >= 1 && goaway!.lastStreamId < goaway!.streamId, JSON.stringify(goaway));
    assert.equal(proxy.count("ClearMessages"), 2);
    assert.equal(proxy.connections, 2);
    assert.deepEqual(summary(notices), [["ClearMessages", 1, "UNAVAILABLE", null]]);
    assert.match(notices[0]!.error.message, /NGHTTP2_REFUSED_STREAM/);
    assert.deepEqual(await direct.object(key).session("chat").getHistory(), []);
  } finally {
    client.close();
    await proxy.close();
  }
});

test("a ClearMessages reset with CANCEL after the server processed it is not sent again", { timeout: 30_000 }, async () => {
  const proxy = await ResettingProxy.start(server.address, "ClearMessages", "cancel");
  const { client, notices } = observed(proxy.address);
  const key = freshKey("cancel");
  try {
    const s = client.object(key).session("chat");
    await s.appendMessages([msg("a"), msg("b")]);
    const error = await failure(s.clearMessages());
    assert.ok(error instanceof SessionsError, `failed with ${String(error)}`);
    assert.equal(error.code, "CANCELLED");
    assert.equal(error.reason, null);
    assert.equal(proxy.count("ClearMessages"), 1);
    assert.deepEqual(notices, []);
    // The server did clear the session: a repeat could have deleted messages appended since.
    assert.deepEqual(await direct.object(key).session("chat").getHistory(), []);
  } finally {
    client.close();
    await proxy.close();
  }
});

test("a GOAWAY with an error code fails ClearMessages without a retry", { timeout: 30_000 }, async () => {
  // Node fails every stream of the connection with ERR_HTTP2_SESSION_ERROR, also those at or
  // below the last-stream-id that the server may have processed: nothing tells them apart.
  const proxy = await ResettingProxy.start(server.address, "ClearMessages", "goaway-error");
  const { client, notices } = observed(proxy.address);
  const key = freshKey("goaway-error");
  try {
    const s = client.object(key).session("chat");
    await s.appendMessages([msg("a"), msg("b")]);
    const error = await failure(s.clearMessages());
    assert.ok(error instanceof SessionsError, `failed with ${String(error)}`);
    assert.equal(error.code, "UNAVAILABLE");
    assert.match(error.message, /Session closed with error code 2/);
    assert.equal(proxy.count("ClearMessages"), 1);
    assert.deepEqual(notices, []);
    assert.equal((await direct.object(key).session("chat").getHistory()).length, 2);
  } finally {
    client.close();
    await proxy.close();
  }
});

test("a stream Node would not open after a GOAWAY (ERR_HTTP2_GOAWAY_SESSION) is sent again", { timeout: 30_000 }, async () => {
  // As connect-node reports Node's error: INTERNAL, with Node's error as the cause.
  let armed = true;
  const goawaySession: Interceptor = (next) => async (req) => {
    if (!armed || req.method.name !== "ClearMessages") return next(req);
    armed = false;
    const cause = Object.assign(new Error("New streams cannot be created after receiving a GOAWAY"), {
      code: "ERR_HTTP2_GOAWAY_SESSION",
    });
    const error = new ConnectError(cause.message, Code.Internal);
    error.cause = cause;
    throw error;
  };
  const { client, notices } = observed(server.address, { interceptors: [goawaySession] });
  const key = freshKey("goaway-session");
  try {
    const s = client.object(key).session("chat");
    await s.appendMessages([msg("a"), msg("b")]);
    assert.equal(await s.clearMessages(), 2);
    assert.deepEqual(summary(notices), [["ClearMessages", 1, "UNAVAILABLE", null]]);
  } finally {
    client.close();
  }
});
