// Throughput of the TypeScript client against a real server:
//   1. serial appends of 1 KB messages (default 2,000), one AppendMessage call at a time;
//   2. history streaming: a 10,000 × 1 KB message path read with `for await (… of history())`.
//
// Usage (after `npm run build`):  node bench/throughput.mjs [--appends N] [--history N] [--runs N]
// SESSIONS_ADDRESS=host:port uses a running server; otherwise one is started like the tests do
// (SESSIONS_SERVER_CMD overrides the server executable).
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { SessionsClient } from "../dist/src/index.js";

const { values } = parseArgs({
  options: {
    appends: { type: "string", default: "2000" },
    history: { type: "string", default: "10000" },
    runs: { type: "string", default: "3" },
  },
});
const APPENDS = Number(values.appends);
const HISTORY = Number(values.history);
const RUNS = Number(values.runs);

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

async function startServer() {
  const dataDir = mkdtempSync(join(tmpdir(), "sessions-ts-bench-"));
  const override = process.env.SESSIONS_SERVER_CMD?.trim();
  const [cmd, ...args] = override ? override.split(/\s+/) : [join(repo, ".venv", "bin", "sessions-server")];
  const child = spawn(cmd, [...args, "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let errors = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk) => (errors = (errors + chunk).slice(-8192)));
  const address = await new Promise((ok, fail) => {
    let out = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk) => {
      out += chunk;
      const m = /sessions-server listening on (\S+:\d+)/.exec(out);
      if (m) ok(m[1]);
    });
    child.on("exit", (code) => fail(new Error(`server exited (${code}): ${out}\n${errors}`)));
    setTimeout(() => fail(new Error("server did not start in 30 s")), 30_000).unref();
  });
  return {
    address,
    async stop() {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A message whose JSON is exactly 1,024 bytes. */
function kilobyteMessage(id) {
  const base = JSON.stringify({ id, role: "user", parts: [{ type: "text", text: "" }] });
  return { id, role: "user", parts: [{ type: "text", text: "x".repeat(1024 - base.length) }] };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (n) => Math.round(n).toLocaleString("en-US");

const server = process.env.SESSIONS_ADDRESS ? null : await startServer();
const address = process.env.SESSIONS_ADDRESS ?? server.address;
const client = new SessionsClient(address);
try {
  const stamp = Date.now().toString(36);
  // Warm-up: open the connection and the object.
  const warm = client.object(`bench-warm-${stamp}`).session();
  for (let i = 0; i < 50; i++) await warm.appendMessage(kilobyteMessage(`w${i}`));

  const appendRates = [];
  for (let run = 0; run < RUNS; run++) {
    const s = client.object(`bench-append-${stamp}-${run}`).session();
    const start = performance.now();
    for (let i = 0; i < APPENDS; i++) await s.appendMessage(kilobyteMessage(`m${i}`));
    const seconds = (performance.now() - start) / 1000;
    appendRates.push(APPENDS / seconds);
    console.log(`append run ${run + 1}: ${APPENDS} serial 1 KB appends in ${seconds.toFixed(2)} s = ${fmt(APPENDS / seconds)} msg/s`);
  }

  const h = client.object(`bench-history-${stamp}`).session();
  for (let start = 0; start < HISTORY; start += 500) {
    const n = Math.min(500, HISTORY - start);
    await h.appendMessages(Array.from({ length: n }, (_, i) => kilobyteMessage(`h${start + i}`)));
  }
  const historyRates = [];
  for (let run = 0; run < RUNS; run++) {
    const start = performance.now();
    let count = 0;
    for await (const message of h.history()) {
      if (message.parts.length !== 1) throw new Error("bad message");
      count += 1;
    }
    const seconds = (performance.now() - start) / 1000;
    if (count !== HISTORY) throw new Error(`history returned ${count} messages, expected ${HISTORY}`);
    historyRates.push(count / seconds);
    console.log(`history run ${run + 1}: ${count} × 1 KB streamed in ${seconds.toFixed(2)} s = ${fmt(count / seconds)} msg/s`);
  }

  console.log(`\nnode ${process.version}, server ${address}`);
  console.log(`appends (serial, 1 KB, n=${APPENDS}): median ${fmt(median(appendRates))} msg/s`);
  console.log(`history (stream, 1 KB, n=${HISTORY}): median ${fmt(median(historyRates))} msg/s`);
} finally {
  client.close();
  await server?.stop();
}
