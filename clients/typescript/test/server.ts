// Starts a real sessions-server for one test file: `serve --listen 127.0.0.1:0 --data-dir <tmp>`,
// reads the port from its "sessions-server listening on HOST:PORT" line, stops it with SIGTERM.
// kill() and restart() kill it (SIGKILL) and start it again on the same port and data directory;
// signal() stalls (SIGSTOP) and resumes (SIGCONT) it.
// SESSIONS_SERVER_CMD overrides the executable (whitespace-separated words; the serve arguments
// are appended).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { SessionsClient, type ClientOptions } from "../src/index.js";

// dist/test/server.js → clients/typescript → repo root
const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const repoRoot = resolve(packageRoot, "..", "..");

export function serverCommand(): string[] {
  const override = process.env["SESSIONS_SERVER_CMD"]?.trim();
  if (override) return override.split(/\s+/);
  return [join(repoRoot, ".venv", "bin", "sessions-server")];
}

/** Starts `sessions-server serve --listen <listen> --data-dir <dataDir> ...extraArgs`; resolves with its address once it listens. */
async function spawnServer(
  listen: string,
  dataDir: string,
  extraArgs: string[],
): Promise<{ child: ChildProcess; address: string }> {
  const [cmd, ...args] = serverCommand();
  const child = spawn(cmd!, [...args, "serve", "--listen", listen, "--data-dir", dataDir, ...extraArgs], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr!.setEncoding("utf8");
  child.stderr!.on("data", (chunk: string) => {
    stderr += chunk;
    if (stderr.length > 65536) stderr = stderr.slice(-65536);
  });
  const address = await new Promise<string>((resolvePromise, reject) => {
    let stdout = "";
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`sessions-server did not start within 30 s\n${stdout}\n${stderr}`));
    }, 30_000);
    child.stdout!.setEncoding("utf8");
    child.stdout!.on("data", (chunk: string) => {
      stdout += chunk;
      const match = /sessions-server listening on (\S+:\d+)/.exec(stdout);
      if (match) {
        clearTimeout(timer);
        resolvePromise(match[1]!);
      }
    });
    child.on("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`sessions-server exited early (${code ?? signal})\n${stdout}\n${stderr}`));
    });
  });
  return { child, address };
}

export class TestServer {
  private constructor(
    readonly address: string,
    private child: ChildProcess,
    private readonly dataDir: string,
    private readonly extraArgs: string[],
    private readonly clients: SessionsClient[] = [],
  ) {}

  static async start(extraArgs: string[] = []): Promise<TestServer> {
    const dataDir = mkdtempSync(join(tmpdir(), "sessions-ts-test-"));
    const { child, address } = await spawnServer("127.0.0.1:0", dataDir, extraArgs);
    return new TestServer(address, child, dataDir, extraArgs);
  }

  /** A client that is closed by stop(). */
  client(options: ClientOptions = {}): SessionsClient {
    const client = new SessionsClient(this.address, options);
    this.clients.push(client);
    return client;
  }

  /** The server process's id. */
  get pid(): number {
    return this.child.pid!;
  }

  /** Sends `signal` to the server process (SIGSTOP / SIGCONT to stall and resume it). */
  signal(signal: NodeJS.Signals): void {
    this.child.kill(signal);
  }

  /** Kills the server process (SIGKILL: no drain, no goodbye) and waits for it to exit. */
  async kill(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise<void>((r) => this.child.once("exit", () => r()));
      this.child.kill("SIGKILL");
      await exited;
    }
  }

  /** Starts the server again on the same address and data directory, after kill(). */
  async restart(): Promise<void> {
    const { child } = await spawnServer(this.address, this.dataDir, this.extraArgs);
    this.child = child;
  }

  async stop(): Promise<void> {
    for (const client of this.clients) client.close();
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise<void>((r) => this.child.once("exit", () => r()));
      this.child.kill("SIGCONT"); // a stalled server (SIGSTOP) would not see the SIGTERM
      this.child.kill("SIGTERM");
      const timer = setTimeout(() => this.child.kill("SIGKILL"), 20_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

let counter = 0;
/** A fresh object key per test, so tests do not see each other's messages. */
export function freshKey(prefix = "obj"): string {
  counter += 1;
  return `${prefix}-${process.pid}-${counter}-${Math.random().toString(36).slice(2, 8)}`;
}

export function msg(id: string, text = `text of ${id}`, role = "user") {
  return { id, role, parts: [{ type: "text", text }] };
}
