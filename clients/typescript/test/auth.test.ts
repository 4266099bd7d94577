import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { SessionsError } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

// A server started with --tokens-file: the client's `token` option must reach it as
// `authorization: Bearer <token>`, and refusals must come back as SessionsError.
let server: TestServer;
const dir = mkdtempSync(join(tmpdir(), "sessions-ts-auth-"));
const sha256 = (text: string) => createHash("sha256").update(text, "utf8").digest("hex");

before(async () => {
  const tokensFile = join(dir, "tokens.json");
  writeFileSync(
    tokensFile,
    JSON.stringify({
      tokens: [
        { name: "writer", sha256: sha256("writer-secret"), prefixes: ["tenant-a/"], access: "write" },
        { name: "reader", sha256: sha256("reader-secret"), prefixes: ["tenant-a/"], access: "read" },
      ],
    }),
  );
  server = await TestServer.start(["--tokens-file", tokensFile]);
});
after(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

function expectCode(code: string) {
  return (e: unknown) => {
    assert.ok(e instanceof SessionsError, String(e));
    assert.equal(e.code, code);
    assert.equal(e.reason, code, "ErrorInfo reason");
    return true;
  };
}

test("the token option authenticates; missing, unknown or ungranted tokens are refused", async () => {
  const key = `tenant-a/${freshKey()}`;
  const writer = server.client({ token: "writer-secret" }).object(key).session();
  assert.equal((await writer.appendMessage(msg("a"))).inserted, true);
  for await (const m of writer.history()) assert.equal(m.id, "a");

  const reader = server.client({ token: "reader-secret" }).object(key).session();
  assert.deepEqual(await reader.getMessage("a"), msg("a"));
  await assert.rejects(reader.appendMessage(msg("b")), expectCode("PERMISSION_DENIED"));

  await assert.rejects(server.client().object(key).session().getMessage("a"), expectCode("UNAUTHENTICATED"));
  await assert.rejects(server.client({ token: "nope" }).object(key).session().getHistory(), expectCode("UNAUTHENTICATED"));
  await assert.rejects(
    server.client({ token: "writer-secret" }).object(`tenant-b/${freshKey()}`).session().appendMessage(msg("a")),
    expectCode("PERMISSION_DENIED"),
  );
});
