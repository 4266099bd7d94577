// A subscription follows its object to a new shard (a sharding audit): a move ends the feed
// (UNAVAILABLE, OBJECT_MOVING) and the old owner then refuses the key (FAILED_PRECONDITION,
// OBJECT_NOT_OWNED) until the proxy routes it to the new owner. subscribe() took that refusal
// for an error of the subscription's own and ended it, so events written after a re-shard never
// came. Through nginx, a shard restarting under writes ended subscriptions UNKNOWN without the
// server's status ("Stream removed"), which ended them too. Both now reconnect, within
// `reconnectAttempts`. Real servers; streams are counted where they are opened (an interceptor,
// or an h2c front that forwards them), never by waiting for time to pass.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import http2 from "node:http2";
import { promisify } from "node:util";
import { after, before, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";
import { SessionsClient, SessionsError, type ChangeEvent } from "../src/index.js";
import { H2Front, relay } from "./h2front.js";
import { TestServer, freshKey, msg, serverCommand } from "./server.js";

let first: TestServer;
let second: TestServer;
/** A client of the first server, not through any front. */
let direct: SessionsClient;

before(async () => {
  [first, second] = await Promise.all([TestServer.start(), TestServer.start()]);
  direct = first.client();
});
after(async () => {
  await Promise.all([first?.stop(), second?.stop()]);
});

/** Moves `key` from one server to another with the server's CLI, as an operator re-sharding does. */
async function moveObject(key: string, from: string, to: string): Promise<void> {
  const [cmd, ...args] = serverCommand();
  await promisify(execFile)(cmd!, [...args, "move-object", "--object-key", key, "--from", from, "--to", to]);
}

test("a subscription to the shard its object left reconnects, then ends after its attempts", { timeout: 60_000 }, async () => {
  const key = freshKey("moved");
  await direct.object(key).session("chat").appendMessage(msg("m0"));
  await moveObject(key, first.address, second.address);
  const moved = second.client();
  assert.deepEqual(
    (await moved.object(key).session("chat").getHistory()).map((m) => m.id),
    ["m0"],
    "the new owner holds the object",
  );

  let opened = 0; // Subscribe streams the client opened
  const counting: Interceptor = (next) => (req) => {
    if (req.method.name === "Subscribe") opened += 1;
    return next(req);
  };
  // No proxy routes the key to its new owner: the refusal comes back on every stream, and is
  // thrown once the attempts are spent (attempts + 1 streams). It was thrown at the first one.
  const client = first.client({ interceptors: [counting] });
  const events: ChangeEvent[] = [];
  const failure = await (async () => {
    for await (const event of client.object(key).subscribe({ includeProgress: true, reconnectAttempts: 2 })) {
      events.push(event);
    }
  })().then(
    () => assert.fail("the subscription ended without an error"),
    (error: unknown) => error,
  );
  assert.ok(failure instanceof SessionsError, String(failure));
  assert.deepEqual([failure.code, failure.reason], ["FAILED_PRECONDITION", "OBJECT_NOT_OWNED"]);
  assert.deepEqual(events, []);
  assert.equal(opened, 3, "the first stream and 2 reconnections");
});

/**
 * An h2c front of a real sessions-server (`H2Front`) that ends the first Subscribe stream right
 * after its first response message with trailers of its own, grpc-status 2 (UNKNOWN) and
 * grpc-message "Stream removed", without the server's ErrorInfo: what nginx sends when the
 * shard's connection closes under a stream.
 */
class CuttingFront extends H2Front {
  private armed = true;

  static async start(target: string): Promise<CuttingFront> {
    return H2Front.listening(new CuttingFront(target));
  }

  protected override onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, method: string): void {
    if (!this.armed || method !== "Subscribe") {
      this.forward(stream, headers);
      return;
    }
    this.armed = false;
    this.forward(stream, headers, (upstream) =>
      relay(upstream, stream, (responseHeaders) => {
        stream.respond(responseHeaders, { waitForTrailers: true });
        stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "2", "grpc-message": "Stream removed" }));
        // Forward the bytes of the first length-prefixed message (1 flag byte, 4 length bytes),
        // then end the stream with the front's own status.
        let buffered = Buffer.alloc(0);
        const onData = (chunk: Buffer): void => {
          buffered = Buffer.concat([buffered, chunk]);
          if (buffered.length < 5) return;
          const end = 5 + buffered.readUInt32BE(1);
          if (buffered.length < end) return;
          upstream.off("data", onData);
          stream.end(buffered.subarray(0, end));
          upstream.close(http2.constants.NGHTTP2_CANCEL);
        };
        upstream.on("data", onData);
      }),
    );
  }
}

test("a subscription a proxy ended UNKNOWN without the server's status resumes", { timeout: 60_000 }, async () => {
  const front = await CuttingFront.start(first.address);
  const key = freshKey("cut");
  const session = direct.object(key).session("chat");
  await session.appendMessage(msg("m0"));
  const through = new SessionsClient(front.address);
  try {
    const feed = through.object(key).subscribe({ includeProgress: true })[Symbol.asyncIterator]();
    const opening = await feed.next();
    assert.equal(opening.done, false);
    assert.equal((opening.value as ChangeEvent).type, "PROGRESS"); // then cut: UNKNOWN
    await session.appendMessage(msg("m1"));
    for (;;) {
      const next = await feed.next();
      assert.equal(next.done, false, "the subscription ended");
      const event = next.value as ChangeEvent;
      assert.notEqual(event.type, "RESET", "the resume repeats and misses nothing");
      if (event.type === "APPEND") {
        assert.equal(event.message?.id, "m1");
        break;
      }
    }
    await feed.return?.(undefined);
    assert.equal(front.count("Subscribe"), 2);
  } finally {
    through.close();
    await front.close();
  }
});
