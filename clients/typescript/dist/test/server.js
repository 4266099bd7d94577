// Starts a real sessions-server for one test file: `serve --listen 127.0.0.1:0 --data-dir <tmp>`,
// reads the port from its "sessions-server listening on HOST:PORT" line, stops it with SIGTERM.
// SESSIONS_SERVER_CMD overrides the executable (whitespace-separated words; the serve arguments
// are appended).
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { SessionsClient } from "../src/index.js";
// dist/test/server.js → clients/typescript → repo root
const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const repoRoot = resolve(packageRoot, "..", "..");
export function serverCommand() {
    const override = process.env["SESSIONS_SERVER_CMD"]?.trim();
    if (override)
        return override.split(/\s+/);
    return [join(repoRoot, ".venv", "bin", "sessions-server")];
}
export class TestServer {
    address;
    child;
    dataDir;
    clients;
    constructor(address, child, dataDir, clients = []) {
        this.address = address;
        this.child = child;
        this.dataDir = dataDir;
        this.clients = clients;
    }
    static async start(extraArgs = []) {
        const dataDir = mkdtempSync(join(tmpdir(), "sessions-ts-test-"));
        const [cmd, ...args] = serverCommand();
        const child = spawn(cmd, [...args, "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, ...extraArgs], {
            stdio: ["ignore", "pipe", "pipe"],
        });
        let stderr = "";
        child.stderr.setEncoding("utf8");
        child.stderr.on("data", (chunk) => {
            stderr += chunk;
            if (stderr.length > 65536)
                stderr = stderr.slice(-65536);
        });
        const address = await new Promise((resolvePromise, reject) => {
            let stdout = "";
            const timer = setTimeout(() => {
                child.kill("SIGKILL");
                reject(new Error(`sessions-server did not start within 30 s\n${stdout}\n${stderr}`));
            }, 30_000);
            child.stdout.setEncoding("utf8");
            child.stdout.on("data", (chunk) => {
                stdout += chunk;
                const match = /sessions-server listening on (\S+:\d+)/.exec(stdout);
                if (match) {
                    clearTimeout(timer);
                    resolvePromise(match[1]);
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
        return new TestServer(address, child, dataDir);
    }
    /** A client that is closed by stop(). */
    client(options = {}) {
        const client = new SessionsClient(this.address, options);
        this.clients.push(client);
        return client;
    }
    async stop() {
        for (const client of this.clients)
            client.close();
        if (this.child.exitCode === null && this.child.signalCode === null) {
            const exited = new Promise((r) => this.child.once("exit", () => r()));
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
export function freshKey(prefix = "obj") {
    counter += 1;
    return `${prefix}-${process.pid}-${counter}-${Math.random().toString(36).slice(2, 8)}`;
}
export function msg(id, text = `text of ${id}`, role = "user") {
    return { id, role, parts: [{ type: "text", text }] };
}
//# sourceMappingURL=server.js.map