// An h2c front on a loopback port in front of a real sessions-server, for tests that need a
// proxy to misbehave in a chosen way: it forwards every stream as it is (headers, request body,
// response headers, body and trailers) unless a subclass's `onStream` answers a stream itself.
import assert from "node:assert/strict";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";

import { SessionsClient, type ClientOptions, type RetryNotice } from "../src/index.js";

/** How the server's answer to a forwarded stream goes back to the client. */
export type Reply = (upstream: http2.ClientHttp2Stream, stream: http2.ServerHttp2Stream) => void;

export class H2Front {
  /** The method of every stream the front received, in order. */
  readonly streams: string[] = [];
  /** The connections clients opened to the front. */
  connections = 0;
  address = "";
  private readonly server = http2.createServer();
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  private readonly upstream: http2.ClientHttp2Session;

  protected constructor(target: string) {
    this.upstream = http2.connect(`http://${target}`);
    this.upstream.on("error", () => {});
    this.server.on("session", (session) => {
      this.connections += 1;
      this.sessions.add(session);
      session.on("error", () => {});
      session.once("close", () => this.sessions.delete(session));
    });
    this.server.on("stream", (stream, headers) => {
      const method = String(headers[":path"]).split("/").pop()!;
      this.streams.push(method);
      // A stream reset here (REFUSED_STREAM also reports an error on this side) or by the client.
      stream.on("error", () => {});
      this.onStream(stream, headers, method);
    });
  }

  /** Starts `front` listening on a free loopback port. */
  protected static async listening<T extends H2Front>(front: T): Promise<T> {
    await new Promise<void>((resolve) => front.server.listen(0, "127.0.0.1", resolve));
    front.address = `127.0.0.1:${(front.server.address() as AddressInfo).port}`;
    return front;
  }

  /** How many streams of `method` the front received. */
  count(method: string): number {
    return this.streams.filter((m) => m === method).length;
  }

  protected onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, _method: string): void {
    this.forward(stream, headers);
  }

  /** Sends the stream on to the server, its answer back by `reply`. */
  protected forward(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, reply: Reply = relay): void {
    const request: http2.OutgoingHttpHeaders = {};
    for (const [name, value] of Object.entries(headers)) {
      if (value !== undefined && (!name.startsWith(":") || name === ":method" || name === ":path")) request[name] = value;
    }
    const upstream = this.upstream.request(request);
    upstream.on("error", () => {});
    stream.pipe(upstream);
    // The client reset its stream (cancelled): so is the server's.
    stream.once("close", () => {
      if (!upstream.closed) upstream.close(http2.constants.NGHTTP2_CANCEL);
    });
    reply(upstream, stream);
  }

  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const session of this.sessions) session.destroy();
    await closed;
    this.upstream.destroy();
  }
}

/**
 * The server's answer as it came: its response headers (alone when they end the stream: an error
 * status), messages and trailers; a reset of the server's stream resets the client's.
 * `respond(headers)` replaces the piping of a stream that carries messages.
 */
export function relay(
  upstream: http2.ClientHttp2Stream,
  stream: http2.ServerHttp2Stream,
  respond?: (headers: http2.IncomingHttpHeaders) => void,
): void {
  let trailers: http2.IncomingHttpHeaders = {};
  upstream.on("trailers", (received) => {
    trailers = received;
  });
  upstream.once("response", (responseHeaders, flags) => {
    if ((flags & http2.constants.NGHTTP2_FLAG_END_STREAM) !== 0) {
      stream.respond(responseHeaders, { endStream: true }); // trailers-only (an error status)
      return;
    }
    if (respond !== undefined) {
      respond(responseHeaders);
      return;
    }
    stream.respond(responseHeaders, { waitForTrailers: true });
    stream.once("wantTrailers", () => stream.sendTrailers(trailers));
    upstream.pipe(stream);
  });
  upstream.once("close", () => {
    if (respond === undefined && upstream.rstCode !== http2.constants.NGHTTP2_NO_ERROR && !stream.closed) {
      stream.close(upstream.rstCode);
    }
  });
}

/** A client of `address` that records its retry notices. */
export function observed(address: string, options: ClientOptions = {}): { client: SessionsClient; notices: RetryNotice[] } {
  const notices: RetryNotice[] = [];
  const client = new SessionsClient(address, {
    ...options,
    onRetry: (notice) => {
      notices.push(notice);
    },
  });
  return { client, notices };
}

/** The notices as [method, attempt, code, reason]. */
export function summary(notices: RetryNotice[]): [string, number, string, string | null][] {
  return notices.map((n) => [n.method, n.attempt, n.error.code, n.error.reason]);
}

/** What `call` failed with (an assertion fails if it succeeded). */
export async function failure(call: Promise<unknown>): Promise<unknown> {
  return call.then(
    (value) => assert.fail(`expected a failure, got ${String(value)}`),
    (error: unknown) => error,
  );
}
