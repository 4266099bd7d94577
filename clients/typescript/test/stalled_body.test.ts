// A proxy that stops reading a client stream's body (its flow-control window spent) while the
// call's deadline passes. Connect ends the request's frames with its own DEADLINE_EXCEEDED error;
// `importMessages` took any error that came out of its frames for the caller's own (an iterable
// that failed) and threw Connect's raw ConnectError instead of the SessionsError every call throws.
import assert from "node:assert/strict";
import http2 from "node:http2";
import { after, before, test } from "node:test";

import { SessionsClient, SessionsError } from "../src/index.js";
import { H2Front } from "./h2front.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;

before(async () => {
  server = await TestServer.start();
});
after(async () => {
  await server?.stop();
});

/** Reads nothing of an ImportMessages stream's body and never answers it; forwards the rest. */
class StallingProxy extends H2Front {
  static async start(target: string): Promise<StallingProxy> {
    return H2Front.listening(new StallingProxy(target));
  }

  protected override onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, method: string): void {
    if (method === "ImportMessages") {
      stream.pause();
      return;
    }
    this.forward(stream, headers);
  }
}

test("an import whose body stalls past its deadline fails as a SessionsError", { timeout: 60_000 }, async () => {
  const proxy = await StallingProxy.start(server.address);
  const client = new SessionsClient(proxy.address, { timeoutMs: 500, retry: false });
  try {
    // About 1 MB of messages: past the window a stream may send before its reader takes some.
    const messages = Array.from({ length: 500 }, (_, i) => msg(`m${i}`, "x".repeat(2_000)));
    const failure = await client
      .object(freshKey("stalled-import"))
      .session()
      .importMessages(messages)
      .then(
        () => null,
        (error: unknown) => error,
      );
    assert.ok(failure instanceof SessionsError, `not a SessionsError: ${String(failure)}`);
    assert.equal(failure.code, "DEADLINE_EXCEEDED");
  } finally {
    client.close();
    await proxy.close();
  }
});
