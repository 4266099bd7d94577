import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { TestServer, msg } from "./server.js";

// A server run with --max-connection-age-seconds asks each connection to go once that old
// (GOAWAY) and closes it under the calls still open after the grace.
let server: TestServer;

before(async () => {
  server = await TestServer.start(["--max-connection-age-seconds", "0.3", "--max-connection-age-grace-seconds", "0.3"]);
});
after(async () => {
  await server?.stop();
});

test("calls and a subscription ride through connections as they age: every append arrives once, in order", async () => {
  const client = server.client();
  try {
    const object = client.object("aging");
    const feed = object.subscribe({ includeProgress: true })[Symbol.asyncIterator]();
    assert.equal((await feed.next()).value?.type, "PROGRESS");
    const appended: string[] = [];
    // Past several ages and graces (0.33 s + 0.3 s at most each): each connection is replaced.
    for (const start = performance.now(); performance.now() - start < 3000 || appended.length < 20; ) {
      const id = `m${appended.length}`;
      await object.session().appendMessage(msg(id));
      appended.push(id);
    }
    const seen: string[] = [];
    while (seen.length < appended.length) {
      const next = await feed.next();
      assert.equal(next.done, false, `the subscription ended after ${seen.length} of ${appended.length} appends`);
      if (next.value.type === "APPEND") seen.push(String(next.value.message?.["id"]));
    }
    await feed.return?.(undefined);
    assert.deepEqual(seen, appended);
  } finally {
    client.close();
  }
});
