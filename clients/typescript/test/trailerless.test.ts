// A proxy that loses the server's connection under a call it has begun to answer ends the
// client's stream without trailers: HAProxy sends the server's response headers, then an empty
// DATA frame with END_STREAM, and no grpc-status. TrailerlessFront, an h2c front of a real
// sessions-server (`H2Front`), does so with the first stream of one method once the server has
// answered it (the call was carried out); it forwards every other stream. Such a call may or may
// not have been carried out, as after any failed connection: methods safe to repeat are tried
// again, ClearMessages is not, and the error is UNAVAILABLE without a reason.
import assert from "node:assert/strict";
import http2 from "node:http2";
import { after, before, test } from "node:test";

import { SessionsClient, SessionsError, type ChangeEvent } from "../src/index.js";
import { H2Front, failure, observed, relay, summary } from "./h2front.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;
/** A client of the server itself, not through the front. */
let direct: SessionsClient;

before(async () => {
  server = await TestServer.start();
  direct = server.client({ retry: false });
});
after(async () => {
  await server?.stop();
});

class TrailerlessFront extends H2Front {
  private armed = true;

  private constructor(
    target: string,
    private readonly method: string,
  ) {
    super(target);
  }

  static async start(target: string, method: string): Promise<TrailerlessFront> {
    return H2Front.listening(new TrailerlessFront(target, method));
  }

  protected override onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, method: string): void {
    if (!this.armed || method !== this.method) {
      this.forward(stream, headers);
      return;
    }
    this.armed = false;
    this.forward(stream, headers, (upstream) =>
      relay(upstream, stream, (responseHeaders) => {
        stream.respond(responseHeaders);
        stream.end(); // an empty DATA frame with END_STREAM: no trailers, no status
        upstream.close(http2.constants.NGHTTP2_CANCEL);
      }),
    );
  }
}

test("an append whose stream ended without trailers is sent again and finds its message stored", { timeout: 30_000 }, async () => {
  const front = await TrailerlessFront.start(server.address, "AppendMessage");
  const { client, notices } = observed(front.address);
  const key = freshKey("trailerless");
  try {
    const result = await client.object(key).session("chat").appendMessage(msg("m1"));
    assert.deepEqual(summary(notices), [["AppendMessage", 1, "UNAVAILABLE", null]]);
    assert.equal(result.inserted, false, "the first attempt stored it");
    assert.equal(front.count("AppendMessage"), 2);
    assert.deepEqual((await direct.object(key).session("chat").getHistory()).map((m) => m.id), ["m1"]);
  } finally {
    client.close();
    await front.close();
  }
});

test("a history stream that ended without trailers before its first message is read again", { timeout: 30_000 }, async () => {
  const key = freshKey("trailerless");
  await direct.object(key).session("chat").appendMessages([msg("a"), msg("b"), msg("c")]);
  const front = await TrailerlessFront.start(server.address, "StreamHistory");
  const { client, notices } = observed(front.address);
  try {
    const ids = (await client.object(key).session("chat").getHistory()).map((m) => m.id);
    assert.deepEqual(ids, ["a", "b", "c"]);
    assert.deepEqual(summary(notices), [["StreamHistory", 1, "UNAVAILABLE", null]]);
    assert.equal(front.count("StreamHistory"), 2);
  } finally {
    client.close();
    await front.close();
  }
});

test("a ClearMessages whose stream ended without trailers is not sent again", { timeout: 30_000 }, async () => {
  const key = freshKey("trailerless");
  await direct.object(key).session("chat").appendMessages([msg("a"), msg("b")]);
  const front = await TrailerlessFront.start(server.address, "ClearMessages");
  const { client, notices } = observed(front.address);
  try {
    const error = await failure(client.object(key).session("chat").clearMessages());
    assert.ok(error instanceof SessionsError, String(error));
    assert.deepEqual([error.code, error.reason], ["UNAVAILABLE", null]);
    assert.match(error.message, /the call ended without the server's status.*missing status/);
    assert.deepEqual(notices, []);
    assert.equal(front.count("ClearMessages"), 1);
    // The server did clear the session: a repeat could have removed messages appended since.
    assert.deepEqual(await direct.object(key).session("chat").getHistory(), []);
  } finally {
    client.close();
    await front.close();
  }
});

test("a subscription whose stream ended without trailers resumes and misses nothing", { timeout: 30_000 }, async () => {
  const key = freshKey("trailerless");
  const front = await TrailerlessFront.start(server.address, "Subscribe");
  const client = new SessionsClient(front.address);
  try {
    const feed = client.object(key).subscribe({ includeProgress: true })[Symbol.asyncIterator]();
    const opening = await feed.next(); // from the second stream: the first ended without a status
    assert.equal(opening.done, false);
    assert.equal((opening.value as ChangeEvent).type, "PROGRESS");
    await direct.object(key).session("chat").appendMessage(msg("m1"));
    for (;;) {
      const next = await feed.next();
      assert.equal(next.done, false, "the subscription ended");
      const event = next.value as ChangeEvent;
      if (event.type === "PROGRESS") continue;
      assert.equal(event.type, "APPEND");
      assert.equal(event.message?.id, "m1");
      break;
    }
    await feed.return?.(undefined);
    assert.equal(front.count("Subscribe"), 2);
  } finally {
    client.close();
    await front.close();
  }
});
