// subscribe's reconnect budget (`reconnectAttempts`: failures in a row) against a proxy that
// accepts every stream and fails it soon after. Every Subscribe stream (here: on an object never
// written) opens with a PROGRESS, the "subscribed"
// acknowledgement, which alone is no sign that the stream works: only something more (an event,
// or a second PROGRESS a progress interval later) ends a row of failures and resets the count
// (and the backoff). Counting the acknowledgement made the client reconnect forever at its
// shortest backoff.
//
// FailingRelay is a gRPC server on a loopback port implementing only Subscribe: it relays each
// stream to a real sessions-server (short --progress-seconds) and fails the first `failing`
// streams with UNAVAILABLE as soon as what they forwarded satisfies `cut`. Streams past `limit`
// are refused FAILED_PRECONDITION (no reason to reconnect), so that a client which would reconnect
// forever fails a test at once instead of hanging.
import assert from "node:assert/strict";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { Code, ConnectError, createClient, type Client, type HandlerContext } from "@connectrpc/connect";
import { Http2SessionManager, connectNodeAdapter, createGrpcTransport } from "@connectrpc/connect-node";
import { OBJECT_KEY_HEADER, SessionsClient, SessionsError, pb } from "../src/index.js";
import { TestServer, freshKey } from "./server.js";

let server: TestServer;

before(async () => {
  server = await TestServer.start(["--progress-seconds", "0.05"]);
});
after(async () => {
  await server?.stop();
});

type Cut = (forwarded: string[]) => boolean;

class FailingRelay {
  /** Per stream, the change types it forwarded. */
  readonly streams: string[][] = [];
  address = "";
  private readonly upstreamSessions: Http2SessionManager;
  private readonly upstream: Client<typeof pb.SessionService>;
  private readonly server: http2.Http2Server;
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  /**
   * Every stream resumes from revision 1, which no feed knows: as after a server that restarted
   * since the client's last revision, each stream opens with RESET.
   */
  forgetful = false;

  constructor(
    target: string,
    private readonly cut: Cut,
    private readonly failing = Infinity,
    private readonly limit = Infinity,
  ) {
    this.upstreamSessions = new Http2SessionManager(`http://${target}`);
    this.upstream = createClient(
      pb.SessionService,
      createGrpcTransport({ baseUrl: `http://${target}`, sessionManager: this.upstreamSessions }),
    );
    const handler = connectNodeAdapter({
      grpc: true,
      grpcWeb: false,
      connect: false,
      routes: (router) => router.service(pb.SessionService, { subscribe: (request, context) => this.subscribe(request, context) }),
    });
    this.server = http2.createServer(handler);
    this.server.on("session", (session) => {
      this.sessions.add(session);
      session.once("close", () => this.sessions.delete(session));
    });
  }

  static async start(target: string, cut: Cut, failing = Infinity, limit = Infinity): Promise<FailingRelay> {
    const relay = new FailingRelay(target, cut, failing, limit);
    await new Promise<void>((resolve) => relay.server.listen(0, "127.0.0.1", resolve));
    relay.address = `127.0.0.1:${(relay.server.address() as AddressInfo).port}`;
    return relay;
  }

  private async *subscribe(request: pb.SubscribeRequest, context: HandlerContext): AsyncGenerator<pb.SubscribeResponse> {
    const forwarded: string[] = [];
    this.streams.push(forwarded);
    const n = this.streams.length;
    if (n > this.limit) throw new ConnectError("relay: too many Subscribe streams", Code.FailedPrecondition);
    const key = context.requestHeader.get(OBJECT_KEY_HEADER);
    const headers: Record<string, string> = key === null ? {} : { [OBJECT_KEY_HEADER]: key };
    const sent = this.forgetful ? { ...request, resumeAfterRevision: 1n } : request;
    for await (const response of this.upstream.subscribe(sent, { signal: context.signal, headers })) {
      forwarded.push(pb.ChangeType[response.type] ?? "UNSPECIFIED");
      yield response;
      if (n <= this.failing && this.cut(forwarded)) {
        throw new ConnectError("relay: the backend went away", Code.Unavailable);
      }
    }
  }

  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const session of this.sessions) session.destroy();
    await closed;
    this.upstreamSessions.abort();
  }
}

