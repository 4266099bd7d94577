// TLS and mTLS (`ClientOptions.tls`) against real servers run with --tls-cert/--tls-key, and
// --tls-client-ca for mTLS, with certificates made here by `openssl` (as the repository's Python
// security tests make theirs): a CA, a server certificate for 127.0.0.1/localhost, a client
// certificate, and a client certificate from another CA. A call that fails because TLS did
// fails UNAVAILABLE after one attempt, whatever the retry policy, and a subscription does not
// reconnect after it; a TLS connection that breaks after it was established is reconnected as
// before.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net, { type AddressInfo } from "node:net";
import tls from "node:tls";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";
import { SessionsClient, SessionsError, type ChangeEvent, type ClientOptions, type TlsConfig } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

const dir = mkdtempSync(join(tmpdir(), "sessions-ts-tls-"));
const file = (name: string) => join(dir, name);
const pem = (name: string) => readFileSync(file(name), "utf8");

function openssl(...args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
}

/**
 * Two CAs (ca, rogue-ca) and the certificates they sign, all for 127.0.0.1 and localhost: server
 * and client (by ca), rogue-client (by rogue-ca). Each as NAME.pem and NAME.key.
 */
function makePki(): void {
  writeFileSync(file("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  for (const ca of ["ca", "rogue-ca"]) {
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", `${ca}.key`, "-out", `${ca}.pem`, "-days", "2", "-subj", `/CN=${ca}`);
  }
  for (const [name, ca] of [
    ["server", "ca"],
    ["client", "ca"],
    ["rogue-client", "rogue-ca"],
  ] as const) {
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`);
    openssl(
      "x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.pem`, "-CAkey", `${ca}.key`, "-CAcreateserial",
      "-out", `${name}.pem`, "-days", "2", "-extfile", "san.ext",
    );
  }
}

let tlsServer: TestServer;
let mtlsServer: TestServer;
let plainServer: TestServer;
const clients: SessionsClient[] = [];

before(async () => {
  makePki();
  const serving = ["--tls-cert", file("server.pem"), "--tls-key", file("server.key")];
  [tlsServer, mtlsServer, plainServer] = await Promise.all([
    TestServer.start(serving),
    TestServer.start([...serving, "--tls-client-ca", file("ca.pem")]),
    TestServer.start(),
  ]);
});
after(async () => {
  for (const client of clients) client.close();
  await Promise.all([tlsServer?.stop(), mtlsServer?.stop(), plainServer?.stop()]);
  rmSync(dir, { recursive: true, force: true });
});

/** A client (closed at the end) that logs each attempt's RPC. */
function observed(address: string, options: ClientOptions = {}) {
  const attempts: string[] = [];
  const log: Interceptor = (next) => (req) => {
    attempts.push(req.method.name);
    return next(req);
  };
  const client = new SessionsClient(address, { ...options, interceptors: [log, ...(options.interceptors ?? [])] });
  clients.push(client);
  return { client, attempts };
}

const trusted = (): TlsConfig => ({ rootCertificates: pem("ca.pem") });
const identified = (): TlsConfig => ({
  rootCertificates: pem("ca.pem"),
  certificateChain: pem("client.pem"),
  privateKey: pem("client.key"),
});

/** The first event of a subscription other than PROGRESS, with a deadline. */
async function firstEvent(feed: AsyncIterator<ChangeEvent>, timeoutMs = 15_000): Promise<ChangeEvent> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let timer: NodeJS.Timeout | undefined;
    const next = await Promise.race([
      feed.next(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error("no event in time")), Math.max(1, deadline - Date.now()));
      }),
    ]).finally(() => clearTimeout(timer));
    assert.ok(!next.done, "the feed ended");
    if (next.value.type !== "PROGRESS") return next.value;
  }
}

/** A failure of TLS: UNAVAILABLE with no reason, naming what failed. */
function tlsFailure(words: RegExp) {
  return (e: unknown) => {
    assert.ok(e instanceof SessionsError, `expected SessionsError, got ${String(e)}`);
    assert.equal(e.code, "UNAVAILABLE", e.message);
    assert.equal(e.grpcCode, 14);
    assert.equal(e.reason, null);
    assert.match(e.rawMessage, words);
    return true;
  };
}

/** Every kind of call: unary, upload, server stream, change feed (which sees the next write). */
async function useEverything(client: SessionsClient): Promise<void> {
  const s = client.object(freshKey("tls")).session("s");
  const feed = s.subscribe({ includeProgress: true })[Symbol.asyncIterator]();
  try {
    assert.equal((await feed.next()).value?.type, "PROGRESS");
    assert.equal((await s.appendMessage(msg("a"))).inserted, true);
    assert.deepEqual((await firstEvent(feed)).message, msg("a"));
    const big = { ...msg("big"), pad: "é".repeat(2 * 1024 * 1024) }; // 4 MiB: UploadMessage
    assert.equal((await s.appendMessage(big)).inserted, true);
    assert.deepEqual(await s.getHistory(), [msg("a"), big]);
    assert.deepEqual((await s.search("text of a")).map((h) => h.id), ["a"]);
  } finally {
    await feed.return?.(undefined);
  }
}

