import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";

import { SessionsClient, SessionsError } from "../src/index.js";
import { TestServer, freshKey } from "./server.js";

let server: TestServer;

before(async () => {
  server = await TestServer.start();
});
after(async () => {
  await server?.stop();
});

/**
 * A TCP relay to the server that, once `vanish()` is called, moves no bytes either way but keeps
 * every connection open: a server whose host or network went away.
 */
class Blackhole {
  private readonly sockets: net.Socket[] = [];
  private vanished = false;

  private constructor(private readonly listener: net.Server) {}

  static async start(target: string): Promise<Blackhole> {
    const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
    let hole: Blackhole | undefined;
    const listener = net.createServer((client) => {
      const upstream = net.connect(port, host);
      hole!.sockets.push(client, upstream);
      for (const [source, sink] of [[client, upstream], [upstream, client]] as const) {
        source.on("data", (chunk) => {
          if (!hole!.vanished) sink.write(chunk);
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
    this.vanished = true;
    for (const socket of this.sockets) socket.pause(); // reads nothing more, answers nothing
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
    const events = client.object(freshKey()).subscribe()[Symbol.asyncIterator]();
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
