import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";

import { SessionsClient, SessionsError } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;

before(async () => {
  server = await TestServer.start();
});
after(async () => {
  await server?.stop();
});

/**
 * A TCP relay to the server. `vanish()` stops every connection open so far from moving bytes
 * either way, but keeps it open: a server whose host or network went away. Connections made
 * later work (the network came back).
 */
class Blackhole {
  private readonly sockets: net.Socket[] = [];
  private readonly dead = new Set<net.Socket>();

  private constructor(private readonly listener: net.Server) {}

  static async start(target: string): Promise<Blackhole> {
    const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
    let hole: Blackhole | undefined;
    const listener = net.createServer((client) => {
      const upstream = net.connect(port, host);
      hole!.sockets.push(client, upstream);
      for (const [source, sink] of [[client, upstream], [upstream, client]] as const) {
        source.on("data", (chunk) => {
          if (!hole!.dead.has(source)) sink.write(chunk);
        });
        source.on("error", () => {});
      }
    });
    hole = new Blackhole(listener);
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    return hole;
  }

  get address(): string {
    return `127.0.0.1:${(this.listener.address() as net.AddressInfo).port}`;
  }

  vanish(): void {
    for (const socket of this.sockets) {
      this.dead.add(socket);
      socket.pause(); // reads nothing more, answers nothing
    }
  }

  close(): void {
    this.listener.close();
    for (const socket of this.sockets) socket.destroy();
  }
}

test("a subscription notices a server that vanished without closing the connection", async () => {
  const hole = await Blackhole.start(server.address);
  const client = new SessionsClient(hole.address, { keepaliveMs: 500, keepaliveTimeoutMs: 500 });
  try {
    const events = client.object(freshKey()).subscribe({ reconnectAttempts: 0, includeProgress: true })[Symbol.asyncIterator]();
    assert.equal((await events.next()).value?.type, "PROGRESS");
    hole.vanish();
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      events.next().then(
        (next) => `an event: ${JSON.stringify(next.value?.type)}`,
        (error: unknown) => error,
      ),
      new Promise<string>((resolve) => {
        timer = setTimeout(() => resolve("still waiting 30 s later"), 30_000);
      }),
    ]).finally(() => clearTimeout(timer));
    assert.ok(outcome instanceof SessionsError, String(outcome));
    assert.equal(outcome.code, "UNAVAILABLE", outcome.message);
  } finally {
    client.close(); // right after the failure: must not raise the connection's error uncaught
    hole.close();
  }
});

test("a subscription whose connection died resumes on a new one, missing nothing", async () => {
  const hole = await Blackhole.start(server.address);
  const client = new SessionsClient(hole.address, { keepaliveMs: 500, keepaliveTimeoutMs: 500 });
  const writer = server.client();
  const key = freshKey();
  try {
    const events = client.object(key).subscribe({ includeProgress: true })[Symbol.asyncIterator]();
    assert.equal((await events.next()).value?.type, "PROGRESS");
    await writer.object(key).session().appendMessage(msg("before"));
    assert.equal((await events.next()).value?.message?.id, "before");
    hole.vanish(); // the connection dies; the next one works
    await writer.object(key).session().appendMessage(msg("during"));
    await writer.object(key).session().appendMessage(msg("after"));
    const seen: string[] = [];
    while (seen.length < 2) {
      const next = await events.next();
      assert.equal(next.done, false);
      if (next.value!.type === "APPEND") seen.push(next.value!.message!.id as string);
      else assert.equal(next.value!.type, "PROGRESS", `unexpected ${next.value!.type}`);
    }
    assert.deepEqual(seen, ["during", "after"]);
    await events.return(undefined);
  } finally {
    client.close();
    hole.close();
  }
});
