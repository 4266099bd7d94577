// A server that closes a call's stream with NO_ERROR while its request is still being sent, without
// answering it: gRPC does so when it stops (SIGTERM) with a large request on its way. Node ends
// such a stream only once it has been read to its end, Connect maps no error from NO_ERROR, and the
// call waited forever: a 60 MB `appendMessages` hung in 7 of 10 stops in a clients audit, never
// retried, nothing stored (session 48). The front here does to the first AppendMessages what the
// stopping server did, and forwards the rest to a real server.
import assert from "node:assert/strict";
import http2 from "node:http2";
import { after, before, test } from "node:test";

import { SessionsClient, type RetryNotice } from "../src/index.js";
import { H2Front } from "./h2front.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;

before(async () => {
  server = await TestServer.start();
});
after(async () => {
  await server?.stop();
});

/** Closes the first AppendMessages stream with NO_ERROR as it arrives, its body unread. */
class ClosingFront extends H2Front {
  private closed = false;

  static async start(target: string): Promise<ClosingFront> {
    return H2Front.listening(new ClosingFront(target));
  }

  protected override onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, method: string): void {
    if (method === "AppendMessages" && !this.closed) {
      this.closed = true;
      stream.close(http2.constants.NGHTTP2_NO_ERROR);
      return;
    }
    this.forward(stream, headers);
  }
}

test("a call whose stream the server closes unanswered mid-request fails UNAVAILABLE and is retried", { timeout: 60_000 }, async () => {
  const front = await ClosingFront.start(server.address);
  const notices: RetryNotice[] = [];
  const client = new SessionsClient(front.address, { onRetry: (notice) => void notices.push(notice) });
  try {
    // About 2 MB: past the windows a stream may send before its reader takes some.
    const messages = Array.from({ length: 4 }, (_, i) => msg(`m${i}`, "x".repeat(500_000)));
    const session = client.object(freshKey("unanswered")).session();
    const results = await session.appendMessages(messages);
    assert.deepEqual(
      results.map((r) => r.inserted),
      [true, true, true, true],
    );
    const [notice, ...more] = notices;
    assert.ok(notice !== undefined && more.length === 0, `${notices.length} retries`);
    assert.equal(notice.error.code, "UNAVAILABLE");
    assert.match(notice.error.message, /closed the call's stream without answering it/);
    assert.equal(front.count("AppendMessages"), 2);
    assert.equal((await session.getHistory()).length, 4);
  } finally {
    client.close();
    await front.close();
  }
});
