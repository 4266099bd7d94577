// A history() iterator dropped after a next() without return() (rather than left by `break`,
// which ends it) must not hold its server stream until the client closes: once the iterator is
// garbage-collected its call is cancelled. Garbage collection is forced in a child process: this
// file run as `node --expose-gc dropped.test.js child ADDRESS METRICS_ADDRESS KEY COUNT`
// (`dropReads`). The server's metrics count the calls in flight.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import net, { type AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { SessionsClient } from "../src/index.js";
import { TestServer, freshKey } from "./server.js";

/** The calls the server is handling (change feeds aside), from its metrics. */
async function inFlight(metricsAddress: string): Promise<number> {
  const text = await (await fetch(`http://${metricsAddress}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("sessions_rpcs_in_flight "));
  return Number(line?.split(" ")[1] ?? NaN);
}

/**
 * The child: starts `count` history() reads of the session and takes one message from each,
 * keeping the iterators, then drops them all without return() and collects garbage until the
 * server has no call in flight (or 15 s pass). Prints {"held": <calls in flight while the
 * iterators were kept>, "left": <after they were dropped and collected>}.
 */
async function dropReads(address: string, metricsAddress: string, key: string, count: number): Promise<void> {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (gc === undefined) throw new Error("run with --expose-gc");
  const client = new SessionsClient(address);
  const started = async () => {
    const iterator = client.object(key).session().history({ newestFirst: true });
    await iterator.next();
    return iterator;
  };
  const kept: AsyncGenerator<unknown>[] = [];
  for (let i = 0; i < count; i++) kept.push(await started());
  gc(); // kept iterators are not collected: their reads stay in flight
  const held = await inFlight(metricsAddress);
  kept.length = 0; // dropped, without return()
  let left = held;
  const deadline = performance.now() + 15_000;
  while (left > 0 && performance.now() < deadline) {
    gc();
    await new Promise((resolve) => setTimeout(resolve, 20)); // finalizers run in a later task
    left = await inFlight(metricsAddress);
  }
  console.log(JSON.stringify({ held, left }));
  client.close();
}

/** A free loopback port: bound by the OS, then released. */
async function freeAddress(): Promise<string> {
  const socket = net.createServer();
  await new Promise<void>((resolve) => socket.listen(0, "127.0.0.1", resolve));
  const { port } = socket.address() as AddressInfo;
  await new Promise<void>((resolve) => socket.close(() => resolve()));
  return `127.0.0.1:${port}`;
}

if (process.argv[2] === "child") {
  const [address, metricsAddress, key, count] = process.argv.slice(3) as [string, string, string, string];
  await dropReads(address, metricsAddress, key, Number(count));
} else {
  let server: TestServer;
  let metricsAddress: string;

  before(async () => {
    metricsAddress = await freeAddress();
    server = await TestServer.start(["--metrics-listen", metricsAddress]);
  });
  after(async () => {
    await server?.stop();
  });

  test("dropped history() iterators have their server streams cancelled once collected", { timeout: 60_000 }, async () => {
    const key = freshKey("dropped");
    // Far more than HTTP/2's flow-control window: the server is still sending each read when its
    // iterator is dropped, so the call stays in flight until something cancels it.
    const messages = Array.from({ length: 2000 }, (_, i) => ({
      id: `m${i}`,
      role: "user",
      parts: [{ type: "text", text: "x".repeat(1000) }],
    }));
    await server.client().object(key).session().appendMessages(messages);
    const COUNT = 20;
    const child = spawn(
      process.execPath,
      ["--expose-gc", fileURLToPath(import.meta.url), "child", server.address, metricsAddress, key, String(COUNT)],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
    assert.equal(code, 0, stderr);
    const { held, left } = JSON.parse(stdout) as { held: number; left: number };
    assert.equal(held, COUNT, "the reads were in flight while their iterators were kept");
    assert.equal(left, 0, `calls still in flight after collection: ${left} of ${held}`);
  });
}