describe("TLS (--tls-cert)", () => {
  test("with the CA as rootCertificates, every kind of call works (host:port, https:// URL, PEM as bytes)", async () => {
    await useEverything(observed(tlsServer.address, { tls: trusted() }).client);
    await useEverything(observed(`https://${tlsServer.address}`, { tls: trusted() }).client);
    await useEverything(observed(tlsServer.address, { tls: { rootCertificates: readFileSync(file("ca.pem")) } }).client);
    const bytes = new Uint8Array(readFileSync(file("ca.pem"))); // a plain Uint8Array, not a Buffer
    await useEverything(observed(tlsServer.address, { tls: { rootCertificates: bytes } }).client);
  });

  test("a server certificate the client does not trust fails UNAVAILABLE at once: not retried, not reconnected", async () => {
    for (const [address, tls] of [
      [tlsServer.address, {}], // Node's default roots
      [`https://${tlsServer.address}`, undefined],
      [tlsServer.address, { rootCertificates: pem("rogue-ca.pem") }],
    ] as const) {
      const { client, attempts } = observed(address, tls === undefined ? {} : { tls }); // default retry policy
      const s = client.object(freshKey("untrusted")).session();
      await assert.rejects(s.appendMessage(msg("a")), tlsFailure(/^TLS handshake failed: .*\(UNABLE_TO_VERIFY_LEAF_SIGNATURE\)$/));
      await assert.rejects(s.getHistory(), tlsFailure(/TLS handshake failed/));
      await assert.rejects(s.subscribe().next(), tlsFailure(/TLS handshake failed/));
      assert.deepEqual(attempts, ["AppendMessage", "StreamHistory", "Subscribe"], "one attempt each");
    }
  });

  test("a plaintext client of a TLS server is tried again as a connection failure, then told the server may speak TLS", async () => {
    // The server reads plaintext HTTP/2 as a broken handshake and hangs up without a byte.
    const { client, attempts } = observed(tlsServer.address, { retry: { maxAttempts: 3, initialBackoffMs: 1 }, timeoutMs: 10_000 });
    await assert.rejects(
      client.object("k").session().getMessage("a"),
      tlsFailure(/^the server closed the connection before it spoke HTTP\/2: it may speak TLS alone \(a server run with --tls-cert does: give options\.tls, or an https:\/\/ address\), or a proxy in front of it could not reach it$/),
    );
    assert.deepEqual(attempts, ["GetMessage", "GetMessage", "GetMessage"]);
  });

  test("a TLS client of a plaintext server fails UNAVAILABLE at once", async () => {
    const { client, attempts } = observed(plainServer.address, { tls: trusted() });
    const s = client.object(freshKey("plain")).session();
    await assert.rejects(s.getMessage("a"), tlsFailure(/TLS handshake failed: .*ERR_SSL_WRONG_VERSION_NUMBER/));
    await assert.rejects(s.subscribe().next(), tlsFailure(/TLS handshake failed/));
    assert.deepEqual(attempts, ["GetMessage", "Subscribe"]);
  });

  test("a TLS connection that breaks once established is reconnected: the subscription resumes", async () => {
    // A TCP relay in front of the server: cutting its sockets breaks the client's TLS connection
    // abruptly, after the server has spoken HTTP/2 on it (not a refusal).
    const sockets = new Set<net.Socket>();
    const [host, port] = [tlsServer.address.slice(0, tlsServer.address.lastIndexOf(":")), Number(tlsServer.address.split(":").pop())];
    const relay = net.createServer((inbound) => {
      const outbound = net.connect(port, host);
      for (const socket of [inbound, outbound]) {
        sockets.add(socket);
        socket.on("error", () => {});
        socket.on("close", () => sockets.delete(socket));
      }
      inbound.pipe(outbound).pipe(inbound);
      inbound.on("close", () => outbound.destroy());
      outbound.on("close", () => inbound.destroy());
    });
    await new Promise<void>((resolve) => relay.listen(0, "127.0.0.1", resolve));
    try {
      const address = `127.0.0.1:${(relay.address() as AddressInfo).port}`;
      // The certificate names 127.0.0.1, which is where the relay listens.
      const { client, attempts } = observed(address, { tls: trusted() });
      const key = freshKey("cut");
      // Writes go straight to the server, on a connection of their own.
      const writer = observed(tlsServer.address, { tls: trusted() }).client.object(key).session();
      const feed = client.object(key).session().subscribe({ includeProgress: true })[Symbol.asyncIterator]();
      try {
        assert.equal((await feed.next()).value?.type, "PROGRESS");
        await writer.appendMessage(msg("before"));
        assert.equal((await firstEvent(feed)).message?.id, "before");
        for (const socket of sockets) socket.destroy();
        const after = firstEvent(feed);
        await writer.appendMessage(msg("after"));
        assert.equal((await after).message?.id, "after");
      } finally {
        await feed.return?.(undefined);
      }
      assert.equal(attempts.filter((m) => m === "Subscribe").length, 2, "one reconnection");
    } finally {
      relay.close();
      for (const socket of sockets) socket.destroy();
    }
  });
});

