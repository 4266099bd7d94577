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
import { create } from "@bufbuild/protobuf";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { ChangeType, ImportMessagesRequestSchema, ParentMode, SessionService, Source, UploadHeaderSchema, UploadMessageRequestSchema, UploadOperation, } from "./gen/sessions/v1/sessions_pb.js";
export * as pb from "./gen/sessions/v1/sessions_pb.js";
/** One message to import verbatim, with its parent (null: a root) and created time. */
export class ImportItem {
    message;
    parentId;
    createdAt;
    constructor(message, parentId, createdAt) {
        this.message = message;
        this.parentId = parentId;
        this.createdAt = createdAt;
    }
}
export const OBJECT_KEY_HEADER = "x-object-key";
/** A write above this many UTF-8 bytes goes through UploadMessage, so default 4 MiB limits hold. */
export const UNARY_LIMIT_BYTES = 3 * 1024 * 1024;
/** Size of each piece of a streamed message, in UTF-8 bytes. */
export const PIECE_BYTES = 3 * 1024 * 1024;
const ERROR_INFO_TYPE = "google.rpc.ErrorInfo";
/** A failed call: the canonical gRPC status code name, the server's message and its ErrorInfo. */
export class SessionsError extends Error {
    name = "SessionsError";
    /** The gRPC status code name, e.g. "INVALID_ARGUMENT". */
    code;
    /** The numeric gRPC status code, e.g. 3. */
    grpcCode;
    /** The ErrorInfo reason, e.g. "INVALID_JSON" (null when the server sent none). */
    reason;
    /** The ErrorInfo domain, "sessions.v1" for the service's own errors. */
    domain;
    /** The ErrorInfo metadata (e.g. field, detail). */
    metadata;
    /** The server's message without the code prefix. */
    rawMessage;
    constructor(grpcCode, rawMessage, reason = null, metadata = {}, domain = null, options) {
        const code = codeName(grpcCode);
        super(`${code}: ${rawMessage}${reason ? ` [${reason}]` : ""}`, options);
        this.code = code;
        this.grpcCode = grpcCode;
        this.rawMessage = rawMessage;
        this.reason = reason;
        this.metadata = metadata;
        this.domain = domain;
    }
    /** Converts any error thrown by a call; non-RPC errors are returned unchanged. */
    static from(error) {
        if (error instanceof SessionsError)
            return error;
        if (!(error instanceof ConnectError))
            return error;
        let reason = null;
        let domain = null;
        let metadata = {};
        for (const detail of error.details) {
            if ("desc" in detail || detail.type !== ERROR_INFO_TYPE)
                continue;
            try {
                ({ reason, domain, metadata } = decodeErrorInfo(detail.value));
            }
            catch {
                // A detail that does not decode leaves the error without a reason.
            }
            break;
        }
        return new SessionsError(error.code, error.rawMessage, reason, metadata, domain, { cause: error });
    }
}
const CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
};
function codeName(code) {
    return CODE_NAMES[code] ?? `CODE_${code}`;
}
/** Decodes google.rpc.ErrorInfo {reason = 1, domain = 2, map<string, string> metadata = 3}. */
function decodeErrorInfo(bytes) {
    const reader = new BinaryReader(bytes);
    let reason = null;
    let domain = null;
    const metadata = {};
    while (reader.pos < reader.len) {
        const [field, wireType] = reader.tag();
        if (field === 1 && wireType === 2)
            reason = reader.string();
        else if (field === 2 && wireType === 2)
            domain = reader.string();
        else if (field === 3 && wireType === 2) {
            const entry = new BinaryReader(reader.bytes());
            let key = "";
            let value = "";
            while (entry.pos < entry.len) {
                const [f, w] = entry.tag();
                if (f === 1 && w === 2)
                    key = entry.string();
                else if (f === 2 && w === 2)
                    value = entry.string();
                else
                    entry.skip(w);
            }
            metadata[key] = value;
        }
        else
            reader.skip(wireType);
    }
    return { reason, domain, metadata };
}
/** Percent-encodes an object key as Python's `urllib.parse.quote(key, safe="")` does. */
export function encodeObjectKey(objectKey) {
    return encodeURIComponent(objectKey).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}
