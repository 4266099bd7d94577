/**
 * A thin client for the Sessions service (sessions.v1):
 *
 *     const client = new SessionsClient("127.0.0.1:50051");
 *     const session = client.object("user-42").session("chat");
 *     await session.appendMessage({ id: "m1", role: "user", parts: [{ type: "text", text: "hi" }] });
 *     for await (const message of session.history()) console.log(message);
 *
 * Messages are plain objects, sent as `JSON.stringify` text and read back with `JSON.parse`.
 * Every call sends the routing metadata `x-object-key` (percent-encoded UTF-8), reassembles
 * messages that the server sends in pieces, and writes messages above 3 MiB through the
 * client-streaming `UploadMessage`. Failures are thrown as `SessionsError` (status code plus the
 * `ErrorInfo` reason from the `grpc-status-details-bin` trailer).
 */
import { type Client, type Interceptor } from "@connectrpc/connect";
import { SessionService } from "./gen/sessions/v1/sessions_pb.js";
export * as pb from "./gen/sessions/v1/sessions_pb.js";
/** An AI SDK UIMessage-compatible object: a string `id`, a string `role` and an array `parts`. */
export interface Message {
    id: string;
    role: string;
    parts: unknown[];
    [key: string]: unknown;
}
/** A message given to a write: an object (serialized with JSON.stringify) or JSON text as is. */
export type MessageInput = Message | Record<string, unknown> | string;
/** Where an appended message attaches: `undefined` = auto (the newest message), `null` = a new root. */
export type ParentArg = string | null | undefined;
/** Who produced a message: "client" input has the server's reserved metadata keys removed. */
export type SourceArg = "server" | "client";
export interface WriteOptions {
    /** undefined: attach to the session's newest message; null: start a new root; a string: that parent. */
    parentId?: string | null;
    source?: SourceArg;
}
export interface AppendResult {
    /** False when the id already existed; `message` is then the stored one. */
    inserted: boolean;
    /** The stored message. */
    message: Message;
    /** The parent actually used (null for a root). */
    parentId: string | null;
}
export interface UpsertResult {
    inserted: boolean;
    changed: boolean;
    message: Message;
}
export interface RecentHistory {
    messages: Message[];
    /** True when older messages on the path were left out. */
    truncated: boolean;
    /** Stored bytes of the whole path. */
    totalContentBytes: number;
}
export interface RowStat {
    id: string;
    role: string;
    bytes: number;
    tokenEstimate: number;
}
export interface ImportResult {
    imported: number;
    skipped: number;
}
/** One message to import verbatim, with its parent (null: a root) and created time. */
export declare class ImportItem {
    readonly message: MessageInput;
    readonly parentId: string | null;
    readonly createdAt?: (number | Date) | undefined;
    constructor(message: MessageInput, parentId: string | null, createdAt?: (number | Date) | undefined);
}
/** An ImportItem as a plain object literal. */
export interface ImportItemLike {
    message: MessageInput;
    parentId: string | null;
    createdAt?: number | Date;
}
export interface HistoryOptions {
    /** The leaf whose path to read; default the active leaf. */
    leafId?: string;
    /** Read from the leaf towards the root. */
    newestFirst?: boolean;
}
export interface HistoryBatchOptions extends HistoryOptions {
    batchSize?: number;
    maxBatchBytes?: number;
}
export interface SubscribeOptions {
    /** Only events of this session (undefined: every session of the object). */
    sessionId?: string;
    /**
     * Resume after this revision (0: start live, from the next event). Revisions are uint64 values
     * around 2^62 (`epoch_ms << 22 | counter`), so keep them as bigint (or a decimal string):
     * a JS number loses their low bits.
     */
    resumeAfterRevision?: bigint | string | number;
    /** Cancels the subscription (breaking out of the loop does too). */
    signal?: AbortSignal;
}
export type ChangeTypeName = "UNSPECIFIED" | "APPEND" | "UPDATE" | "DELETE" | "CLEAR" | "COMPACT" | "COMPACTION" | "IMPORT" | "COMPACTION_ERROR" | "RESET" | "PROGRESS";
export interface Compaction {
    id: string;
    seq: number;
    summary: string;
    fromMessageId: string;
    toMessageId: string;
    createdAtMs: number;
}
/** One change event of an object, with its message reassembled. */
export interface ChangeEvent {
    /** The object-wide revision (uint64, beyond Number.MAX_SAFE_INTEGER: always a bigint). */
    revision: bigint;
    type: ChangeTypeName;
    sessionId: string;
    /** APPEND, UPDATE, IMPORT: the message. */
    message?: Message;
    /** APPEND: whether a new row was written. */
    inserted: boolean;
    /** APPEND: the parent option as the caller passed it ("AUTO", "ROOT", "ID"); IMPORT: the parent stored. */
    parentMode: "UNSPECIFIED" | "AUTO" | "ROOT" | "ID";
    parentId: string;
    /** DELETE: the ids the caller passed. */
    messageIds: string[];
    /** COMPACTION: the stored record. */
    compaction?: Compaction;
    /** COMPACTION_ERROR: what failed; RESET: why events were missed. */
    error: string;
}
export interface SessionSummary {
    sessionId: string;
    messageCount: number;
}
export interface ObjectStats {
    fileBytes: number;
    messageRows: number;
    continuationRows: number;
    attachmentCount: number;
    attachmentBytes: number;
    rowWrites: number;
    sessionCount: number;
}
export interface ClientOptions {
    /** Sent as `authorization: Bearer <token>` on every call. */
    token?: string;
    /** Deadline for every call, in milliseconds (none by default). */
    timeoutMs?: number;
    /** Further interceptors for the underlying Connect transport. */
    interceptors?: Interceptor[];
}
export declare const OBJECT_KEY_HEADER = "x-object-key";
/** A write above this many UTF-8 bytes goes through UploadMessage, so default 4 MiB limits hold. */
export declare const UNARY_LIMIT_BYTES: number;
/** Size of each piece of a streamed message, in UTF-8 bytes. */
export declare const PIECE_BYTES: number;
/** A failed call: the canonical gRPC status code name, the server's message and its ErrorInfo. */
export declare class SessionsError extends Error {
    name: string;
    /** The gRPC status code name, e.g. "INVALID_ARGUMENT". */
    readonly code: string;
    /** The numeric gRPC status code, e.g. 3. */
    readonly grpcCode: number;
    /** The ErrorInfo reason, e.g. "INVALID_JSON" (null when the server sent none). */
    readonly reason: string | null;
    /** The ErrorInfo domain, "sessions.v1" for the service's own errors. */
    readonly domain: string | null;
    /** The ErrorInfo metadata (e.g. field, detail). */
    readonly metadata: Record<string, string>;
    /** The server's message without the code prefix. */
    readonly rawMessage: string;
    constructor(grpcCode: number, rawMessage: string, reason?: string | null, metadata?: Record<string, string>, domain?: string | null, options?: {
        cause?: unknown;
    });
    /** Converts any error thrown by a call; non-RPC errors are returned unchanged. */
    static from(error: unknown): unknown;
}
/** Percent-encodes an object key as Python's `urllib.parse.quote(key, safe="")` does. */
export declare function encodeObjectKey(objectKey: string): string;
/** The routing metadata for one object key. */
export declare function routingHeaders(objectKey: string): Record<string, string>;
/** Cuts JSON text into pieces of at most PIECE_BYTES UTF-8 bytes, on character boundaries. */
export declare function pieces(text: string, pieceBytes?: number): Generator<string>;
type Rpc = Client<typeof SessionService>;
/** Per-call options passed to the generated client. */
export interface CallOptions {
    headers: Record<string, string>;
    timeoutMs?: number;
    signal?: AbortSignal;
}
/** A connection to a Sessions server. Call `close()` when done. */
export declare class SessionsClient {
    /** The generated Connect client, for RPCs the wrapper does not cover; pass `routingHeaders(key)`. */
    readonly rpc: Rpc;
    readonly address: string;
    private readonly sessionManager;
    private readonly timeoutMs;
    /** `address` is "host:port" (plaintext HTTP/2) or a full "http://" / "https://" URL. */
    constructor(address: string, options?: ClientOptions);
    object(objectKey: string): ObjectHandle;
    /** Closes the HTTP/2 connection (and any call still open on it). */
    close(): void;
    /**
     * @internal Call options for one object: routing header, deadline (`timeoutMs`, unless
     * `deadline` is false, as for the long-lived change feed), cancellation.
     */
    callOptions(objectKey: string, signal?: AbortSignal, deadline?: boolean): CallOptions;
    /** @internal Runs a unary or client-streaming call, converting its errors. */
    call<T>(run: () => Promise<T>): Promise<T>;
    /**
     * @internal Runs a server-streaming call; breaking out of the loop (or an error) cancels it so
     * the server stops reading.
     */
    stream<T>(objectKey: string, start: (options: CallOptions) => AsyncIterable<T>, signal?: AbortSignal, deadline?: boolean): AsyncGenerator<T>;
}
/** One object (an isolated store) on the server. */
export declare class ObjectHandle {
    readonly client: SessionsClient;
    readonly key: string;
    constructor(client: SessionsClient, key: string);
    session(sessionId?: string): SessionHandle;
    /** The sessions that hold messages or compactions, with their message counts. */
    listSessions(): Promise<SessionSummary[]>;
    /** The object's storage: bytes, rows, attachments and row writes. */
    getObjectStats(): Promise<ObjectStats>;
    /**
     * Streams the object's change events in commit order (of every session, or of `sessionId`).
     * Large messages are reassembled. Break out of the loop (or abort `signal`) to unsubscribe.
     */
    subscribe(options?: SubscribeOptions): AsyncGenerator<ChangeEvent>;
}
/** One session inside an object; messages are plain objects. */
export declare class SessionHandle {
    readonly object: ObjectHandle;
    readonly id: string;
    readonly client: SessionsClient;
    readonly key: string;
    constructor(object: ObjectHandle, id: string);
    private get rpc();
    private opts;
    /** Appends one message; idempotent by id (a duplicate answers inserted=false with the stored one). */
    appendMessage(message: MessageInput, options?: WriteOptions): Promise<AppendResult>;
    /** Appends in one transaction; `parentId` applies to the first message, the rest chain (auto). */
    appendMessages(messages: Iterable<MessageInput>, options?: WriteOptions): Promise<AppendResult[]>;
    /** Replaces an existing message's content; null when no message has that id. */
    updateMessage(message: MessageInput, options?: {
        source?: SourceArg;
    }): Promise<Message | null>;
    /** Appends the message when its id is new, otherwise updates it (never re-parents it). */
    upsertMessage(message: MessageInput, options?: WriteOptions): Promise<UpsertResult>;
    /** Deletes messages by id (children are re-parented); returns how many were deleted. */
    deleteMessages(ids: Iterable<string>): Promise<number>;
    /** Deletes every message and compaction of the session; returns how many messages were deleted. */
    clearMessages(): Promise<number>;
    /** Imports one message verbatim; false when its id already existed. */
    importMessage(message: MessageInput, options: {
        parentId: string | null;
        createdAt?: number | Date;
    }): Promise<boolean>;
    /**
     * Streams messages in verbatim (explicit parent and created time). Items are `ImportItem`s /
     * `{message, parentId, createdAt?}` literals, or plain messages, which chain: each one's parent
     * is the previous item's message. Large messages are sent in pieces.
     */
    importMessages(items: Iterable<ImportItem | ImportItemLike | MessageInput> | AsyncIterable<ImportItem | ImportItemLike | MessageInput>): Promise<ImportResult>;
    /** One message by id; null when it does not exist. */
    getMessage(messageId: string): Promise<Message | null>;
    /** Messages in the order of `ids`, null where absent. */
    getMessages(ids: Iterable<string>): Promise<(Message | null)[]>;
    /** The active leaf (the session's newest message); null for an empty session. */
    getLatestLeaf(): Promise<Message | null>;
    /** The direct children of a message, oldest first. */
    getBranches(messageId: string): Promise<Message[]>;
    /** Streams one root-to-leaf path; break out of the loop to stop the server's reads. */
    history(options?: HistoryOptions): AsyncGenerator<Message>;
    /** Streams a path in batches marked by the server (by count and JSON bytes). */
    historyBatches(options?: HistoryBatchOptions): AsyncGenerator<Message[]>;
    /** The whole path as an array. */
    getHistory(options?: HistoryOptions): Promise<Message[]>;
    /** The longest recent suffix of a path whose stored size fits `maxContentBytes` (at least the newest message). */
    getRecentHistory(maxContentBytes: number, options?: {
        leafId?: string;
    }): Promise<RecentHistory>;
    /** Per-message stored sizes and token estimates along a path, root first. */
    getHistoryRowStats(options?: {
        leafId?: string;
    }): Promise<RowStat[]>;
    /** The object's change feed, filtered to this session unless `sessionId` says otherwise. */
    subscribe(options?: SubscribeOptions): AsyncGenerator<ChangeEvent>;
    private messages;
    private written;
    private upload;
}