describe("mTLS (--tls-client-ca)", () => {
  test("with a client certificate the server trusts, every kind of call works", async () => {
    await useEverything(observed(mtlsServer.address, { tls: identified() }).client);
    const bytes: TlsConfig = {
      rootCertificates: readFileSync(file("ca.pem")),
      certificateChain: readFileSync(file("client.pem")),
      privateKey: readFileSync(file("client.key")),
    };
    await useEverything(observed(`https://${mtlsServer.address}`, { tls: bytes }).client);
  });

  test("without a client certificate, or with one from another CA: tried again as a connection failure (a proxy ending TLS does the same), then named", async () => {
    for (const tls of [
      trusted(),
      { rootCertificates: pem("ca.pem"), certificateChain: pem("rogue-client.pem"), privateKey: pem("rogue-client.key") },
    ]) {
      const { client, attempts } = observed(mtlsServer.address, { tls, retry: { maxAttempts: 3, initialBackoffMs: 1 } });
      const key = freshKey("anonymous");
      const s = client.object(key).session();
      const named = tlsFailure(/may have refused the TLS handshake.*client certificate.*or a proxy that ends TLS/);
      await assert.rejects(s.appendMessage(msg("a")), named);
      await assert.rejects(s.getHistory(), named);
      await assert.rejects(s.clearMessages(), named); // not repeatable: one attempt
      await assert.rejects(async () => {
        for await (const _ of s.subscribe({ reconnectAttempts: 2 })) assert.fail("no event");
      }, named);
      assert.deepEqual(attempts, [
        ...Array(3).fill("AppendMessage"),
        ...Array(3).fill("StreamHistory"),
        "ClearMessages",
        ...Array(3).fill("Subscribe"),
      ]);
      // Nothing was written by the refused calls.
      const { client: admitted } = observed(mtlsServer.address, { tls: identified() });
      assert.deepEqual(await admitted.object(key).listSessions(), []);
    }
  });
});

describe("TLS settings", () => {
  test("the constructor refuses settings that do not load, before any call", () => {
    const bad: [string, () => unknown][] = [
      ["certificate without key", () => new SessionsClient("127.0.0.1:1", { tls: { certificateChain: pem("client.pem") } })],
      ["key without certificate", () => new SessionsClient("127.0.0.1:1", { tls: { privateKey: pem("client.key") } })],
      ["a key of another certificate", () => new SessionsClient("127.0.0.1:1", { tls: { certificateChain: pem("client.pem"), privateKey: pem("ca.key") } })],
      ["a CA that is not PEM", () => new SessionsClient("127.0.0.1:1", { tls: { rootCertificates: "not a certificate" } })],
      ["a certificate that is not PEM", () => new SessionsClient("127.0.0.1:1", { tls: { certificateChain: "x", privateKey: "y" } })],
      ["tls for an http:// URL", () => new SessionsClient("http://127.0.0.1:1", { tls: trusted() })],
    ];
    for (const [name, make] of bad) assert.throws(make, TypeError, name);
  });
});

describe("server name (SNI)", () => {
  test("a host name is sent as the server name, as http2.connect sends it; an IP address is not", async () => {
    // A TLS listener that records the name each client sends, then hangs up: proxies and load
    // balancers pick a certificate or a backend by it. (A review: the client opens its sockets
    // itself since connectTimeoutMs, and sent none.)
    const names: string[] = [];
    const listener = tls.createServer(
      {
        key: readFileSync(file("server.key")),
        cert: readFileSync(file("server.pem")),
        ALPNProtocols: ["h2"],
        SNICallback: (name, done) => {
          names.push(name);
          done(null, undefined);
        },
      },
      (socket) => socket.destroy(),
    );
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    const { port } = listener.address() as AddressInfo;
    try {
      for (const host of ["localhost", "127.0.0.1"]) {
        const { client } = observed(`${host}:${port}`, { tls: trusted(), retry: false, connectTimeoutMs: 2_000 });
        await assert.rejects(client.object(freshKey("sni")).session().getMessage("a"), SessionsError);
      }
      assert.deepEqual(names, ["localhost"]);
    } finally {
      listener.close();
    }
  });
});
