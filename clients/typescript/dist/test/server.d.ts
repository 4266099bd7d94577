import { SessionsClient, type ClientOptions } from "../src/index.js";
export declare function serverCommand(): string[];
export declare class TestServer {
    readonly address: string;
    private readonly child;
    private readonly dataDir;
    private readonly clients;
    private constructor();
    static start(extraArgs?: string[]): Promise<TestServer>;
    /** A client that is closed by stop(). */
    client(options?: ClientOptions): SessionsClient;
    stop(): Promise<void>;
}
/** A fresh object key per test, so tests do not see each other's messages. */
export declare function freshKey(prefix?: string): string;
export declare function msg(id: string, text?: string, role?: string): {
    id: string;
    role: string;
    parts: {
        type: string;
        text: string;
    }[];
};