const ATTEMPTS = 2;
const FAILING = 2 * ATTEMPTS + 1; // more failures than the attempts allow in a row
const afterOne: Cut = (forwarded) => forwarded.length >= 1;
const afterTwo: Cut = (forwarded) => forwarded.length >= 2;

test("streams failed right after their acknowledgement use up reconnectAttempts", { timeout: 30_000 }, async () => {
  const relay = await FailingRelay.start(server.address, afterOne, Infinity, ATTEMPTS + 3);
  const client = new SessionsClient(relay.address);
  const seen: string[] = [];
  try {
    const error = await (async () => {
      try {
        for await (const event of client.object(freshKey("acked")).subscribe({ includeProgress: true, reconnectAttempts: ATTEMPTS })) {
          seen.push(event.type);
          assert.ok(seen.length <= ATTEMPTS + 1, `still reconnecting after ${relay.streams.length} streams`);
        }
      } catch (error) {
        return error;
      }
      return null;
    })();
    assert.ok(error instanceof SessionsError, `ended with ${String(error)}`);
    assert.equal(error.code, "UNAVAILABLE");
    assert.match(error.message, /relay: the backend went away/);
    assert.deepEqual(seen, Array(ATTEMPTS + 1).fill("PROGRESS"));
    assert.deepEqual(relay.streams, Array(ATTEMPTS + 1).fill(["PROGRESS"]));
  } finally {
    client.close();
    await relay.close();
  }
});

test("streams that open with a RESET and fail use up reconnectAttempts too", { timeout: 30_000 }, async () => {
  // A resume the server cannot place opens with RESET instead of PROGRESS. A review: only a
  // PROGRESS was taken for the opening, so each RESET reset the count: reconnecting forever.
  const relay = await FailingRelay.start(server.address, afterOne, Infinity, ATTEMPTS + 3);
  relay.forgetful = true;
  const client = new SessionsClient(relay.address);
  const seen: string[] = [];
  try {
    const error = await (async () => {
      try {
        for await (const event of client.object(freshKey("reset")).subscribe({ resumeAfterRevision: 1n, reconnectAttempts: ATTEMPTS })) {
          seen.push(event.type);
          assert.ok(seen.length <= ATTEMPTS + 1, `still reconnecting after ${relay.streams.length} streams`);
        }
      } catch (error) {
        return error;
      }
      return null;
    })();
    assert.ok(error instanceof SessionsError, `ended with ${String(error)}`);
    assert.equal(error.code, "UNAVAILABLE");
    assert.deepEqual(seen, Array(ATTEMPTS + 1).fill("RESET"));
    assert.deepEqual(relay.streams, Array(ATTEMPTS + 1).fill(["RESET"]));
  } finally {
    client.close();
    await relay.close();
  }
});

test("with PROGRESS dropped (the default) the subscription gives up the same", { timeout: 30_000 }, async () => {
  const relay = await FailingRelay.start(server.address, afterOne, Infinity, ATTEMPTS + 3);
  const client = new SessionsClient(relay.address);
  try {
    const feed = client.object(freshKey("acked")).subscribe({ reconnectAttempts: 1 })[Symbol.asyncIterator]();
    const error = await feed.next().then(
      () => null,
      (error: unknown) => error,
    );
    assert.ok(
      error instanceof SessionsError && error.code === "UNAVAILABLE",
      `ended with ${String(error)} after ${relay.streams.length} streams`,
    );
    assert.equal(relay.streams.length, 2);
  } finally {
    client.close();
    await relay.close();
  }
});

test("a stream that lived a progress interval resets the count: the subscription goes on", { timeout: 30_000 }, async () => {
  // Each failing stream delivers the acknowledgement and a second PROGRESS, then fails; more of
  // them than reconnectAttempts. The stream after them stays: three PROGRESS events on it.
  const relay = await FailingRelay.start(server.address, afterTwo, FAILING);
  const client = new SessionsClient(relay.address);
  try {
    for await (const _ of client.object(freshKey("lived")).subscribe({ includeProgress: true, reconnectAttempts: ATTEMPTS })) {
      if (relay.streams.length > FAILING && relay.streams.at(-1)!.length >= 3) break;
    }
    assert.equal(relay.streams.length, FAILING + 1);
    assert.deepEqual(relay.streams.slice(0, FAILING), Array(FAILING).fill(["PROGRESS", "PROGRESS"]));
  } finally {
    client.close();
    await relay.close();
  }
});