/** The routing metadata for one object key. */
export function routingHeaders(objectKey) {
    return { [OBJECT_KEY_HEADER]: encodeObjectKey(objectKey) };
}
function toJson(message) {
    if (typeof message === "string")
        return message;
    const text = JSON.stringify(message);
    if (typeof text !== "string")
        throw new TypeError("message is not JSON-serializable");
    return text;
}
function jsonSize(text) {
    // Each UTF-16 code unit is at most 3 UTF-8 bytes: skip the count for clearly small text.
    return text.length * 3 <= UNARY_LIMIT_BYTES ? text.length : Buffer.byteLength(text, "utf8");
}
/** Cuts JSON text into pieces of at most PIECE_BYTES UTF-8 bytes, on character boundaries. */
export function* pieces(text, pieceBytes = PIECE_BYTES) {
    if (text.length * 3 <= pieceBytes) {
        yield text;
        return;
    }
    const data = Buffer.from(text, "utf8");
    let start = 0;
    while (start < data.length) {
        let end = Math.min(start + pieceBytes, data.length);
        while (end < data.length && (data[end] & 0xc0) === 0x80)
            end -= 1;
        if (end === start)
            throw new RangeError("pieceBytes is smaller than one UTF-8 character");
        yield data.toString("utf8", start, end);
        start = end;
    }
}
function parentFields(parentId) {
    if (parentId === undefined)
        return { parentMode: ParentMode.AUTO, parentId: "" };
    if (parentId === null)
        return { parentMode: ParentMode.ROOT, parentId: "" };
    if (typeof parentId === "string")
        return { parentMode: ParentMode.ID, parentId };
    throw new TypeError("parentId must be undefined (auto), null (root) or a message id");
}
function sourceValue(source) {
    if (source === undefined || source === "server")
        return Source.SERVER;
    if (source === "client")
        return Source.CLIENT;
    throw new TypeError('source must be "server" or "client"');
}
function createdAtMs(value) {
    if (value === undefined)
        return BigInt(Date.now());
    if (value instanceof Date)
        return BigInt(value.getTime());
    return BigInt(Math.trunc(value));
}
function parentOf(info) {
    return info?.parentId ?? null;
}
function parseMessage(text) {
    return JSON.parse(text);
}
function messageIdOf(message) {
    let value = message;
    if (typeof message === "string") {
        try {
            value = JSON.parse(message);
        }
        catch {
            return null;
        }
    }
    const id = value !== null && typeof value === "object" ? value.id : undefined;
    return typeof id === "string" ? id : null;
}
function isImportItem(item) {
    if (item instanceof ImportItem)
        return true;
    return (item !== null &&
        typeof item === "object" &&
        "message" in item &&
        "parentId" in item &&
        !("parts" in item));
}
/** Joins MessageFrame pieces back into whole messages. */
class FrameAssembler {
    info;
    parts = [];
    open = false;
    feed(frame) {
        if (!this.open) {
            this.info = frame.info;
            this.open = true;
        }
        this.parts.push(frame.json);
        if (frame.morePieces)
            return null;
        const json = this.parts.length === 1 ? this.parts[0] : this.parts.join("");
        const done = { info: this.info, json };
        this.info = undefined;
        this.parts = [];
        this.open = false;
        return done;
    }
    finish() {
        if (this.open) {
            throw new SessionsError(Code.DataLoss, "stream ended inside a message", "INVALID_STREAM");
        }
    }
}
function toNumber(value) {
    return typeof value === "bigint" ? Number(value) : value;
}
function compactionOf(c) {
    if (c === undefined)
        return undefined;
    return {
        id: c.id,
        seq: toNumber(c.seq),
        summary: c.summary,
        fromMessageId: c.fromMessageId,
        toMessageId: c.toMessageId,
        createdAtMs: toNumber(c.createdAtMs),
    };
}
/** A connection to a Sessions server. Call `close()` when done. */
export class SessionsClient {
    /** The generated Connect client, for RPCs the wrapper does not cover; pass `routingHeaders(key)`. */
    rpc;
    address;
    sessionManager;
    timeoutMs;
    /** `address` is "host:port" (plaintext HTTP/2) or a full "http://" / "https://" URL. */
    constructor(address, options = {}) {
        const baseUrl = /^https?:\/\//.test(address) ? address : `http://${address}`;
        this.address = address;
        this.timeoutMs = options.timeoutMs;
        this.sessionManager = new Http2SessionManager(baseUrl);
        const interceptors = [...(options.interceptors ?? [])];
        if (options.token !== undefined) {
            const value = `Bearer ${options.token}`;
            interceptors.unshift((next) => (req) => {
                req.header.set("authorization", value);
                return next(req);
            });
        }
        const transport = createGrpcTransport({
            baseUrl,
            sessionManager: this.sessionManager,
            interceptors,
        });
        this.rpc = createClient(SessionService, transport);
    }
    object(objectKey) {
        return new ObjectHandle(this, objectKey);
    }
    /** Closes the HTTP/2 connection (and any call still open on it). */
    close() {
        this.sessionManager.abort();
    }
    /**
     * @internal Call options for one object: routing header, deadline (`timeoutMs`, unless
     * `deadline` is false, as for the long-lived change feed), cancellation.
     */
    callOptions(objectKey, signal, deadline = true) {
        const options = { headers: routingHeaders(objectKey) };
        if (deadline && this.timeoutMs !== undefined)
            options.timeoutMs = this.timeoutMs;
        if (signal !== undefined)
            options.signal = signal;
        return options;
    }
    /** @internal Runs a unary or client-streaming call, converting its errors. */
    async call(run) {
        try {
            return await run();
        }
        catch (error) {
            throw SessionsError.from(error);
        }
    }
    /**
     * @internal Runs a server-streaming call; breaking out of the loop (or an error) cancels it so
     * the server stops reading.
     */
    async *stream(objectKey, start, signal, deadline = true) {
        const controller = new AbortController();
        const onAbort = () => controller.abort(signal?.reason);
        // The deadline is kept here rather than by Connect's `timeoutMs`: Connect leaves its deadline
        // timer running when a stream is cancelled through its signal, which keeps the process alive.
        const timeoutMs = deadline ? this.timeoutMs : undefined;
        const timer = timeoutMs === undefined
            ? undefined
            : setTimeout(() => controller.abort(new ConnectError("the operation timed out", Code.DeadlineExceeded)), timeoutMs);
        if (signal !== undefined) {
            if (signal.aborted)
                controller.abort(signal.reason);
            else
                signal.addEventListener("abort", onAbort, { once: true });
        }
        let finished = false;
        try {
            for await (const response of start(this.callOptions(objectKey, controller.signal, false))) {
                yield response;
            }
            finished = true;
        }
        catch (error) {
            throw SessionsError.from(error);
        }
        finally {
            clearTimeout(timer);
            signal?.removeEventListener("abort", onAbort);
            // The consumer stopped early (break, return, throw): cancel so the server stops reading.
            if (!finished)
                controller.abort(new ConnectError("the caller stopped reading the stream", Code.Canceled));
        }
    }
}
/** One object (an isolated store) on the server. */
export class ObjectHandle {
    client;
    key;
    constructor(client, key) {
        this.client = client;
        this.key = key;
    }
    session(sessionId = "") {
        return new SessionHandle(this, sessionId);
    }
    /** The sessions that hold messages or compactions, with their message counts. */
    async listSessions() {
        const response = await this.client.call(() => this.client.rpc.listSessions({ objectKey: this.key }, this.client.callOptions(this.key)));
        return response.sessions.map((s) => ({ sessionId: s.sessionId, messageCount: toNumber(s.messageCount) }));
    }
    /** The object's storage: bytes, rows, attachments and row writes. */
    async getObjectStats() {
        const r = await this.client.call(() => this.client.rpc.getObjectStats({ objectKey: this.key }, this.client.callOptions(this.key)));
        return {
            fileBytes: toNumber(r.fileBytes),
            messageRows: toNumber(r.messageRows),
            continuationRows: toNumber(r.continuationRows),
            attachmentCount: toNumber(r.attachmentCount),
            attachmentBytes: toNumber(r.attachmentBytes),
            rowWrites: toNumber(r.rowWrites),
            sessionCount: toNumber(r.sessionCount),
        };
    }
    /**
     * Streams the object's change events in commit order (of every session, or of `sessionId`).
     * Large messages are reassembled. Break out of the loop (or abort `signal`) to unsubscribe.
     */
    async *subscribe(options = {}) {
        const request = {
            objectKey: this.key,
            resumeAfterRevision: BigInt(options.resumeAfterRevision ?? 0),
            ...(options.sessionId !== undefined ? { sessionId: options.sessionId } : {}),
        };
        const assembler = new FrameAssembler();
        let head = null;
        const responses = this.client.stream(this.key, (o) => this.client.rpc.subscribe(request, o), options.signal, false);
        for await (const response of responses) {
            if (head === null) {
                head = {
                    revision: response.revision,
                    type: (ChangeType[response.type] ?? "UNSPECIFIED"),
                    sessionId: response.sessionId,
                    inserted: response.inserted,
                    parentMode: (ParentMode[response.parentMode] ?? "UNSPECIFIED"),
                    parentId: response.parentId,
                    messageIds: [...response.messageIds],
                    error: response.error,
                };
                const compaction = compactionOf(response.compaction);
                if (compaction !== undefined)
                    head.compaction = compaction;
            }
            if (response.message !== undefined) {
                const done = assembler.feed(response.message);
                if (done === null)
                    continue;
                head.message = parseMessage(done.json);
            }
            const event = head;
            head = null;
            yield event;
        }
        assembler.finish();
    }
}
/** One session inside an object; messages are plain objects. */
export class SessionHandle {
    object;
    id;
    client;
    key;
    constructor(object, id) {
        this.object = object;
        this.id = id;
        this.client = object.client;
        this.key = object.key;
    }
    get rpc() {
        return this.client.rpc;
    }
    opts() {
        return this.client.callOptions(this.key);
    }
    // ── writes ────────────────────────────────────────────────────────────────
    /** Appends one message; idempotent by id (a duplicate answers inserted=false with the stored one). */
    async appendMessage(message, options = {}) {
        const text = toJson(message);
        if (jsonSize(text) > UNARY_LIMIT_BYTES) {
            const upload = await this.upload(UploadOperation.APPEND, text, options.parentId, options.source);
            return {
                inserted: upload.inserted,
                message: await this.written(upload.message),
                parentId: parentOf(upload.message?.info),
            };
        }
        const response = await this.client.call(() => this.rpc.appendMessage({
            objectKey: this.key,
            sessionId: this.id,
            messageJson: text,
            source: sourceValue(options.source),
            ...parentFields(options.parentId),
        }, this.opts()));
        return {
            inserted: response.inserted,
            message: await this.written(response.message),
            parentId: parentOf(response.message?.info),
        };
    }
    /** Appends in one transaction; `parentId` applies to the first message, the rest chain (auto). */
    async appendMessages(messages, options = {}) {
        const source = sourceValue(options.source);
        const items = [...messages].map((message, index) => ({
            messageJson: toJson(message),
            source,
            ...parentFields(index === 0 ? options.parentId : undefined),
        }));
        const response = await this.client.call(() => this.rpc.appendMessages({ objectKey: this.key, sessionId: this.id, items }, this.opts()));
        const out = [];
        for (const r of response.results) {
            out.push({ inserted: r.inserted, message: await this.written(r.message), parentId: parentOf(r.message?.info) });
        }
        return out;
    }
    /** Replaces an existing message's content; null when no message has that id. */
    async updateMessage(message, options = {}) {
        const text = toJson(message);
        if (jsonSize(text) > UNARY_LIMIT_BYTES) {
            const upload = await this.upload(UploadOperation.UPDATE, text, undefined, options.source);
            return upload.found ? await this.written(upload.message) : null;
        }
        const response = await this.client.call(() => this.rpc.updateMessage({ objectKey: this.key, sessionId: this.id, messageJson: text, source: sourceValue(options.source) }, this.opts()));
        return response.found ? await this.written(response.message) : null;
    }
    /** Appends the message when its id is new, otherwise updates it (never re-parents it). */
    async upsertMessage(message, options = {}) {
        const text = toJson(message);
        if (jsonSize(text) > UNARY_LIMIT_BYTES) {
            const upload = await this.upload(UploadOperation.UPSERT, text, options.parentId, options.source);
            return { inserted: upload.inserted, changed: upload.changed, message: await this.written(upload.message) };
        }
        const response = await this.client.call(() => this.rpc.upsertMessage({
            objectKey: this.key,
            sessionId: this.id,
            messageJson: text,
            source: sourceValue(options.source),
            ...parentFields(options.parentId),
        }, this.opts()));
        return { inserted: response.inserted, changed: response.changed, message: await this.written(response.message) };
    }
    /** Deletes messages by id (children are re-parented); returns how many were deleted. */
    async deleteMessages(ids) {
        const response = await this.client.call(() => this.rpc.deleteMessages({ objectKey: this.key, sessionId: this.id, messageIds: [...ids] }, this.opts()));
        return toNumber(response.deletedCount);
    }
    /** Deletes every message and compaction of the session; returns how many messages were deleted. */
    async clearMessages() {
        const response = await this.client.call(() => this.rpc.clearMessages({ objectKey: this.key, sessionId: this.id }, this.opts()));
        return toNumber(response.deletedCount);
    }
    /** Imports one message verbatim; false when its id already existed. */
    async importMessage(message, options) {
        const item = new ImportItem(message, options.parentId, options.createdAt);
        return (await this.importMessages([item])).imported === 1;
    }
    /**
     * Streams messages in verbatim (explicit parent and created time). Items are `ImportItem`s /
     * `{message, parentId, createdAt?}` literals, or plain messages, which chain: each one's parent
     * is the previous item's message. Large messages are sent in pieces.
     */
    async importMessages(items) {
        const frames = importFrames(this.key, this.id, items);
        const response = await this.client.call(() => this.rpc.importMessages(frames, this.opts()));
        return { imported: toNumber(response.importedCount), skipped: toNumber(response.skippedCount) };
    }
    // ── reads ─────────────────────────────────────────────────────────────────
    /** One message by id; null when it does not exist. */
    async getMessage(messageId) {
        const request = { objectKey: this.key, sessionId: this.id, messageId };
        let message = null;
        // Read to the end (one message at most) rather than cancel the call after the first.
        for await (const found of this.messages((o) => this.rpc.getMessage(request, o))) {
            message ??= parseMessage(found.json);
        }
        return message;
    }
    /** Messages in the order of `ids`, null where absent. */
    async getMessages(ids) {
        const messageIds = [...ids];
        const request = { objectKey: this.key, sessionId: this.id, messageIds };
        const byId = new Map();
        for await (const found of this.messages((o) => this.rpc.getMessages(request, o))) {
            const message = parseMessage(found.json);
            byId.set(found.info?.id ?? message.id, message);
        }
        return messageIds.map((id) => byId.get(id) ?? null);
    }
    /** The active leaf (the session's newest message); null for an empty session. */
    async getLatestLeaf() {
        const request = { objectKey: this.key, sessionId: this.id };
        let message = null;
        for await (const found of this.messages((o) => this.rpc.getLatestLeaf(request, o))) {
            message ??= parseMessage(found.json);
        }
        return message;
    }
    /** The direct children of a message, oldest first. */
    async getBranches(messageId) {
        const request = { objectKey: this.key, sessionId: this.id, messageId };
        const out = [];
        for await (const found of this.messages((o) => this.rpc.getBranches(request, o))) {
            out.push(parseMessage(found.json));
        }
        return out;
    }
    /** Streams one root-to-leaf path; break out of the loop to stop the server's reads. */
    async *history(options = {}) {
        const request = {
            objectKey: this.key,
            sessionId: this.id,
            leafId: options.leafId ?? "",
            newestFirst: options.newestFirst ?? false,
        };
        for await (const found of this.messages((o) => this.rpc.streamHistory(request, o))) {
            yield parseMessage(found.json);
        }
    }
    /** Streams a path in batches marked by the server (by count and JSON bytes). */
    async *historyBatches(options = {}) {
        const request = {
            objectKey: this.key,
            sessionId: this.id,
            leafId: options.leafId ?? "",
            newestFirst: options.newestFirst ?? false,
            batchSize: Math.max(1, Math.trunc(options.batchSize ?? 50)),
            maxBatchBytes: BigInt(Math.max(1, Math.trunc(options.maxBatchBytes ?? 4 * 1024 * 1024))),
        };
        let batch = [];
        const assembler = new FrameAssembler();
        for await (const response of this.client.stream(this.key, (o) => this.rpc.streamHistory(request, o))) {
            if (response.frame !== undefined) {
                const done = assembler.feed(response.frame);
                if (done !== null)
                    batch.push(parseMessage(done.json));
            }
            if (response.batchEnd) {
                yield batch;
                batch = [];
            }
        }
        assembler.finish();
        if (batch.length > 0)
            yield batch;
    }
    /** The whole path as an array. */
    async getHistory(options = {}) {
        const out = [];
        for await (const message of this.history(options))
            out.push(message);
        return out;
    }
    /** The longest recent suffix of a path whose stored size fits `maxContentBytes` (at least the newest message). */
    async getRecentHistory(maxContentBytes, options = {}) {
        const request = {
            objectKey: this.key,
            sessionId: this.id,
            maxContentBytes: BigInt(Math.trunc(maxContentBytes)),
            leafId: options.leafId ?? "",
        };
        let truncated = false;
        let total = 0;
        const messages = [];
        const assembler = new FrameAssembler();
        for await (const response of this.client.stream(this.key, (o) => this.rpc.getRecentHistory(request, o))) {
            if (response.summary !== undefined) {
                truncated = response.summary.truncated;
                total = toNumber(response.summary.totalContentBytes);
            }
            if (response.frame !== undefined) {
                const done = assembler.feed(response.frame);
                if (done !== null)
                    messages.push(parseMessage(done.json));
            }
        }
        assembler.finish();
        return { messages, truncated, totalContentBytes: total };
    }
    /** Per-message stored sizes and token estimates along a path, root first. */
    async getHistoryRowStats(options = {}) {
        const request = { objectKey: this.key, sessionId: this.id, leafId: options.leafId ?? "" };
        const out = [];
        for await (const response of this.client.stream(this.key, (o) => this.rpc.getHistoryRowStats(request, o))) {
            for (const s of response.stats) {
                out.push({ id: s.id, role: s.role, bytes: toNumber(s.bytes), tokenEstimate: toNumber(s.tokenEstimate) });
            }
        }
        return out;
    }
    /** The object's change feed, filtered to this session unless `sessionId` says otherwise. */
    subscribe(options = {}) {
        return this.object.subscribe({ sessionId: this.id, ...options });
    }
    // ── helpers ───────────────────────────────────────────────────────────────
    async *messages(start) {
        const assembler = new FrameAssembler();
        for await (const response of this.client.stream(this.key, start)) {
            if (response.frame === undefined)
                continue;
            const done = assembler.feed(response.frame);
            if (done !== null)
                yield done;
        }
        assembler.finish();
    }
    async written(written) {
        if (written === undefined) {
            throw new SessionsError(Code.Internal, "the server returned no stored message");
        }
        if (written.jsonOmitted) {
            const id = written.info?.id ?? "";
            const fetched = await this.getMessage(id);
            if (fetched === null) {
                throw new SessionsError(Code.NotFound, "written message vanished before it was read back");
            }
            return fetched;
        }
        return parseMessage(written.json);
    }
    upload(operation, text, parentId, source) {
        const header = create(UploadHeaderSchema, {
            objectKey: this.key,
            sessionId: this.id,
            operation,
            source: sourceValue(source),
            ...(operation === UploadOperation.UPDATE ? {} : parentFields(parentId)),
        });
        async function* frames() {
            let first = true;
            for (const piece of pieces(text)) {
                yield create(UploadMessageRequestSchema, first ? { header, jsonPiece: piece } : { jsonPiece: piece });
                first = false;
            }
        }
        return this.client.call(() => this.rpc.uploadMessage(frames(), this.opts()));
    }
}
async function* importFrames(objectKey, sessionId, items) {
    let previous = null;
    let first = true;
    for await (const raw of items) {
        const item = isImportItem(raw) ? raw : { message: raw, parentId: previous };
        const text = toJson(item.message);
        const parts = [...pieces(text)];
        for (let index = 0; index < parts.length; index++) {
            const request = create(ImportMessagesRequestSchema, {
                jsonPiece: parts[index],
                morePieces: index < parts.length - 1,
            });
            if (first) {
                request.objectKey = objectKey;
                request.sessionId = sessionId;
                first = false;
            }
            if (index === 0) {
                request.createdAtMs = createdAtMs(item.createdAt);
                if (item.parentId !== null && item.parentId !== undefined)
                    request.parentId = item.parentId;
            }
            yield request;
        }
        previous = messageIdOf(item.message);
    }
    if (first) {
        // An empty import still names its object.
        yield create(ImportMessagesRequestSchema, { objectKey, sessionId });
    }
}
//# sourceMappingURL=index.js.map