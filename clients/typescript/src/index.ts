/**
 * A thin client for the Sessions service (sessions.v1):
 *
 *     const client = new SessionsClient("127.0.0.1:50051");
 *     const session = client.object("user-42").session("chat");
 *     await session.appendMessage({ id: "m1", role: "user", parts: [{ type: "text", text: "hi" }] });
 *     for await (const message of session.history()) console.log(message);
 *
 * Messages are plain objects, sent as `JSON.stringify` text and read back with `JSON.parse`.
 * Every call sends the routing metadata `x-object-key` (percent-encoded UTF-8), asks long reads
 * to pack up to 400 messages per response (`max_messages_per_response`), reassembles messages
 * that the server sends in pieces, and writes messages above 3 MiB through the
 * client-streaming `UploadMessage`. Failures are thrown as `SessionsError` (status code plus the
 * `ErrorInfo` reason from the `grpc-status-details-bin` trailer), after the client has tried the
 * call again when the server refused it before acting or, for calls safe to repeat, when the
 * connection failed (`ClientOptions.retry`). Every call takes `{ signal }` (`AbortOptions`) to
 * cancel it, retries included. Reads take `pointers` to leave stored attachments as pointers
 * (`readAttachment` reads them); `ClientOptions.tls` connects with TLS or mTLS.
 */

import { create } from "@bufbuild/protobuf";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import {
  constants as http2Constants,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type ClientSessionRequestOptions,
  type OutgoingHttpHeaders,
  type SecureClientSessionOptions,
} from "node:http2";
import { X509Certificate } from "node:crypto";
import { setMaxListeners } from "node:events";
import { isIP, connect as netConnect, type NetConnectOpts } from "node:net";
import type { Duplex } from "node:stream";
import { connect as tlsConnect, createSecureContext } from "node:tls";

import {
  AttachmentMode,
  ChangeType,
  ImportMessagesRequestSchema,
  ImportedMessageSchema,
  ParentMode,
  SearchMode,
  SessionService,
  Source,
  UploadHeaderSchema,
  UploadMessageRequestSchema,
  UploadOperation,
  type Compaction as CompactionPb,
  type ImportMessagesRequest,
  type MessageFrame,
  type MessageInfo as MessageInfoPb,
  type CompactionPolicy as CompactionPolicyPb,
  type SearchMessagesResponse,
  type UploadMessageRequest,
  type UploadMessageResponse,
  type WrittenMessage,
} from "./gen/sessions/v1/sessions_pb.js";

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

/** What every call of the client accepts: `{ signal }` to cancel it. */
export interface AbortOptions {
  /**
   * Cancels the call when aborted: an attempt in flight is cancelled (the server is told to stop),
   * a wait before a retry ends at once and no further attempt starts, and a signal aborted
   * already fails the call before anything is sent. The call then fails with a `SessionsError`
   * of code "CANCELLED" (`grpcCode` 1) whose `cause` is `signal.reason`, however far it had got
   * (a stream too, after responses were read). What the server carried out before the abort
   * stays done: an aborted write may have been stored. The client's `timeoutMs` still applies;
   * whichever ends the call first decides its error. A signal may serve many calls: each removes
   * its listener when it ends. E.g. `{ signal: AbortSignal.timeout(2_000) }`.
   */
  signal?: AbortSignal;
}

export interface WriteOptions extends AbortOptions {
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
export class ImportItem {
  constructor(
    readonly message: MessageInput,
    readonly parentId: string | null,
    readonly createdAt?: number | Date,
  ) {}
}

/** An ImportItem as a plain object literal. */
export interface ImportItemLike {
  message: MessageInput;
  parentId: string | null;
  createdAt?: number | Date;
}

/** What the reads that return messages accept: `{ signal }` and `pointers`. */
export interface ReadOptions extends AbortOptions {
  /**
   * Leave the inline media the server stores as attachments (a `data:` URL in a file part) as
   * `attachment:sha256:<hex>` pointers instead of restoring the payloads into the messages
   * (default false: messages come back as they were written). Read a payload with
   * `ObjectHandle.readAttachment(hex)`. As Python's `pointers=True` and Go's
   * `WithAttachmentPointers()`.
   */
  pointers?: boolean;
}

export interface HistoryOptions extends ReadOptions {
  /** The leaf whose path to read; default the active leaf. */
  leafId?: string;
  /** Read from the leaf towards the root. */
  newestFirst?: boolean;
  /** At most this many messages, in the read's order (with newestFirst, the newest); the server reads no further. */
  limit?: number;
}

export interface HistoryBatchOptions extends HistoryOptions {
  batchSize?: number;
  maxBatchBytes?: number;
}

export interface SubscribeOptions extends AbortOptions {
  /** Only events of this session (undefined: every session of the object). */
  sessionId?: string;
  /**
   * Resume after this revision (0: start live, from the next event). Revisions are uint64 values
   * around 2^62 (`epoch_ms << 22 | counter`), so keep them as bigint (or a decimal string):
   * a JS number loses their low bits, and one past `Number.MAX_SAFE_INTEGER` is refused with a
   * RangeError (rounded up, it would skip events without a RESET).
   */
  resumeAfterRevision?: bigint | string | number;
  /**
   * Reconnections in a row after the server went away (UNAVAILABLE or CANCELLED, but not a
   * failure of TLS, thrown at once) before the error is thrown (default 20; 0 never reconnects). Each resumes after the last revision seen.
   * A stream that delivered more than the PROGRESS opening every stream (an event, or a second
   * PROGRESS) ends a row; one that fails after that PROGRESS alone counts as a failure.
   */
  reconnectAttempts?: number;
  /**
   * Also yield PROGRESS events (default false: they are dropped, as by the Python and Go
   * clients). The server sends one when a subscription starts (a resumed one's at the revision
   * it resumes after) and whenever the feed has been idle for a while (`--progress-seconds`,
   * at the object's current revision); it means nothing happened. Dropped or not, it advances the revision a reconnect resumes after.
   */
  includeProgress?: boolean;
  /** Events' messages keep stored attachments as pointers (see `ReadOptions.pointers`). */
  pointers?: boolean;
}

export type ChangeTypeName =
  | "UNSPECIFIED"
  | "APPEND"
  | "UPDATE"
  | "DELETE"
  | "CLEAR"
  | "COMPACT"
  | "COMPACTION"
  | "IMPORT"
  | "COMPACTION_ERROR"
  | "RESET"
  | "PROGRESS";

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

/** The range and prompt of a planned compaction, for a summarizer that runs on the client. */
export interface CompactionPlan {
  /** The first message the summary replaces. */
  fromMessageId: string;
  /** The last message the summary replaces. */
  toMessageId: string;
  /** The prompt for the summarizer. */
  prompt: string;
  /** The summary length target given in the prompt, in tokens. */
  budgetTokens: number;
  /**
   * Names this plan to the server: pass it to `addCompaction` (`{ planToken }`) to have the
   * summary refused (SESSION_CHANGED) if what it is made of changed since the plan. Used once,
   * by the server that planned, within 15 minutes (else PLAN_EXPIRED).
   */
  planToken: string;
}

/** A session's automatic compaction policy. */
export interface CompactionPolicy {
  /**
   * Compact after an inserted append when the session's token estimate exceeds this; 0 turns
   * automatic compaction off.
   */
  thresholdTokens: number;
  /** Token budget of the recent tail kept verbatim (0: 20,000). */
  keepRecentTokens: number;
}

export interface PlanCompactionOptions extends AbortOptions {
  /** The leaf whose path to plan (default the active leaf). */
  leafId?: string;
  /**
   * Token budget of the recent tail kept verbatim (default 0: the session's policy, whose own 0
   * is 20,000; the server refuses a negative one).
   */
  keepRecentTokens?: number;
}

export type CompactOptions = PlanCompactionOptions;

export interface AddCompactionOptions extends AbortOptions {
  /**
   * The summary comes from a compaction the caller ran (plan, summarize, store): subscribers see
   * a COMPACT event with no payload, as upstream's compact() emits, instead of COMPACTION with
   * the record. `compact(summarize)` sets it.
   */
  fromCompact?: boolean;
  /**
   * The `planToken` of the plan the summary was made from: the record is then stored only if no
   * message the summary is made of was updated or deleted since the plan, nor the session
   * cleared or given another record, nor the object replaced; else FAILED_PRECONDITION /
   * SESSION_CHANGED, and nothing is stored. Used once: used already, older than 15 minutes or
   * from before a restart of the server, it is refused FAILED_PRECONDITION / PLAN_EXPIRED.
   * `fromMessageId` and `toMessageId` must be the plan's (INVALID_ARGUMENT, the token kept).
   * Empty (the default) checks nothing, as upstream. `compact(summarize)` passes it.
   */
  planToken?: string;
}

export interface SetCompactionPolicyOptions extends AbortOptions {
  /** Token budget of the recent tail kept verbatim (default 0: 20,000). */
  keepRecentTokens?: number;
}

/**
 * A summarizer that runs on the client, for `compact(summarize)`: given the planned prompt, it
 * returns the summary (or a promise of it). It is given the call's `signal`.
 */
export type Summarizer = (prompt: string, options: AbortOptions) => string | PromiseLike<string>;

export interface SearchOptions extends AbortOptions {
  /**
   * The largest number of results (default 20, upstream's; 0 returns none; a negative number
   * means the server's cap). An integer within int32.
   */
  limit?: number;
  /**
   * "phrase" (default, upstream's semantics: the words adjacent and in order) or "all_words"
   * (every word of the query, in any order), as Python's `mode`.
   */
  mode?: "phrase" | "all_words";
  /** Search every session of the object, not only this one. */
  allSessions?: boolean;
}

/** One full-text search hit. */
export interface SearchResult {
  id: string;
  role: string;
  /** The indexed text of the message. */
  content: string;
  sessionId: string;
}

/** One stored attachment payload. */
export interface Attachment {
  /** The lowercase hex SHA-256 it was read by. */
  hash: string;
  mediaType: string;
  data: Uint8Array;
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
  /** Bytes of free pages in the file (counted in fileBytes): freed by deletes, reused by writes. */
  freeBytes: number;
}

/** What `vacuum()` did: the object's file and WAL in bytes before and after. */
export interface VacuumReport {
  fileBytesBefore: number;
  fileBytesAfter: number;
}

export interface ClientOptions {
  /** Sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  /**
   * Deadline for every call, in milliseconds (none by default; 0 or less, or more than
   * 2^31 - 1, is refused, a RangeError). It covers all of a call's attempts and the waits
   * between them: a retry never outlives it.
   */
  timeoutMs?: number;
  /** Further interceptors for the underlying Connect transport. */
  interceptors?: Interceptor[];
  /**
   * While calls are open, ping a connection silent this long (default 30,000 ms; 0 turns pinging
   * off) and close it, failing its calls with UNAVAILABLE, when a ping goes unanswered for
   * `keepaliveTimeoutMs` (default 10,000). Without pings, a stream whose server or network
   * vanished without closing the connection (a subscription waiting for its next event) would
   * wait forever.
   */
  keepaliveMs?: number;
  keepaliveTimeoutMs?: number;
  /**
   * How long a new connection may take to be ready, from its start to the server's HTTP/2
   * SETTINGS (default 20,000 ms, gRPC's connect timeout; 0 turns it off). A connection not ready
   * by then is given up and its calls fail UNAVAILABLE, which is retried as any connection
   * failure (within the retry policy and `timeoutMs`). Without it, a server that accepts
   * connections but does not answer (stopped, or its accept queue full) would hold a call until
   * keepalive noticed, or with keepalive off forever. Keepalive covers a connection that went
   * silent after it was ready.
   */
  connectTimeoutMs?: number;
  /**
   * How calls refused by the server before acting (a drain, an object move, re-sharding) and
   * transport failures of repeatable calls are tried again; unset fields take
   * `DEFAULT_RETRY_POLICY`'s values. `false` turns retries off (every call is tried once).
   * `subscribe` is not affected: it reconnects by its own rules (`reconnectAttempts`).
   */
  retry?: RetryPolicy | false;
  /**
   * Called before each wait between attempts. When it returns a promise, the next attempt waits
   * for it to settle (the time it takes counts towards the wait); when it throws or rejects, the
   * call fails with that error.
   */
  onRetry?: (notice: RetryNotice) => void | PromiseLike<void>;
  /**
   * Connect with TLS: the address "host:port" is then reached as `https://host:port` (an
   * "https://" URL needs no `tls` to use the default roots; an "http://" one refuses it).
   * `{}` trusts Node's default roots; `rootCertificates` a CA of yours; `certificateChain` and
   * `privateKey` present a client certificate to a server that requires one (mTLS,
   * `--tls-client-ca`). As Python's `tls=TlsConfig(...)`. A call whose TLS handshake failed
   * (the server's certificate not trusted or not for this host) fails UNAVAILABLE at once: it
   * is not tried again, and a subscription does not reconnect after it. A server refusing the
   * client's certificate or its absence closes the connection after the handshake, as a proxy
   * ending TLS in front of a server it cannot reach does: tried again as a connection failure,
   * its last error says what it may be.
   */
  tls?: TlsConfig;
}

/**
 * TLS settings, as Python's `TlsConfig`: PEM text (a string) or bytes. The constructor checks
 * them: a TypeError for PEM that does not load, a key that does not match its certificate, or
 * one of `certificateChain` and `privateKey` without the other.
 */
export interface TlsConfig {
  /** The CA certificate(s) that signed the server's certificate (default: Node's default roots). */
  rootCertificates?: string | Uint8Array;
  /** The client's certificate chain, for mTLS (with `privateKey`). */
  certificateChain?: string | Uint8Array;
  /** The private key of `certificateChain`. */
  privateKey?: string | Uint8Array;
}

/**
 * When and how often a failed call is tried again. The wait after failed attempt n (1-based) is
 * `min(maxBackoffMs, initialBackoffMs * multiplier ** (n - 1))` times a random factor in
 * [0.5, 1), so that clients refused together do not come back together.
 */
export interface RetryPolicy {
  /** Attempts in all, the first one included (1: no retries). */
  maxAttempts?: number;
  /** The wait after the first failed attempt, before jitter. */
  initialBackoffMs?: number;
  /** No wait is longer than this, before jitter. */
  maxBackoffMs?: number;
  /**
   * How much each wait grows over the one before: at least 1, so waits never shrink (a smaller
   * value is a RangeError at construction, as Python's RetryPolicy refuses it).
   */
  multiplier?: number;
}

/**
 * The policy used when `ClientOptions.retry` is not given, shared with the Python and Go
 * clients: 10 attempts and about 9 s of waiting in the worst case, long enough to outlast a
 * server's drain or an object move.
 */
export const DEFAULT_RETRY_POLICY: Readonly<Required<RetryPolicy>> = Object.freeze({
  maxAttempts: 10,
  initialBackoffMs: 50,
  maxBackoffMs: 2000,
  multiplier: 2,
});

/** What `ClientOptions.onRetry` is told before the client waits to try a call again. */
export interface RetryNotice {
  /** The RPC's name as in the proto, e.g. "AppendMessage". */
  method: string;
  /** The number of the attempt that failed (1 for the first). */
  attempt: number;
  /** Why that attempt failed. */
  error: SessionsError;
  /** How long the client waits before the next attempt, in (not necessarily whole) milliseconds. */
  delayMs: number;
}

export const KEEPALIVE_MS = 30_000;
export const KEEPALIVE_TIMEOUT_MS = 10_000;
/** `ClientOptions.connectTimeoutMs`'s default: gRPC's connect timeout, as the Python and Go clients have it. */
export const CONNECT_TIMEOUT_MS = 20_000;

export const OBJECT_KEY_HEADER = "x-object-key";
/** A write above this many UTF-8 bytes goes through UploadMessage, so default 4 MiB limits hold. */
export const UNARY_LIMIT_BYTES = 3 * 1024 * 1024;
/** Size of each piece of a streamed message, in UTF-8 bytes. */
export const PIECE_BYTES = 3 * 1024 * 1024;
/**
 * Messages the server may pack into one response on long reads (`max_messages_per_response`):
 * one gRPC frame per message would otherwise dominate the cost of streaming history. 400 is
 * what the server reads at once, and it frames each read separately: a larger value gains
 * nothing, a smaller one cuts a read into more responses (about 0.15 ms of server time each).
 * The same value as the Python client's PACKED_MESSAGES.
 */
const PACKED_MESSAGES = 400;

const ERROR_INFO_TYPE = "google.rpc.ErrorInfo";

/** A failed call: the canonical gRPC status code name, the server's message and its ErrorInfo. */
export class SessionsError extends Error {
  override name = "SessionsError";
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

  constructor(
    grpcCode: number,
    rawMessage: string,
    reason: string | null = null,
    metadata: Record<string, string> = {},
    domain: string | null = null,
    options?: { cause?: unknown },
  ) {
    const code = codeName(grpcCode);
    super(`${code}: ${rawMessage}${reason ? ` [${reason}]` : ""}`, options);
    this.code = code;
    this.grpcCode = grpcCode;
    this.rawMessage = rawMessage;
    this.reason = reason;
    this.metadata = metadata;
    this.domain = domain;
  }

  /**
   * Converts any error thrown by a call; non-RPC errors are returned unchanged. A failure of TLS
   * (see `ClientOptions.tls`) becomes UNAVAILABLE, as the Python and Go clients report it; so
   * does a failure of the connection (reset, refused, broken pipe, the HTTP/2 session or stream
   * torn down with it: see `connectionFailureIn`), which Connect reports as ABORTED ("read
   * ECONNRESET") or INTERNAL. Such an error has no reason, so the retry policy takes it for a
   * connection failure, and the original is its `cause`.
   */
  static from(error: unknown): unknown {
    return sessionsErrorOf(error, true);
  }
}

/**
 * `SessionsError.from`, with `connectionFailures` false for an attempt that the client ended
 * itself (the caller's signal, `close()`, the deadline): the connection's breaking is then its own
 * doing, and the error stays as Connect reported it (CANCELLED, DEADLINE_EXCEEDED).
 */
function sessionsErrorOf(error: unknown, connectionFailures: boolean): unknown {
  if (error instanceof SessionsError) return error;
  const tls = tlsFailureIn(error);
  if (tls !== undefined) {
    const failure = new SessionsError(Code.Unavailable, tls.message, null, {}, null, { cause: error });
    // A connection closed after its handshake may be a proxy ending TLS in front of a server it
    // cannot reach (one restarting): tried again as any connection failure (see TlsRefused).
    if (!tls.refused) TLS_FAILURES.add(failure);
    return failure;
  }
  if (!(error instanceof ConnectError)) return error;
  if (connectionFailures && notProcessedIn(error)) {
    // A connection failure as below (Connect reports Node's stream error as INTERNAL), marked
    // safe to repeat for every method.
    const failure = new SessionsError(Code.Unavailable, error.rawMessage, null, {}, null, { cause: error });
    NOT_PROCESSED.add(failure);
    return failure;
  }
  if (connectionFailures && error.code !== Code.Unavailable && connectionFailureIn(error)) {
    return new SessionsError(Code.Unavailable, error.rawMessage, null, {}, null, { cause: error });
  }
  if (connectionFailures && endedWithoutStatus(error)) {
    return new SessionsError(Code.Unavailable, `${ENDED_WITHOUT_STATUS} (${error.rawMessage})`, null, {}, null, {
      cause: error,
    });
  }
  let reason: string | null = null;
  let domain: string | null = null;
  let metadata: Record<string, string> = {};
  for (const detail of error.details) {
    if ("desc" in detail || detail.type !== ERROR_INFO_TYPE) continue;
    try {
      ({ reason, domain, metadata } = decodeErrorInfo(detail.value));
    } catch {
      // A detail that does not decode leaves the error without a reason.
    }
    break;
  }
  return new SessionsError(error.code, error.rawMessage, reason, metadata, domain, { cause: error });
}

/**
 * A call's stream that ended without gRPC's status (no trailers): a proxy (HAProxy) ends a call
 * so when its connection to the server fails under it. Whether the server carried the call out is
 * unknown, as after any failed connection; Connect reports it as INTERNAL ("protocol error:
 * missing status"), this client as UNAVAILABLE without a reason, as the Python and Go clients do.
 */
const ENDED_WITHOUT_STATUS =
  "the call ended without the server's status, as a proxy ends it when its connection to the server fails";

function endedWithoutStatus(error: ConnectError): boolean {
  return error.code === Code.Internal && error.rawMessage === "protocol error: missing status" && error.details.length === 0;
}

/**
 * Node's codes for a connection that failed under a call, as found in the cause chain Connect
 * keeps: the socket reset (a server killed with unread data: Connect's ABORTED "read
 * ECONNRESET"), refused, timed out or broken, and the HTTP/2 session or stream torn down with it.
 * The stream codes also follow the caller's own cancellation; `sessionsErrorOf` does not look
 * for them then.
 */
const CONNECTION_FAILURES: ReadonlySet<string> = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "ERR_HTTP2_GOAWAY_SESSION",
  "ERR_HTTP2_INVALID_SESSION",
  "ERR_HTTP2_SESSION_ERROR",
  "ERR_HTTP2_STREAM_CANCEL",
  "ERR_HTTP2_INVALID_STREAM",
  "ERR_STREAM_DESTROYED",
]);

/**
 * Whether `error`'s cause chain shows the connection failed. A stream reset by the server is
 * one only with REFUSED_STREAM (not processed: the server is going away) or CANCEL; another code
 * (INTERNAL_ERROR, …) is the server's answer, and stays as Connect reports it.
 */
function connectionFailureIn(error: unknown): boolean {
  const seen = new Set<unknown>();
  for (let e = error; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    const code = (e as { code?: unknown }).code;
    if (typeof code !== "string") continue;
    if (CONNECTION_FAILURES.has(code)) return true;
    if (code === "ERR_HTTP2_STREAM_ERROR" && /NGHTTP2_(REFUSED_STREAM|CANCEL)\b/.test(e.message)) return true;
  }
  return false;
}

/**
 * Connection failures of a stream that the server provably never processed, after which sending
 * the request again is safe for every method (gRPC's C core and grpc-go retry them
 * transparently). HTTP/2 gives a client two such guarantees (RFC 9113, section 8.7): a stream
 * reset with REFUSED_STREAM, and a stream above the last-stream-id of the server's GOAWAY. In
 * Node's terms (its error is the `cause` Connect keeps):
 * - ERR_HTTP2_STREAM_ERROR "Stream closed with error code NGHTTP2_REFUSED_STREAM": either case
 *   (nghttp2 closes the streams above a NO_ERROR GOAWAY's last-stream-id with REFUSED_STREAM).
 *   Connect reports it as INTERNAL.
 * - ERR_HTTP2_GOAWAY_SESSION: Node would not open the stream on a connection that had received a
 *   GOAWAY (or was closing); its HEADERS were never sent.
 * Not CANCEL, which a server or proxy may send after processing the request, nor a GOAWAY with
 * an error code: Node then fails every stream of the connection alike (ERR_HTTP2_SESSION_ERROR),
 * including those the server may have processed.
 */
const NOT_PROCESSED = new WeakSet<SessionsError>();

/** Whether `error`'s cause chain shows the stream was never processed (see `NOT_PROCESSED`). */
function notProcessedIn(error: unknown): boolean {
  const seen = new Set<unknown>();
  for (let e = error; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    const code = (e as { code?: unknown }).code;
    if (code === "ERR_HTTP2_GOAWAY_SESSION") return true;
    if (code === "ERR_HTTP2_STREAM_ERROR" && /\bNGHTTP2_REFUSED_STREAM\b/.test(e.message)) return true;
  }
  return false;
}

/**
 * Errors that TLS caused: retrying cannot cure them (the certificates are what they are), so they
 * are never retried, and a subscription does not reconnect after one.
 */
const TLS_FAILURES = new WeakSet<SessionsError>();

/**
 * Node's codes for a server certificate that failed verification (`tls.connect`'s
 * `verifyError` codes); other TLS failures have codes starting ERR_SSL_ (OpenSSL, e.g. a TLS
 * alert or a plaintext server: ERR_SSL_WRONG_VERSION_NUMBER) or ERR_TLS_ (e.g.
 * ERR_TLS_CERT_ALTNAME_INVALID, a certificate for another host).
 */
const CERTIFICATE_ERRORS: ReadonlySet<string> = new Set([
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_CRL",
  "UNABLE_TO_DECRYPT_CERT_SIGNATURE",
  "UNABLE_TO_DECRYPT_CRL_SIGNATURE",
  "UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY",
  "CERT_SIGNATURE_FAILURE",
  "CRL_SIGNATURE_FAILURE",
  "CERT_NOT_YET_VALID",
  "CERT_HAS_EXPIRED",
  "CRL_NOT_YET_VALID",
  "CRL_HAS_EXPIRED",
  "ERROR_IN_CERT_NOT_BEFORE_FIELD",
  "ERROR_IN_CERT_NOT_AFTER_FIELD",
  "ERROR_IN_CRL_LAST_UPDATE_FIELD",
  "ERROR_IN_CRL_NEXT_UPDATE_FIELD",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "CERT_CHAIN_TOO_LONG",
  "CERT_REVOKED",
  "INVALID_CA",
  "PATH_LENGTH_EXCEEDED",
  "INVALID_PURPOSE",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "HOSTNAME_MISMATCH",
]);

/**
 * What a server that refused the TLS handshake did: it closed a connection that the client took
 * for established (with TLS 1.3 the client's side of the handshake ends before the server has
 * checked the client's certificate) before sending anything, even HTTP/2's SETTINGS, which every
 * HTTP/2 server sends first. Connect would report it as CANCELLED ("http/2 stream closed with
 * error code CANCEL"). A proxy that ends TLS in front of a server it cannot reach (one
 * restarting) does the same, so it is tried again as any connection failure; the error says what
 * it may be, for when the tries run out, in the Python and Go clients' words.
 */
class TlsRefused extends Error {
  override name = "TlsRefused";
  constructor() {
    super(
      "the server closed the TLS connection before it spoke HTTP/2: it may have refused the TLS handshake, " +
        "most likely for want of a client certificate it trusts (a server run with --tls-client-ca requires " +
        "one: set tls.certificateChain and tls.privateKey), or a proxy that ends TLS in front of it could not " +
        "reach it",
    );
  }
}

/**
 * What a plaintext connection that the server closed before sending anything (even HTTP/2's
 * SETTINGS) may be: a server speaking TLS alone reads plaintext HTTP/2 as a broken handshake and
 * hangs up without a byte. A proxy in front of a server it cannot reach does the same, so it is
 * tried again as any connection failure, as the Python and Go clients do, in their words.
 */
const PLAINTEXT_CLOSED =
  "the server closed the connection before it spoke HTTP/2: it may speak TLS alone (a server run with " +
  "--tls-cert does: give options.tls, or an https:// address), or a proxy in front of it could not reach it";

/**
 * The TLS failure in `error`'s cause chain (Connect keeps Node's error as cause), if any: its
 * message, and whether it is a connection closed after its handshake (TlsRefused).
 */
function tlsFailureIn(error: unknown): { message: string; refused: boolean } | undefined {
  const seen = new Set<unknown>();
  for (let e = error; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    if (e instanceof TlsRefused) return { message: e.message, refused: true };
    const code = (e as { code?: unknown }).code;
    if (typeof code !== "string") continue;
    if (CERTIFICATE_ERRORS.has(code) || code.startsWith("ERR_TLS_") || code.startsWith("ERR_SSL_")) {
      // OpenSSL's errors carry a short `reason` ("wrong version number") besides a long message.
      const reason = (e as { reason?: unknown }).reason;
      const text = typeof reason === "string" && reason !== "" ? reason : e.message.trim();
      return { message: `TLS handshake failed: ${text} (${code})`, refused: false };
    }
  }
  return undefined;
}

const CODE_NAMES: Record<number, string> = {
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

function codeName(code: number): string {
  return CODE_NAMES[code] ?? `CODE_${code}`;
}

/** Decodes google.rpc.ErrorInfo {reason = 1, domain = 2, map<string, string> metadata = 3}. */
function decodeErrorInfo(bytes: Uint8Array): {
  reason: string | null;
  domain: string | null;
  metadata: Record<string, string>;
} {
  const reader = new BinaryReader(bytes);
  let reason: string | null = null;
  let domain: string | null = null;
  const metadata: Record<string, string> = {};
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === 1 && wireType === 2) reason = reader.string();
    else if (field === 2 && wireType === 2) domain = reader.string();
    else if (field === 3 && wireType === 2) {
      const entry = new BinaryReader(reader.bytes());
      let key = "";
      let value = "";
      while (entry.pos < entry.len) {
        const [f, w] = entry.tag();
        if (f === 1 && w === 2) key = entry.string();
        else if (f === 2 && w === 2) value = entry.string();
        else entry.skip(w);
      }
      metadata[key] = value;
    } else reader.skip(wireType);
  }
  return { reason, domain, metadata };
}

/** Percent-encodes an object key as Python's `urllib.parse.quote(key, safe="")` does. */
export function encodeObjectKey(objectKey: string): string {
  return encodeURIComponent(objectKey).replace(
    /[!'()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
}

/** The routing metadata for one object key. */
export function routingHeaders(objectKey: string): Record<string, string> {
  return { [OBJECT_KEY_HEADER]: encodeObjectKey(objectKey) };
}

/**
 * The most `--max-object-key-bytes` may be on any server, which makes room for headers carrying
 * a key that long (percent-encoded in `x-object-key`, up to three times as long).
 */
const LARGEST_KEY_LIMIT_BYTES = 64 * 1024;

/** Headers a call may send: room for any key a server may take, and 32 KiB more (the server's). */
const MAX_SEND_HEADER_BLOCK_BYTES = 4 * LARGEST_KEY_LIMIT_BYTES + 32 * 1024;

/**
 * Refuses a key longer than any server takes, as the server refuses one past its own limit: its
 * header would pass what Node sends, which failed the call as a stream the server refused
 * (UNAVAILABLE, retried as an outage).
 */
function checkKeyLength(objectKey: string): void {
  if (objectKey.length * 3 <= LARGEST_KEY_LIMIT_BYTES) return; // a UTF-16 unit is at most 3 bytes of UTF-8
  const bytes = Buffer.byteLength(objectKey, "utf8");
  if (bytes > LARGEST_KEY_LIMIT_BYTES) {
    throw new SessionsError(
      Code.InvalidArgument,
      `object_key is ${bytes} bytes; no server takes more than ${LARGEST_KEY_LIMIT_BYTES} bytes (its --max-object-key-bytes at most)`,
      "INVALID_OBJECT_KEY",
      { field: "object_key" },
      "sessions.v1",
    );
  }
}

// A UTF-16 surrogate without its pair: UTF-8 cannot carry it, and encoding puts U+FFFD in its place.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function toJson(message: MessageInput): string {
  if (typeof message === "string") {
    // Sent as it is, the text would be stored with U+FFFD, and the write's result would still be
    // the text as given (the server answers with what it received).
    if (LONE_SURROGATE.test(message)) {
      throw new SessionsError(
        Code.InvalidArgument,
        "message JSON holds a lone UTF-16 surrogate, which UTF-8 cannot carry; escape it as \\uXXXX",
        "INVALID_JSON",
      );
    }
    return message;
  }
  const text = JSON.stringify(message);
  if (typeof text !== "string") throw new TypeError("message is not JSON-serializable");
  return text;
}

function jsonSize(text: string): number {
  // Each UTF-16 code unit is at most 3 UTF-8 bytes: skip the count for clearly small text.
  return text.length * 3 <= UNARY_LIMIT_BYTES ? text.length : Buffer.byteLength(text, "utf8");
}

/** Cuts JSON text into pieces of at most PIECE_BYTES UTF-8 bytes, on character boundaries. */
export function* pieces(text: string, pieceBytes: number = PIECE_BYTES): Generator<string> {
  if (text.length * 3 <= pieceBytes) {
    yield text;
    return;
  }
  const data = Buffer.from(text, "utf8");
  let start = 0;
  while (start < data.length) {
    let end = Math.min(start + pieceBytes, data.length);
    while (end < data.length && (data[end]! & 0xc0) === 0x80) end -= 1;
    if (end === start) throw new RangeError("pieceBytes is smaller than one UTF-8 character");
    yield data.toString("utf8", start, end);
    start = end;
  }
}

function parentFields(parentId: ParentArg): { parentMode: ParentMode; parentId: string } {
  if (parentId === undefined) return { parentMode: ParentMode.AUTO, parentId: "" };
  if (parentId === null) return { parentMode: ParentMode.ROOT, parentId: "" };
  if (typeof parentId === "string") return { parentMode: ParentMode.ID, parentId };
  throw new TypeError("parentId must be undefined (auto), null (root) or a message id");
}

function sourceValue(source: SourceArg | undefined): Source {
  if (source === undefined || source === "server") return Source.SERVER;
  if (source === "client") return Source.CLIENT;
  throw new TypeError('source must be "server" or "client"');
}

/** StreamHistory's max_messages for a `limit` option (0: the whole path). */
function maxMessages(limit: number | undefined): number {
  if (limit === undefined) return 0;
  if (!Number.isInteger(limit) || limit <= 0 || limit > 0xffffffff) {
    throw new RangeError(`limit must be a positive number of messages, got ${String(limit)}`);
  }
  return limit;
}

/** The `attachments` field of a read: POINTER with `pointers`, else INLINE (as Python sends it). */
function attachmentMode(pointers: boolean | undefined): AttachmentMode {
  return pointers === true ? AttachmentMode.POINTER : AttachmentMode.INLINE;
}

function createdAtMs(value: number | Date | undefined): bigint {
  if (value === undefined) return BigInt(Date.now());
  if (value instanceof Date) return BigInt(value.getTime());
  return BigInt(Math.trunc(value));
}

function parentOf(info: MessageInfoPb | undefined): string | null {
  return info?.parentId ?? null;
}

function parseMessage(text: string): Message {
  return JSON.parse(text) as Message;
}

function messageIdOf(message: MessageInput): string | null {
  let value: unknown = message;
  if (typeof message === "string") {
    try {
      value = JSON.parse(message);
    } catch {
      return null;
    }
  }
  const id = value !== null && typeof value === "object" ? (value as { id?: unknown }).id : undefined;
  return typeof id === "string" ? id : null;
}

function isImportItem(item: unknown): item is ImportItem | ImportItemLike {
  if (item instanceof ImportItem) return true;
  return (
    item !== null &&
    typeof item === "object" &&
    "message" in item &&
    "parentId" in item &&
    !("parts" in item)
  );
}

/** A read response: packed `frames` (long reads), or one `frame`. */
interface FramedResponse {
  frame?: MessageFrame | undefined;
  frames?: MessageFrame[];
}

/** The MessageFrames of a read response: packed `frames`, or the single `frame` (as in Python). */
function framesOf(response: FramedResponse): MessageFrame[] {
  if (response.frames !== undefined && response.frames.length > 0) return response.frames;
  return response.frame !== undefined ? [response.frame] : [];
}

/** A reassembled message and its lifted facts. */
interface Assembled {
  info: MessageInfoPb | undefined;
  json: string;
}

/** Joins MessageFrame pieces back into whole messages. */
class FrameAssembler {
  private info: MessageInfoPb | undefined;
  private parts: string[] = [];
  private open = false;

  feed(frame: MessageFrame): Assembled | null {
    if (!this.open) {
      this.info = frame.info;
      this.open = true;
    }
    this.parts.push(frame.json);
    if (frame.morePieces) return null;
    const json = this.parts.length === 1 ? this.parts[0]! : this.parts.join("");
    const done = { info: this.info, json };
    this.info = undefined;
    this.parts = [];
    this.open = false;
    return done;
  }

  finish(): void {
    if (this.open) {
      throw new SessionsError(Code.DataLoss, "stream ended inside a message", "INVALID_STREAM");
    }
  }
}

function toNumber(value: bigint | number): number {
  return typeof value === "bigint" ? Number(value) : value;
}

function compactionOf(c: CompactionPb | undefined): Compaction | undefined {
  if (c === undefined) return undefined;
  return {
    id: c.id,
    seq: toNumber(c.seq),
    summary: c.summary,
    fromMessageId: c.fromMessageId,
    toMessageId: c.toMessageId,
    createdAtMs: toNumber(c.createdAtMs),
  };
}

/** A compaction record the server returned (an empty one should it send none). */
function storedCompaction(c: CompactionPb | undefined): Compaction {
  return (
    compactionOf(c) ?? { id: "", seq: 0, summary: "", fromMessageId: "", toMessageId: "", createdAtMs: 0 }
  );
}

function policyOf(p: CompactionPolicyPb | undefined): CompactionPolicy {
  return { thresholdTokens: toNumber(p?.thresholdTokens ?? 0n), keepRecentTokens: toNumber(p?.keepRecentTokens ?? 0n) };
}

/**
 * How many times `compact(summarize)` plans and summarizes when its summary is refused, as the
 * Python client's COMPACT_ATTEMPTS and the Go client's compactAttempts.
 */
const COMPACT_ATTEMPTS = 3;

/** Refusals of a summary (AddCompaction with a plan token) that a new plan and summary can get past. */
const PLAN_AGAIN_REASONS: ReadonlySet<string> = new Set(["SESSION_CHANGED", "PLAN_EXPIRED"]);

/** Whether `compact(summarize)` plans and summarizes again after `error` from AddCompaction. */
function summaryRefused(error: unknown): boolean {
  return error instanceof SessionsError && error.reason !== null && PLAN_AGAIN_REASONS.has(error.reason);
}

/** An int64 field from a number option (undefined: 0); a RangeError, before any call, unless an integer. */
function int64Of(name: string, value: number | undefined): bigint {
  if (value === undefined) return 0n;
  if (!Number.isSafeInteger(value)) throw new RangeError(`${name} must be an integer, got ${String(value)}`);
  return BigInt(value);
}

/** Hits the client asks for per search response; the server also ends a response at about 1 MiB. */
const SEARCH_HITS_PER_RESPONSE = 1000;
/** The number of results a search asks for by default (upstream's, and Python's `limit=20`). */
const SEARCH_LIMIT = 20;

function searchLimit(limit: number | undefined): number {
  if (limit === undefined) return SEARCH_LIMIT;
  if (!Number.isInteger(limit) || limit < -0x80000000 || limit > 0x7fffffff) {
    throw new RangeError(`limit must be an integer within int32, got ${String(limit)}`);
  }
  return limit;
}

function searchMode(mode: SearchOptions["mode"]): SearchMode {
  if (mode === undefined || mode === "phrase") return SearchMode.PHRASE;
  if (mode === "all_words") return SearchMode.ALL_WORDS;
  throw new TypeError('mode must be "phrase" or "all_words"');
}

/** The hits of a search's responses, packed (`hits`) or one per response, pieces joined. */
async function collectSearch(responses: AsyncIterable<SearchMessagesResponse>): Promise<SearchResult[]> {
  const out: SearchResult[] = [];
  let head: SearchResult | null = null;
  let parts: string[] = [];
  for await (const response of responses) {
    for (const hit of response.hits.length > 0 ? response.hits : [response]) {
      head ??= { id: hit.id, role: hit.role, content: "", sessionId: hit.sessionId };
      parts.push(hit.content);
      if (!hit.morePieces) {
        head.content = parts.length === 1 ? parts[0]! : parts.join("");
        out.push(head);
        head = null;
        parts = [];
      }
    }
  }
  if (head !== null) throw new SessionsError(Code.DataLoss, "stream ended inside a search hit", "INVALID_STREAM");
  return out;
}

/** The bytes of `chunks` in one array. */
function concatBytes(chunks: Uint8Array[]): Uint8Array {
  if (chunks.length === 1) return chunks[0]!;
  const out = new Uint8Array(chunks.reduce((total, chunk) => total + chunk.length, 0));
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.length;
  }
  return out;
}

type Rpc = Client<typeof SessionService>;

/** An RPC's name as in the proto ("AppendMessage"): a misspelt one does not compile. */
type MethodName = Capitalize<keyof typeof SessionService.method & string>;

/**
 * Methods that may be sent again after a transport failure, when the server may or may not have
 * carried out the first attempt: reads, and writes whose repeat finds its own earlier effect
 * (same message id, same value; an import skips the ids it holds, and is retried only when its
 * items are an array). Left out: ClearMessages (a repeat could remove messages others appended in
 * between), AddCompaction and Compact (a repeat adds a second compaction) and the admin calls.
 */
const REPEATABLE_METHODS: ReadonlySet<string> = new Set<MethodName>([
  "GetMessage",
  "GetMessages",
  "GetLatestLeaf",
  "GetBranches",
  "StreamHistory",
  "GetRecentHistory",
  "GetHistoryRowStats",
  "ReadAttachment",
  "ListCompactions",
  "PlanCompaction",
  "GetCompactionPolicy",
  "SearchMessages",
  "ListSessions",
  "GetObjectStats",
  "AppendMessage",
  "AppendMessages",
  "UploadMessage",
  "UpdateMessage",
  "UpsertMessage",
  "DeleteMessages",
  "SetCompactionPolicy",
  "ImportMessages",
]);

/**
 * Whether the server refused before doing anything, so that any call may be made again: it
 * drains, the object is moving or has moved to another shard (OBJECT_NOT_OWNED: re-sharding), or
 * it is busy with other calls' large messages (--max-assembly-bytes).
 */
function refusedBeforeActing(error: SessionsError): boolean {
  if (error.code === "UNAVAILABLE" && (error.reason === "DRAINING" || error.reason === "OBJECT_MOVING")) return true;
  if (error.code === "FAILED_PRECONDITION" && error.reason === "OBJECT_NOT_OWNED") return true;
  return error.code === "RESOURCE_EXHAUSTED" && error.reason === "SERVER_BUSY";
}

/**
 * Whether `error` ended an attempt of `method` in a way that another attempt may cure. Never
 * DATA_LOSS with OBJECT_DAMAGED (the object's file on the server is damaged, and stays so until an
 * operator restores or erases it), nor STORAGE_FAILURE: neither is named below.
 */
function retryable(method: string, error: SessionsError): boolean {
  // The certificates (or their absence) that made TLS fail will be the same on the next attempt.
  if (TLS_FAILURES.has(error)) return false;
  // The server never processed the stream (REFUSED_STREAM, or above a GOAWAY's last-stream-id):
  // like a refusal, a retry is safe for every method (see `NOT_PROCESSED`).
  if (NOT_PROCESSED.has(error)) return true;
  // The server refused before doing anything: a retry is safe for every method.
  if (refusedBeforeActing(error)) return true;
  // No reason: the failure came from the connection, not the service, and the request may have
  // been carried out. So did a CANCELLED the client did not make (`beforeRetry` stops for the
  // caller's signal and `close()` before it waits): a stopping server's gRPC cancels the calls
  // that reached it.
  return (
    (error.code === "UNAVAILABLE" || error.code === "CANCELLED") && error.reason === null && REPEATABLE_METHODS.has(method)
  );
}

function retryPolicyOf(option: RetryPolicy | false | undefined): Required<RetryPolicy> {
  if (option === false) return { ...DEFAULT_RETRY_POLICY, maxAttempts: 1 };
  const policy: Required<RetryPolicy> = {
    maxAttempts: option?.maxAttempts ?? DEFAULT_RETRY_POLICY.maxAttempts,
    initialBackoffMs: option?.initialBackoffMs ?? DEFAULT_RETRY_POLICY.initialBackoffMs,
    maxBackoffMs: option?.maxBackoffMs ?? DEFAULT_RETRY_POLICY.maxBackoffMs,
    multiplier: option?.multiplier ?? DEFAULT_RETRY_POLICY.multiplier,
  };
  if (!Number.isInteger(policy.maxAttempts) || policy.maxAttempts < 1) {
    throw new RangeError(`retry.maxAttempts must be an integer >= 1, got ${String(policy.maxAttempts)}`);
  }
  for (const field of ["initialBackoffMs", "maxBackoffMs"] as const) {
    const value = policy[field];
    if (!Number.isFinite(value) || value < 0) {
      throw new RangeError(`retry.${field} must be a finite number >= 0, got ${String(value)}`);
    }
  }
  // Below 1 the waits would shrink (0: retry at once), against the contract shared with the
  // Python client (which refuses it with ValueError) and the Go client (which clamps it to 1).
  if (!Number.isFinite(policy.multiplier) || policy.multiplier < 1) {
    throw new RangeError(
      `retry.multiplier must be a finite number >= 1 (waits never shrink), got ${String(policy.multiplier)}`,
    );
  }
  return policy;
}

/**
 * The error of a call that its caller's signal ended. Connect would report an attempt cancelled
 * in flight in its own words, without the reason of a plain `abort()`, and a wait cut short
 * would leave only the last attempt's error: the caller gets this one instead, wherever the call
 * was.
 */
/** The error of a call made, or a subscription still running, once `close()` was called. */
function closedClient(cause?: unknown): SessionsError {
  return new SessionsError(Code.Canceled, "the client is closed", null, {}, null, { cause });
}

function cancelled(signal: AbortSignal): SessionsError {
  const reason: unknown = signal.reason;
  const why = reason instanceof Error ? reason.message : String(reason);
  return new SessionsError(Code.Canceled, `the call was cancelled by its signal: ${why}`, null, {}, null, {
    cause: reason,
  });
}

/** Whether the caller's `signal` (if any) has been aborted; a function, so that TypeScript does
 * not keep the answer of an earlier test across the awaits of a call. */
function abortedBy(signal: AbortSignal | undefined): signal is AbortSignal {
  return signal?.aborted === true;
}

/**
 * A controller of the call's own that aborts when the caller's `signal` does, and `unlink`, to
 * run when the call ends. Attempts and waits are given this one, never the caller's signal: a
 * signal shared by many calls then holds one listener per call, for the call's lifetime only,
 * whatever the transport does with the signals it is given.
 */
function follow(signal: AbortSignal | undefined): { controller: AbortController; unlink: () => void } {
  const controller = new AbortController();
  if (signal === undefined) return { controller, unlink: () => {} };
  if (signal.aborted) {
    controller.abort(signal.reason);
    return { controller, unlink: () => {} };
  }
  const onAbort = () => controller.abort(signal.reason);
  signal.addEventListener("abort", onAbort, { once: true });
  return { controller, unlink: () => signal.removeEventListener("abort", onAbort) };
}

/**
 * connect-node's Http2SessionManager as far as `SessionManager` reaches into it: the private
 * `setState`, through which every connection passes from "connecting" to "ready" (its HTTP/2
 * session). connect-node is pinned (package.json); the tests of the connect deadline and of the
 * TLS refusal fail should it move.
 */
interface ManagerInternals {
  setState(state: ConnectionState): void;
}
type ConnectionState = { t: "ready"; conn: ClientHttp2Session } | { t: "connecting" | "closed" | "error" };

/**
 * The client's connection manager: connect-node's, with each new connection watched from its
 * start.
 *
 * - A connection whose server has not sent its HTTP/2 SETTINGS (the first thing every HTTP/2
 *   server sends) within `connectTimeoutMs` of the attempt's start is given up, failing its
 *   calls with UNAVAILABLE. connect-node has no such deadline: it takes a connection for ready
 *   once TCP (and TLS) connected, and keepalive pings only start once a call has been open for
 *   `keepaliveMs`, so a server that accepts connections but never answers (stopped, or its
 *   accept queue full) held a call forever, or with keepalive off forever.
 * - A connection that the server closes while calls are open on it (a server killed, or a proxy
 *   that hung up) fails them with UNAVAILABLE ("the server closed the connection"), as the
 *   Python and Go clients report it. Node would close the streams with CANCEL, which Connect
 *   reports as CANCELLED: the code of a call its caller cancelled, which is not retried.
 * - A server that closes the connection without having sent anything fails its calls with
 *   `TlsRefused` instead with `tls` (see there), and with `PLAINTEXT_CLOSED` without.
 * - A call whose stream the server closes without an answer and without an error code (gRPC
 *   stopping while a large request was still on its way: RST_STREAM NO_ERROR) fails with
 *   UNAVAILABLE. Connect maps no error from that code and waited for an answer forever.
 */
class SessionManager extends Http2SessionManager {
  constructor(
    url: string,
    pings: { pingIntervalMs?: number; pingTimeoutMs?: number },
    http2Options: SecureClientSessionOptions | undefined,
    private readonly connectTimeoutMs: number,
    private readonly tls: boolean,
  ) {
    // The connection's socket is opened here, so that the connect deadline can destroy it while
    // TCP or TLS is unfinished: connect-node's own abort leaves such a socket to end gracefully,
    // which keeps the process alive until the kernel gives up on it (about two minutes).
    super(url, pings, {
      ...http2Options,
      // Node's default, 64 KiB, failed calls whose key the server would judge (a refused stream).
      maxSendHeaderBlockLength: MAX_SEND_HEADER_BLOCK_BYTES,
      createConnection: (authority: URL, options: SecureClientSessionOptions) =>
        connectSocket(authority, options, connectTimeoutMs),
    });
    const internals = this as unknown as ManagerInternals;
    const setState = internals.setState;
    let startedAt = performance.now();
    internals.setState = (state: ConnectionState) => {
      setState.call(this, state);
      if (state.t === "connecting") startedAt = performance.now();
      else if (state.t === "ready") this.watch(state.conn, startedAt);
    };
  }

  override async request(
    method: string,
    path: string,
    headers: OutgoingHttpHeaders,
    options: Omit<ClientSessionRequestOptions, "signal">,
  ): Promise<ClientHttp2Stream> {
    const stream = await super.request(method, path, headers, options);
    let answered = false;
    stream.once("response", () => {
      answered = true;
    });
    // Node ends such a stream only once its reader has read it to its end, and nobody reads a
    // stream without an answer: it told only "aborted" (its request was still being sent). An
    // error code other than NO_ERROR destroys the stream, and Connect maps that code.
    stream.once("aborted", () => {
      if (answered || stream.rstCode !== http2Constants.NGHTTP2_NO_ERROR) return;
      const unanswered = new ConnectError("the server closed the call's stream without answering it", Code.Unavailable);
      process.nextTick(() => stream.destroy(unanswered)); // once Node has finished closing it
    });
    return stream;
  }

  /**
   * Watches a connection from the moment it connected (a promise callback after its "connect"
   * event), with what is left of its connect deadline (`startedAt`: when it was opened): before
   * anything the server sent has been read.
   */
  private watch(session: ClientHttp2Session, startedAt: number): void {
    let heard = false;
    let timer: NodeJS.Timeout | undefined;
    const hear = () => {
      heard = true;
      clearTimeout(timer);
    };
    // The server's SETTINGS, its acknowledgement of ours, or a GOAWAY: it speaks HTTP/2.
    session.once("remoteSettings", hear);
    session.once("localSettings", hear);
    session.once("goaway", hear);
    session.once("close", () => clearTimeout(timer));
    if (this.connectTimeoutMs > 0) {
      const left = Math.max(0, startedAt + this.connectTimeoutMs - performance.now());
      timer = setTimeout(() => {
        if (heard || session.destroyed) return;
        session.on("error", () => {}); // Connect's own listener may be gone: no uncaught exception
        session.destroy(connectTimedOut(this.connectTimeoutMs), http2Constants.NGHTTP2_CANCEL);
      }, left).unref();
    }
    // "end" (the server closed its side) comes before the connection's "close", which would close
    // its streams with CANCEL; a stream closed with an error reports that error instead. close()
    // destroys the connection first: its calls stay CANCELLED.
    session.socket.once("end", () => {
      if (session.destroyed) return;
      session.on("error", () => {});
      session.destroy(
        heard
          ? new ConnectError("the server closed the connection", Code.Unavailable)
          : this.tls
            ? new TlsRefused()
            : new ConnectError(PLAINTEXT_CLOSED, Code.Unavailable),
      );
    });
  }
}

/**
 * Opens the socket of a new connection as http2.connect would (TCP, or TLS with ALPN "h2" and,
 * by default, the host as server name), destroyed with `connectTimedOut` when it has not
 * connected within `timeoutMs` (0: never): a SYN unanswered (the server's accept queue full, a
 * network dropping packets) or a TLS handshake that stalled.
 */
function connectSocket(authority: URL, options: SecureClientSessionOptions, timeoutMs: number): Duplex {
  const secure = authority.protocol === "https:";
  const hostname = authority.hostname === "" ? "localhost" : authority.hostname;
  const host = hostname.startsWith("[") ? hostname.slice(1, -1) : hostname;
  const port = authority.port !== "" ? Number(authority.port) : secure ? 443 : 80;
  // tls.connect sends no server name of its own: http2.connect names the host (not an IP
  // address, which SNI does not carry), and servers choosing a certificate or a backend by it
  // (proxies, load balancers) need it.
  const servername = options.servername ?? (isIP(host) === 0 ? host : undefined);
  const socket = secure
    ? tlsConnect(port, host, { ...options, ALPNProtocols: ["h2"], ...(servername === undefined ? {} : { servername }) })
    : netConnect({ ...(options as NetConnectOpts), host, port });
  if (timeoutMs > 0) {
    const timer = setTimeout(() => socket.destroy(connectTimedOut(timeoutMs)), timeoutMs).unref();
    socket.once(secure ? "secureConnect" : "connect", () => clearTimeout(timer));
    socket.once("close", () => clearTimeout(timer));
  }
  return socket;
}

/** The failure of a connection whose server did not complete the HTTP/2 handshake in time. */
function connectTimedOut(timeoutMs: number): ConnectError {
  return new ConnectError(
    `connection attempt timed out: the server did not complete the HTTP/2 handshake within ${timeoutMs} ms (connectTimeoutMs)`,
    Code.Unavailable,
  );
}

/** http2.connect's TLS options for `tls`, checked now rather than at the first call. */
function tlsSessionOptions(tls: TlsConfig): SecureClientSessionOptions {
  const pem = (value: string | Uint8Array | undefined): string | Buffer | undefined =>
    value === undefined || typeof value === "string"
      ? value
      : Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  const options: SecureClientSessionOptions = {};
  const ca = pem(tls.rootCertificates);
  const cert = pem(tls.certificateChain);
  const key = pem(tls.privateKey);
  if ((cert === undefined) !== (key === undefined)) {
    throw new TypeError("tls.certificateChain and tls.privateKey go together (a client certificate and its key)");
  }
  if (ca !== undefined) options.ca = ca;
  if (cert !== undefined) options.cert = cert;
  if (key !== undefined) options.key = key;
  try {
    // Node takes a CA that does not parse for no CA at all: every server would then be refused.
    if (ca !== undefined) new X509Certificate(ca);
    createSecureContext(options);
  } catch (error) {
    throw new TypeError(`tls: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
  }
  return options;
}

/** The longest wait Node's timers take, in milliseconds: a longer one fires at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Per-call options passed to the generated client. */
export interface CallOptions {
  headers: Record<string, string>;
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** A connection to a Sessions server. Call `close()` when done. */
export class SessionsClient {
  /** The generated Connect client, for RPCs the wrapper does not cover; pass `routingHeaders(key)`. */
  readonly rpc: Rpc;
  readonly address: string;
  private readonly sessionManager: Http2SessionManager;
  private readonly timeoutMs: number | undefined;
  private readonly retryPolicy: Required<RetryPolicy>;
  private readonly onRetry: ((notice: RetryNotice) => void | PromiseLike<void>) | undefined;
  /** Aborted by close(): the connection manager would otherwise reopen a connection for a retry. */
  private readonly closing = new AbortController();

  /**
   * `address` is "host:port" (plaintext HTTP/2, or TLS with `options.tls`) or a full "http://" /
   * "https://" URL. Throws a RangeError for a `retry` policy with a field out of range or a
   * `timeoutMs` out of range, a TypeError for `tls` settings that do not load or an "http://" URL
   * given `tls`.
   */
  constructor(address: string, options: ClientOptions = {}) {
    // Every call waiting out a retry's backoff, and every subscription waiting to reconnect,
    // listens here until its wait ends: past ten at once Node warned of a leak that is none.
    setMaxListeners(0, this.closing.signal);
    const { tls } = options;
    const url = /^https?:\/\//.test(address);
    if (url && tls !== undefined && address.startsWith("http://")) {
      throw new TypeError(`tls was given for a plaintext address (${address}): use https:// or host:port`);
    }
    const baseUrl = url ? address : `${tls !== undefined ? "https" : "http"}://${address}`;
    this.address = address;
    // A deadline of 0 failed every call at once, where Go's WithCallTimeout(0) is none, and so
    // did one past what Node's timers take (2^31 - 1 ms, about 24.8 days): refused.
    const timeoutMs = options.timeoutMs;
    if (timeoutMs !== undefined && !(timeoutMs > 0 && timeoutMs <= MAX_TIMER_MS)) {
      throw new RangeError(
        `timeoutMs must be a number > 0 and at most ${MAX_TIMER_MS} (leave it out for no deadline), got ${String(timeoutMs)}`,
      );
    }
    this.timeoutMs = options.timeoutMs;
    this.retryPolicy = retryPolicyOf(options.retry);
    this.onRetry = options.onRetry;
    const keepaliveMs = options.keepaliveMs ?? KEEPALIVE_MS;
    const pings =
      keepaliveMs > 0
        ? { pingIntervalMs: keepaliveMs, pingTimeoutMs: options.keepaliveTimeoutMs ?? KEEPALIVE_TIMEOUT_MS }
        : {};
    const connectTimeoutMs = options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS;
    if (!Number.isFinite(connectTimeoutMs) || connectTimeoutMs < 0) {
      throw new RangeError(`connectTimeoutMs must be a finite number >= 0, got ${String(connectTimeoutMs)}`);
    }
    const secure = baseUrl.startsWith("https://");
    this.sessionManager = new SessionManager(
      baseUrl,
      pings,
      tls === undefined ? undefined : tlsSessionOptions(tls),
      connectTimeoutMs,
      secure,
    );
    const interceptors: Interceptor[] = [...(options.interceptors ?? [])];
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

  object(objectKey: string): ObjectHandle {
    return new ObjectHandle(this, objectKey);
  }

  /** @internal Aborted by `close()`: what waits (a subscription's reconnect) stops with it. */
  get closedSignal(): AbortSignal {
    return this.closing.signal;
  }

  /**
   * Closes the HTTP/2 connection (and any call still open on it); calls waiting to retry fail at
   * once, a subscription ends, and calls made after it fail (CANCELLED, "the client is closed").
   */
  close(): void {
    this.closing.abort();
    // connect-node 2.1 removes its error listener when aborted, and only adds a stand-in for a
    // connection not yet destroyed. One its keepalive has just destroyed (a ping unanswered)
    // still raises that error once its socket closes, a few milliseconds later: with no
    // listener, an uncaught exception. So give such a connection a listener first. (`s` is the
    // manager's private state; if it ever moves, this does nothing.)
    const state = (this.sessionManager as unknown as { s?: { conn?: ClientHttp2Session } }).s;
    if (state?.conn?.destroyed === true) state.conn.once("error", () => {});
    this.sessionManager.abort();
  }

  /**
   * @internal Call options for one object: routing header, deadline (`timeoutMs`, unless
   * `deadline` is false, as for the long-lived change feed), cancellation.
   */
  callOptions(objectKey: string, signal?: AbortSignal, deadline = true): CallOptions {
    const options: CallOptions = { headers: routingHeaders(objectKey) };
    if (deadline && this.timeoutMs !== undefined) options.timeoutMs = this.timeoutMs;
    if (signal !== undefined) options.signal = signal;
    return options;
  }

  /**
   * @internal Runs a unary or client-streaming call, converting its errors and trying it again
   * as the retry policy allows. `run` starts one attempt with the options it is given (routing
   * header, the time left of the call's deadline, cancellation); it must build its request
   * stream afresh each time. `retry: false` for a call whose input cannot be sent twice.
   * `signal`: the caller's (see `AbortOptions`).
   */
  async call<T>(
    method: MethodName,
    objectKey: string,
    run: (options: CallOptions) => Promise<T>,
    options: { retry?: boolean; signal?: AbortSignal | undefined } = {},
  ): Promise<T> {
    const { signal } = options;
    if (abortedBy(signal)) throw cancelled(signal);
    if (this.closing.signal.aborted) throw closedClient(); // else a new connection would be opened
    checkKeyLength(objectKey);
    const { controller, unlink } = follow(signal);
    // One deadline for all attempts and waits, so that a retried call ends when a single one would.
    const deadlineAt = this.timeoutMs === undefined ? undefined : performance.now() + this.timeoutMs;
    try {
      for (let attempt = 1; ; attempt++) {
        const callOptions: CallOptions = { headers: routingHeaders(objectKey), signal: controller.signal };
        if (deadlineAt !== undefined) {
          callOptions.timeoutMs = attempt === 1 ? this.timeoutMs! : Math.max(1, Math.floor(deadlineAt - performance.now()));
        }
        try {
          return await run(callOptions);
        } catch (error) {
          const failure = this.failureOf(error, controller.signal, deadlineAt);
          if (options.retry === false) throw failure;
          await this.beforeRetry(method, attempt, failure, deadlineAt, controller.signal);
        }
      }
    } catch (error) {
      throw abortedBy(signal) ? cancelled(signal) : error;
    } finally {
      unlink();
    }
  }

  /**
   * @internal Runs a server-streaming call; breaking out of the loop (or an error) cancels it so
   * the server stops reading. A failure before the first response is tried again as the retry
   * policy allows (`retry: false`: never, for a stream with reconnect rules of its own); after
   * it, the caller has seen data, and the error is theirs. `signal`: the caller's (see
   * `AbortOptions`).
   */
  stream<T>(
    method: MethodName,
    objectKey: string,
    start: (options: CallOptions) => AsyncIterable<T>,
    options: { signal?: AbortSignal | undefined; deadline?: boolean; retry?: boolean } = {},
  ): AsyncGenerator<T> {
    const dropped: Dropped = { stop: () => {} };
    const generator = this.attempts(method, objectKey, start, options, dropped);
    DROPPED_STREAMS.register(generator, dropped, dropped);
    return generator;
  }

  /** `stream`'s generator; `dropped.stop` is set to cancel the call once it has started. */
  private async *attempts<T>(
    method: MethodName,
    objectKey: string,
    start: (options: CallOptions) => AsyncIterable<T>,
    options: { signal?: AbortSignal | undefined; deadline?: boolean; retry?: boolean },
    dropped: Dropped,
  ): AsyncGenerator<T> {
    const { signal, deadline = true } = options;
    if (abortedBy(signal)) throw cancelled(signal);
    if (this.closing.signal.aborted) throw closedClient(); // else a new connection would be opened
    checkKeyLength(objectKey);
    const { controller, unlink } = follow(signal);
    // The deadline is kept here rather than by Connect's `timeoutMs`: Connect leaves its deadline
    // timer running when a stream is cancelled through its signal, which keeps the process alive.
    const timeoutMs = deadline ? this.timeoutMs : undefined;
    const deadlineAt = timeoutMs === undefined ? undefined : performance.now() + timeoutMs;
    const timer =
      timeoutMs === undefined
        ? undefined
        : setTimeout(() => controller.abort(new ConnectError("the operation timed out", Code.DeadlineExceeded)), timeoutMs);
    dropped.stop = stopWhenDropped(controller, unlink, timer);
    let finished = false;
    let received = false;
    try {
      for (let attempt = 1; ; attempt++) {
        try {
          for await (const response of start(this.callOptions(objectKey, controller.signal, false))) {
            received = true;
            yield response;
          }
          finished = true;
          return;
        } catch (error) {
          const failure = this.failureOf(error, controller.signal, deadlineAt);
          if (received || options.retry === false) throw failure;
          await this.beforeRetry(method, attempt, failure, deadlineAt, controller.signal);
        }
      }
    } catch (error) {
      throw abortedBy(signal) ? cancelled(signal) : error;
    } finally {
      DROPPED_STREAMS.unregister(dropped);
      clearTimeout(timer);
      unlink();
      // The consumer stopped early (break, return, throw): cancel so the server stops reading.
      if (!finished) controller.abort(new ConnectError("the caller stopped reading the stream", Code.Canceled));
    }
  }

  /**
   * An attempt's error as a `SessionsError` (see `SessionsError.from`), with a connection failure
   * as UNAVAILABLE only when the client did not end the attempt itself: `signal` (the call's own,
   * which follows the caller's, a stream's deadline and its consumer stopping) aborted, `close()`
   * called, or the deadline (a `performance.now()` time) passed. Those keep Connect's CANCELLED or
   * DEADLINE_EXCEEDED, whatever the connection's teardown looked like.
   */
  private failureOf(error: unknown, signal: AbortSignal, deadlineAt: number | undefined): unknown {
    const endedHere =
      signal.aborted || this.closing.signal.aborted || (deadlineAt !== undefined && performance.now() >= deadlineAt);
    return sessionsErrorOf(error, !endedHere);
  }

  /**
   * Returns when attempt `attempt + 1` of `method` may start, after the policy's wait; throws
   * `failure` (the last attempt's error) when there is to be none: an error no retry can cure,
   * attempts used up, the wait would end at or past `deadlineAt` (a `performance.now()` time),
   * or `signal` cut it short (`call` and `stream` turn this into CANCELLED when the caller's
   * signal was the cause); throws the client's closed error (CANCELLED) when close() did.
   */
  private async beforeRetry(
    method: MethodName,
    attempt: number,
    failure: unknown,
    deadlineAt: number | undefined,
    signal?: AbortSignal,
  ): Promise<void> {
    const policy = this.retryPolicy;
    if (!(failure instanceof SessionsError) || attempt >= policy.maxAttempts || !retryable(method, failure)) throw failure;
    // A close() while the call waits to go again ends it as closed (CANCELLED), as a call made
    // after close() is: the last attempt's UNAVAILABLE would read as an outage.
    const stopped = () => {
      if (this.closing.signal.aborted) throw closedClient(failure);
      return signal?.aborted === true;
    };
    if (stopped()) throw failure;
    const backoff = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * policy.multiplier ** (attempt - 1));
    const delayMs = backoff * (0.5 + Math.random() / 2);
    const waitStart = performance.now();
    if (deadlineAt !== undefined && waitStart + delayMs >= deadlineAt) throw failure;
    await observe(this.onRetry?.({ method, attempt, error: failure, delayMs }), signal, this.closing.signal);
    await pause(delayMs - (performance.now() - waitStart), signal, this.closing.signal);
    // A slow observer can eat the rest of the deadline: an attempt with no time left cannot succeed.
    if (stopped() || (deadlineAt !== undefined && deadlineAt - performance.now() < 1)) throw failure;
  }
}

/** What cancels a server stream whose generator was dropped unfinished (see `DROPPED_STREAMS`). */
interface Dropped {
  stop: () => void;
}

/**
 * Cancels the call of a stream's generator that was garbage-collected before it ended: one
 * dropped after a `next()` without `return()` (a `for await` loop left by `break` ends it
 * properly) would otherwise hold its server stream, and the server's reads, until the client
 * closed. Best effort: collection comes when the engine decides, if at all, so an iterator not
 * run to its end should be ended with `return()`. The held `Dropped` must not reach the
 * generator, or it would never be collected: its `stop` is made outside the generator's body
 * (`stopWhenDropped`), holding only what cancels the call.
 */
const DROPPED_STREAMS = new FinalizationRegistry<Dropped>((dropped) => dropped.stop());

/** What `Dropped.stop` does for a stream's call: cancel it (the server stops reading) and let go of the caller's signal. */
function stopWhenDropped(controller: AbortController, unlink: () => void, timer: NodeJS.Timeout | undefined): () => void {
  return () => {
    clearTimeout(timer);
    unlink();
    controller.abort(new ConnectError("the stream's iterator was dropped before it ended", Code.Canceled));
  };
}

/** One object (an isolated store) on the server. */
export class ObjectHandle {
  constructor(
    readonly client: SessionsClient,
    readonly key: string,
  ) {}

  session(sessionId = ""): SessionHandle {
    return new SessionHandle(this, sessionId);
  }

  /**
   * Every session that holds messages or compactions, with its message count, by session id.
   * The server answers a page at a time (up to 1,000 sessions): this follows `next_page_token`
   * until the last page, one call per page (each bounded by `timeoutMs` and retried on its own),
   * as the Python client's `list_sessions` does.
   */
  async listSessions(options: AbortOptions = {}): Promise<SessionSummary[]> {
    const out: SessionSummary[] = [];
    let pageToken = "";
    do {
      const request = { objectKey: this.key, pageToken };
      const response = await this.client.call(
        "ListSessions",
        this.key,
        (o) => this.client.rpc.listSessions(request, o),
        { signal: options.signal },
      );
      for (const s of response.sessions) out.push({ sessionId: s.sessionId, messageCount: toNumber(s.messageCount) });
      pageToken = response.nextPageToken;
    } while (pageToken !== "");
    return out;
  }

  /**
   * Gives the disk back the room deletes freed in the object's file (`freeBytes`): the server
   * rewrites it with the pages in use; its writes wait meanwhile. Tried again only when the
   * server refused it before acting, as the other admin calls.
   */
  async vacuum(options: AbortOptions = {}): Promise<VacuumReport> {
    const r = await this.client.call(
      "VacuumObject",
      this.key,
      (o) => this.client.rpc.vacuumObject({ objectKey: this.key }, o),
      { signal: options.signal },
    );
    return { fileBytesBefore: toNumber(r.fileBytesBefore), fileBytesAfter: toNumber(r.fileBytesAfter) };
  }

  /** The object's storage: bytes, free bytes, rows, attachments and row writes. */
  async getObjectStats(options: AbortOptions = {}): Promise<ObjectStats> {
    const r = await this.client.call(
      "GetObjectStats",
      this.key,
      (o) => this.client.rpc.getObjectStats({ objectKey: this.key }, o),
      { signal: options.signal },
    );
    return {
      fileBytes: toNumber(r.fileBytes),
      messageRows: toNumber(r.messageRows),
      continuationRows: toNumber(r.continuationRows),
      attachmentCount: toNumber(r.attachmentCount),
      attachmentBytes: toNumber(r.attachmentBytes),
      rowWrites: toNumber(r.rowWrites),
      sessionCount: toNumber(r.sessionCount),
      freeBytes: toNumber(r.freeBytes),
    };
  }

  /**
   * One attachment payload by its hash: the lowercase hex after `attachment:sha256:` in a
   * message read with `pointers: true`. NOT_FOUND when the object holds no such payload. As a
   * read, it is tried again after a connection failure until its first frame has arrived.
   */
  async readAttachment(hash: string, options: AbortOptions = {}): Promise<Attachment> {
    const request = { objectKey: this.key, hash };
    let mediaType = "";
    let first = true;
    const chunks: Uint8Array[] = [];
    const responses = this.client.stream("ReadAttachment", this.key, (o) => this.client.rpc.readAttachment(request, o), {
      signal: options.signal,
    });
    for await (const response of responses) {
      if (first) {
        mediaType = response.mediaType;
        first = false;
      }
      chunks.push(response.data);
    }
    return { hash, mediaType, data: concatBytes(chunks) };
  }

  /**
   * Streams the object's change events in commit order (of every session, or of `sessionId`).
   * Large messages are reassembled. When the server goes away (a drain, a restart, a connection
   * its keepalive found dead: UNAVAILABLE or CANCELLED), when the object moves to another shard
   * (the old owner refuses it, FAILED_PRECONDITION / OBJECT_NOT_OWNED, until the proxy routes it
   * to the new one) or when a proxy ends the stream without the server's status (UNKNOWN) it
   * reconnects by itself, resuming after the last revision seen (PROGRESS events included); a
   * RESET event then means events were missed (re-read state). A failure of TLS is thrown at
   * once. PROGRESS events are dropped unless `includeProgress` is set; `pointers` leaves events'
   * attachments as pointers. Break out of the loop, or abort `signal` (the loop then throws
   * CANCELLED, as any call does), to unsubscribe; the client's `timeoutMs` does not apply.
   */
  async *subscribe(options: SubscribeOptions = {}): AsyncGenerator<ChangeEvent> {
    const resumeFrom = options.resumeAfterRevision ?? 0;
    if (typeof resumeFrom === "number" && !Number.isSafeInteger(resumeFrom)) {
      throw new RangeError(
        `resumeAfterRevision ${String(resumeFrom)} is not a safe integer: pass revisions as bigint (or a decimal string)`,
      );
    }
    let after = BigInt(resumeFrom);
    if (after < 0n || after >= 2n ** 64n) {
      // Else the request failed to encode, reported as an INTERNAL error of the call.
      throw new RangeError(`resumeAfterRevision ${String(resumeFrom)} is no revision: revisions run from 0 to 2^64 - 1`);
    }
    const maxAttempts = options.reconnectAttempts ?? RECONNECT_ATTEMPTS;
    const includeProgress = options.includeProgress ?? false;
    let attempts = 0;
    for (;;) {
      // A stream opens with a PROGRESS (the "subscribed"; a resume that missed events with a
      // RESET), which alone is no sign that it works: a proxy could accept every stream and fail
      // it at once. Only what follows it (an event, or a second PROGRESS a progress interval
      // later) ends a row of failed attempts.
      let acknowledged = false;
      try {
        for await (const event of this.subscribeOnce(after, options)) {
          if ((event.type === "PROGRESS" || event.type === "RESET") && !acknowledged) acknowledged = true;
          else attempts = 0;
          after = event.revision; // everything up to it has been delivered (or reset)
          if (event.type === "PROGRESS" && !includeProgress) continue;
          yield event;
        }
        return;
      } catch (error) {
        // close() ends the stream as a server that went away would: it must not reconnect.
        if (this.client.closedSignal.aborted) throw closedClient(error);
        const retryable = error instanceof SessionsError && resubscribable(error);
        if (!retryable || options.signal?.aborted === true || attempts >= maxAttempts) throw error;
        attempts += 1;
        await pause(resubscribeDelayMs(attempts), options.signal, this.client.closedSignal);
      }
    }
  }

  private async *subscribeOnce(after: bigint, options: SubscribeOptions): AsyncGenerator<ChangeEvent> {
    const request = {
      objectKey: this.key,
      resumeAfterRevision: after,
      attachments: attachmentMode(options.pointers),
      ...(options.sessionId !== undefined ? { sessionId: options.sessionId } : {}),
    };
    const assembler = new FrameAssembler();
    let head: ChangeEvent | null = null;
    // No retries here: subscribe() reconnects by its own rules, resuming after the last revision.
    const responses = this.client.stream("Subscribe", this.key, (o) => this.client.rpc.subscribe(request, o), {
      signal: options.signal,
      deadline: false,
      retry: false,
    });
    for await (const response of responses) {
      if (head === null) {
        head = {
          revision: response.revision,
          type: (ChangeType[response.type] ?? "UNSPECIFIED") as ChangeTypeName,
          sessionId: response.sessionId,
          inserted: response.inserted,
          parentMode: (ParentMode[response.parentMode] ?? "UNSPECIFIED") as ChangeEvent["parentMode"],
          parentId: response.parentId,
          messageIds: [...response.messageIds],
          error: response.error,
        };
        const compaction = compactionOf(response.compaction);
        if (compaction !== undefined) head.compaction = compaction;
      }
      if (response.message !== undefined) {
        const done = assembler.feed(response.message);
        if (done === null) continue;
        head.message = parseMessage(done.json);
      }
      const event = head;
      head = null;
      yield event;
    }
    assembler.finish();
  }
}

/**
 * Status codes after which a subscription reconnects by itself (the server went away: a
 * connection reset or closed under the stream is UNAVAILABLE, see `SessionsError.from`; CANCELLED
 * is a stream the server or a proxy reset).
 */
const RECONNECT_CODES = new Set(["UNAVAILABLE", "CANCELLED"]);

/**
 * The wait before a subscription's reconnection attempt `attempt` (from 1): 100 ms doubling to
 * 2 s, times a random factor from 0.5 to 1, so that the subscribers of a server that went away
 * do not all come back at the same instant.
 */
export function resubscribeDelayMs(attempt: number): number {
  return Math.min(2000, 50 * 2 ** attempt) * (0.5 + Math.random() / 2);
}

/**
 * Whether a subscription resumes after `error` (a resume repeats nothing), as the Python client's
 * `may_resubscribe`: the server went away (`RECONNECT_CODES`), it refused before acting (as any
 * call is retried after: draining, the object moving or moved to another shard, where the
 * proxy routes the resume to the new owner, whose feed answers it with a RESET; busy), or a
 * proxy ended the stream without the server's status (UNKNOWN without a reason: nginx's
 * "Stream removed" when the shard's connection closed under it). Never after a failure of TLS:
 * the next connection would fail the same way. (The caller's signal and `close()` are checked by
 * `subscribe`.)
 */
function resubscribable(error: SessionsError): boolean {
  if (TLS_FAILURES.has(error)) return false;
  if (RECONNECT_CODES.has(error.code) || refusedBeforeActing(error)) return true;
  return error.code === "UNKNOWN" && error.reason === null;
}

/** Reconnections in a row before a subscription gives up (as the Python and Go clients). */
export const RECONNECT_ATTEMPTS = 20;

/** Waits `ms` by `performance.now()`, or less when one of `signals` aborts. */
function pause(ms: number, ...signals: (AbortSignal | undefined)[]): Promise<void> {
  return new Promise((resolve) => {
    if (signals.some((signal) => signal?.aborted === true)) {
      resolve();
      return;
    }
    const endAt = performance.now() + ms;
    // Node's timers run on libuv's coarse whole-millisecond clock, so one often fires a millisecond
    // or two before a fractional delay has passed by performance.now(): re-arm until it has.
    let timer = setTimeout(tick, Math.max(0, ms));
    function tick(): void {
      const left = endAt - performance.now();
      if (left > 0) timer = setTimeout(tick, left);
      else done();
    }
    function done(): void {
      clearTimeout(timer);
      for (const signal of signals) signal?.removeEventListener("abort", done);
      resolve();
    }
    for (const signal of signals) signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * Waits for what the retry observer returned, as `await` would (its rejection is thrown), or less
 * when one of `signals` aborts: a call its caller gave up must not wait on the observer. Its
 * outcome is then left unheard (handled, so a later rejection is not reported as unhandled).
 */
function observe(returned: void | PromiseLike<void>, ...signals: (AbortSignal | undefined)[]): Promise<void> {
  if (returned === undefined || returned === null || typeof (returned as PromiseLike<void>).then !== "function") {
    return Promise.resolve();
  }
  return new Promise((resolve, reject) => {
    const stop = () => settle(resolve);
    function settle(finish: () => void): void {
      for (const signal of signals) signal?.removeEventListener("abort", stop);
      finish();
    }
    for (const signal of signals) signal?.addEventListener("abort", stop, { once: true });
    Promise.resolve(returned).then(
      () => settle(resolve),
      (error: unknown) => settle(() => reject(error)),
    );
    if (signals.some((signal) => signal?.aborted === true)) stop();
  });
}

/** One session inside an object; messages are plain objects. */
export class SessionHandle {
  readonly client: SessionsClient;
  readonly key: string;

  constructor(
    readonly object: ObjectHandle,
    readonly id: string,
  ) {
    this.client = object.client;
    this.key = object.key;
  }

  private get rpc(): Rpc {
    return this.client.rpc;
  }

  // ── writes ────────────────────────────────────────────────────────────────

  /** Appends one message; idempotent by id (a duplicate answers inserted=false with the stored one). */
  async appendMessage(message: MessageInput, options: WriteOptions = {}): Promise<AppendResult> {
    const text = toJson(message);
    if (jsonSize(text) > UNARY_LIMIT_BYTES) {
      const upload = await this.upload(UploadOperation.APPEND, text, options);
      return {
        inserted: upload.inserted,
        message: await this.written(upload.message, text, options),
        parentId: parentOf(upload.message?.info),
      };
    }
    const response = await this.client.call(
      "AppendMessage",
      this.key,
      (o) =>
        this.rpc.appendMessage(
          {
            objectKey: this.key,
            sessionId: this.id,
            messageJson: text,
            source: sourceValue(options.source),
            omitJsonAsSent: true,
            ...parentFields(options.parentId),
          },
          o,
        ),
      { signal: options.signal },
    );
    return {
      inserted: response.inserted,
      message: await this.written(response.message, text, options),
      parentId: parentOf(response.message?.info),
    };
  }

  /** Appends in one transaction; `parentId` applies to the first message, the rest chain (auto). */
  async appendMessages(messages: Iterable<MessageInput>, options: WriteOptions = {}): Promise<AppendResult[]> {
    const source = sourceValue(options.source);
    const texts = [...messages].map(toJson);
    const items = texts.map((text, index) => ({
      messageJson: text,
      source,
      ...parentFields(index === 0 ? options.parentId : undefined),
    }));
    const response = await this.client.call(
      "AppendMessages",
      this.key,
      (o) => this.rpc.appendMessages({ objectKey: this.key, sessionId: this.id, items, omitJsonAsSent: true }, o),
      { signal: options.signal },
    );
    if (response.results.length !== texts.length) {
      throw new SessionsError(
        Code.Internal,
        `the server answered ${response.results.length} results for ${texts.length} messages`,
      );
    }
    // JSON the answer had no room for is read back together, in one call.
    const missing = response.results
      .filter((r) => r.message?.jsonOmitted && !r.message.jsonAsSent)
      .map((r) => r.message?.info?.id ?? "");
    const readBack = new Map<string, Message>();
    if (missing.length > 0) {
      for (const [index, found] of (await this.getMessages(missing, { signal: options.signal })).entries()) {
        if (found === null) {
          throw new SessionsError(Code.NotFound, "written messages vanished before they were read back");
        }
        readBack.set(missing[index]!, found);
      }
    }
    const out: AppendResult[] = [];
    for (const [index, r] of response.results.entries()) {
      const omitted = r.message?.jsonOmitted && !r.message.jsonAsSent;
      const message = omitted
        ? readBack.get(r.message?.info?.id ?? "")!
        : await this.written(r.message, texts[index]!, options);
      out.push({ inserted: r.inserted, message, parentId: parentOf(r.message?.info) });
    }
    return out;
  }

  /** Replaces an existing message's content; null when no message has that id. */
  async updateMessage(message: MessageInput, options: AbortOptions & { source?: SourceArg } = {}): Promise<Message | null> {
    const text = toJson(message);
    if (jsonSize(text) > UNARY_LIMIT_BYTES) {
      const upload = await this.upload(UploadOperation.UPDATE, text, options);
      return upload.found ? await this.written(upload.message, text, options) : null;
    }
    const response = await this.client.call(
      "UpdateMessage",
      this.key,
      (o) =>
        this.rpc.updateMessage(
          {
            objectKey: this.key,
            sessionId: this.id,
            messageJson: text,
            source: sourceValue(options.source),
            omitJsonAsSent: true,
          },
          o,
        ),
      { signal: options.signal },
    );
    return response.found ? await this.written(response.message, text, options) : null;
  }

  /** Appends the message when its id is new, otherwise updates it (never re-parents it). */
  async upsertMessage(message: MessageInput, options: WriteOptions = {}): Promise<UpsertResult> {
    const text = toJson(message);
    if (jsonSize(text) > UNARY_LIMIT_BYTES) {
      const upload = await this.upload(UploadOperation.UPSERT, text, options);
      return { inserted: upload.inserted, changed: upload.changed, message: await this.written(upload.message, text, options) };
    }
    const response = await this.client.call(
      "UpsertMessage",
      this.key,
      (o) =>
        this.rpc.upsertMessage(
          {
            objectKey: this.key,
            sessionId: this.id,
            messageJson: text,
            source: sourceValue(options.source),
            omitJsonAsSent: true,
            ...parentFields(options.parentId),
          },
          o,
        ),
      { signal: options.signal },
    );
    return {
      inserted: response.inserted,
      changed: response.changed,
      message: await this.written(response.message, text, options),
    };
  }

  /** Deletes messages by id (children are re-parented); returns how many were deleted. */
  async deleteMessages(ids: Iterable<string>, options: AbortOptions = {}): Promise<number> {
    // Read once: a retry must send the same ids, and `ids` may be a one-shot iterator.
    const messageIds = [...ids];
    const response = await this.client.call(
      "DeleteMessages",
      this.key,
      (o) => this.rpc.deleteMessages({ objectKey: this.key, sessionId: this.id, messageIds }, o),
      { signal: options.signal },
    );
    return toNumber(response.deletedCount);
  }

  /** Deletes every message and compaction of the session; returns how many messages were deleted. */
  async clearMessages(options: AbortOptions = {}): Promise<number> {
    const response = await this.client.call(
      "ClearMessages",
      this.key,
      (o) => this.rpc.clearMessages({ objectKey: this.key, sessionId: this.id }, o),
      { signal: options.signal },
    );
    return toNumber(response.deletedCount);
  }

  /** Imports one message verbatim; false when its id already existed. */
  async importMessage(
    message: MessageInput,
    options: AbortOptions & { parentId: string | null; createdAt?: number | Date },
  ): Promise<boolean> {
    const item = new ImportItem(message, options.parentId, options.createdAt);
    return (await this.importMessages([item], { signal: options.signal })).imported === 1;
  }

  /**
   * Streams messages in verbatim (explicit parent and created time). Items are `ImportItem`s /
   * `{message, parentId, createdAt?}` literals, or plain messages, which chain: each one's parent
   * is the previous item's message. An array goes packed (many messages a frame), another
   * iterable a message at a time as it yields; large messages are sent in pieces.
   */
  async importMessages(
    items: Iterable<ImportItem | ImportItemLike | MessageInput> | AsyncIterable<ImportItem | ImportItemLike | MessageInput>,
    options: AbortOptions = {},
  ): Promise<ImportResult> {
    const made: { failure?: unknown } = {};
    // An array is sent whole again by each attempt; another iterable cannot be read twice, so its
    // call is never retried.
    const frames = () => keepingFailure(importFrames(this.key, this.id, items), made);
    let response: Awaited<ReturnType<typeof this.rpc.importMessages>>;
    try {
      response = await this.client.call("ImportMessages", this.key, (o) => this.rpc.importMessages(frames(), o), {
        retry: Array.isArray(items),
        signal: options.signal,
      });
    } catch (error) {
      // What making a frame threw (the caller's iterable, a message JSON cannot hold) is the
      // cause; Connect reports it as INTERNAL, a status no server sent. Connect's own error,
      // thrown into the frames as it ends the call (its deadline passed while a frame waited
      // to be sent), is no such cause: the call's SessionsError says it.
      throw "failure" in made && !(made.failure instanceof ConnectError) ? made.failure : error;
    }
    const result = { imported: toNumber(response.importedCount), skipped: toNumber(response.skippedCount) };
    if (Array.isArray(items) && result.imported + result.skipped !== items.length) {
      throw new SessionsError(
        Code.FailedPrecondition,
        `the server accounted for ${result.imported + result.skipped} of the ${items.length} messages sent: it does ` +
          "not read packed import frames (ImportedMessage); upgrade it, or pass the messages as a non-array iterable",
      );
    }
    return result;
  }

  // ── reads ─────────────────────────────────────────────────────────────────

  /** One message by id; null when it does not exist. */
  async getMessage(messageId: string, options: ReadOptions = {}): Promise<Message | null> {
    const request = { objectKey: this.key, sessionId: this.id, messageId, attachments: attachmentMode(options.pointers) };
    let message: Message | null = null;
    // Read to the end (one message at most) rather than cancel the call after the first.
    for await (const found of this.messages("GetMessage", (o) => this.rpc.getMessage(request, o), options)) {
      message ??= parseMessage(found.json);
    }
    return message;
  }

  /** Messages in the order of `ids`, null where absent. */
  async getMessages(ids: Iterable<string>, options: ReadOptions = {}): Promise<(Message | null)[]> {
    const messageIds = [...ids];
    const request = {
      objectKey: this.key,
      sessionId: this.id,
      messageIds,
      attachments: attachmentMode(options.pointers),
      maxMessagesPerResponse: PACKED_MESSAGES,
    };
    const byId = new Map<string, Message>();
    for await (const found of this.messages("GetMessages", (o) => this.rpc.getMessages(request, o), options)) {
      const message = parseMessage(found.json);
      byId.set(found.info?.id ?? message.id, message);
    }
    return messageIds.map((id) => byId.get(id) ?? null);
  }

  /** The active leaf (the session's newest message); null for an empty session. */
  async getLatestLeaf(options: ReadOptions = {}): Promise<Message | null> {
    const request = { objectKey: this.key, sessionId: this.id, attachments: attachmentMode(options.pointers) };
    let message: Message | null = null;
    for await (const found of this.messages("GetLatestLeaf", (o) => this.rpc.getLatestLeaf(request, o), options)) {
      message ??= parseMessage(found.json);
    }
    return message;
  }

  /** The direct children of a message, oldest first. */
  async getBranches(messageId: string, options: ReadOptions = {}): Promise<Message[]> {
    const request = {
      objectKey: this.key,
      sessionId: this.id,
      messageId,
      attachments: attachmentMode(options.pointers),
      maxMessagesPerResponse: PACKED_MESSAGES,
    };
    const out: Message[] = [];
    for await (const found of this.messages("GetBranches", (o) => this.rpc.getBranches(request, o), options)) {
      out.push(parseMessage(found.json));
    }
    return out;
  }

  /**
   * Streams one root-to-leaf path; break out of the loop to stop the server's reads. `limit`: at
   * most that many messages (a RangeError, before any call, unless a positive integer < 2^32).
   * An iterator stepped with `next()` and not run to its end must be ended with `return()` (as
   * `for await … break` does): one merely dropped holds its server stream, and the server's
   * reads, until it is garbage-collected, when its call is cancelled, and the engine may collect
   * it late or never.
   */
  async *history(options: HistoryOptions = {}): AsyncGenerator<Message> {
    const request = {
      objectKey: this.key,
      sessionId: this.id,
      leafId: options.leafId ?? "",
      newestFirst: options.newestFirst ?? false,
      attachments: attachmentMode(options.pointers),
      maxMessagesPerResponse: PACKED_MESSAGES,
      maxMessages: maxMessages(options.limit),
    };
    for await (const found of this.messages("StreamHistory", (o) => this.rpc.streamHistory(request, o), options)) {
      yield parseMessage(found.json);
    }
  }

  /**
   * Streams a path in batches marked by the server (by count and JSON bytes); `limit` as in
   * `history`, and as there, end an iterator not run to its end with `return()`.
   */
  async *historyBatches(options: HistoryBatchOptions = {}): AsyncGenerator<Message[]> {
    const request = {
      objectKey: this.key,
      sessionId: this.id,
      leafId: options.leafId ?? "",
      newestFirst: options.newestFirst ?? false,
      batchSize: Math.max(1, Math.trunc(options.batchSize ?? 50)),
      maxBatchBytes: BigInt(Math.max(1, Math.trunc(options.maxBatchBytes ?? 4 * 1024 * 1024))),
      attachments: attachmentMode(options.pointers),
      maxMessagesPerResponse: PACKED_MESSAGES,
      maxMessages: maxMessages(options.limit),
    };
    let batch: Message[] = [];
    const assembler = new FrameAssembler();
    const responses = this.client.stream("StreamHistory", this.key, (o) => this.rpc.streamHistory(request, o), {
      signal: options.signal,
    });
    for await (const response of responses) {
      for (const frame of framesOf(response)) {
        const done = assembler.feed(frame);
        if (done !== null) batch.push(parseMessage(done.json));
      }
      // The server ends a batch only at the end of a response (after its last frame).
      if (response.batchEnd) {
        yield batch;
        batch = [];
      }
    }
    assembler.finish();
    if (batch.length > 0) yield batch;
  }

  /** The whole path as an array (with `limit`, at most that many messages). */
  async getHistory(options: HistoryOptions = {}): Promise<Message[]> {
    const out: Message[] = [];
    for await (const message of this.history(options)) out.push(message);
    return out;
  }

  /** The longest recent suffix of a path whose stored size fits `maxContentBytes` (at least the newest message). */
  async getRecentHistory(maxContentBytes: number, options: ReadOptions & { leafId?: string } = {}): Promise<RecentHistory> {
    const request = {
      objectKey: this.key,
      sessionId: this.id,
      maxContentBytes: BigInt(Math.trunc(maxContentBytes)),
      leafId: options.leafId ?? "",
      attachments: attachmentMode(options.pointers),
      maxMessagesPerResponse: PACKED_MESSAGES,
    };
    let truncated = false;
    let total = 0;
    const messages: Message[] = [];
    const assembler = new FrameAssembler();
    const responses = this.client.stream("GetRecentHistory", this.key, (o) => this.rpc.getRecentHistory(request, o), {
      signal: options.signal,
    });
    for await (const response of responses) {
      if (response.summary !== undefined) {
        truncated = response.summary.truncated;
        total = toNumber(response.summary.totalContentBytes);
      }
      for (const frame of framesOf(response)) {
        const done = assembler.feed(frame);
        if (done !== null) messages.push(parseMessage(done.json));
      }
    }
    assembler.finish();
    return { messages, truncated, totalContentBytes: total };
  }

  /** Per-message stored sizes and token estimates along a path, root first. */
  async getHistoryRowStats(options: AbortOptions & { leafId?: string } = {}): Promise<RowStat[]> {
    const request = { objectKey: this.key, sessionId: this.id, leafId: options.leafId ?? "" };
    const out: RowStat[] = [];
    const responses = this.client.stream("GetHistoryRowStats", this.key, (o) => this.rpc.getHistoryRowStats(request, o), {
      signal: options.signal,
    });
    for await (const response of responses) {
      for (const s of response.stats) {
        out.push({ id: s.id, role: s.role, bytes: toNumber(s.bytes), tokenEstimate: toNumber(s.tokenEstimate) });
      }
    }
    return out;
  }

  // ── compaction ────────────────────────────────────────────────────────────

  /**
   * Stores a compaction overlay: reads then show one synthetic message holding `summary` in
   * place of the path from `fromMessageId` to `toMessageId` (neither is checked, as upstream).
   * Nothing is deleted. Not tried again after a connection failure (a repeat would store a
   * second record), only after a refusal before acting.
   */
  async addCompaction(
    summary: string,
    fromMessageId: string,
    toMessageId: string,
    options: AddCompactionOptions = {},
  ): Promise<Compaction> {
    const request = {
      objectKey: this.key,
      sessionId: this.id,
      summary,
      fromMessageId,
      toMessageId,
      fromCompact: options.fromCompact ?? false,
      planToken: options.planToken ?? "",
    };
    const response = await this.client.call("AddCompaction", this.key, (o) => this.rpc.addCompaction(request, o), {
      signal: options.signal,
    });
    return storedCompaction(response.compaction);
  }

  /**
   * Every compaction record of the session, oldest first (superseded ones included). The server
   * answers a page at a time (100 records): this follows `next_page_token` to the last page, one
   * call per page, as `listSessions` does.
   */
  async listCompactions(options: AbortOptions = {}): Promise<Compaction[]> {
    const out: Compaction[] = [];
    let pageToken = "";
    do {
      const request = { objectKey: this.key, sessionId: this.id, pageToken };
      const response = await this.client.call("ListCompactions", this.key, (o) => this.rpc.listCompactions(request, o), {
        signal: options.signal,
      });
      for (const record of response.compactions) out.push(storedCompaction(record));
      pageToken = response.nextPageToken;
    } while (pageToken !== "");
    return out;
  }

  /**
   * Plans a compaction of the path (the active branch, or `leafId`) as upstream's
   * createCompactFunction does: the span to summarize and the prompt for a summarizer of yours.
   * null when there is nothing to compact. Store the summary with `addCompaction`, or let
   * `compact(summarize)` do all three steps.
   */
  async planCompaction(options: PlanCompactionOptions = {}): Promise<CompactionPlan | null> {
    const request = this.compactionRequest(options);
    const response = await this.client.call("PlanCompaction", this.key, (o) => this.rpc.planCompaction(request, o), {
      signal: options.signal,
    });
    if (!response.planned) return null;
    return {
      fromMessageId: response.fromMessageId,
      toMessageId: response.toMessageId,
      prompt: response.prompt,
      budgetTokens: toNumber(response.budgetTokens),
      planToken: response.planToken,
    };
  }

  /**
   * Compacts the path (the active branch, or `leafId`). With `summarize`, the summarizer runs
   * here: the server plans (`planCompaction`), `summarize(prompt)` writes the summary, and it is
   * stored as `addCompaction(..., { fromCompact: true })` does (upstream's
   * createCompactFunction; subscribers see COMPACT). Without it, the server's summarizer does the
   * work (`--summarizer-url`; without one the server answers FAILED_PRECONDITION /
   * NO_SUMMARIZER). null when there was nothing to compact, or the summary was blank (as
   * JavaScript's `trim()` finds it). `keepRecentTokens` 0 (the default): the session's policy,
   * whose own 0 is 20,000. The server-side Compact is not tried again after a connection
   * failure (a repeat would store a second record), as in the Python and Go clients. With
   * `summarize`, the summary is stored with the plan's `planToken`: when the server refuses it
   * because the span changed meanwhile (SESSION_CHANGED) or the plan is no longer held
   * (PLAN_EXPIRED), it plans and summarizes again, at once, three tries in all, and throws the
   * last refusal after the third.
   */
  async compact(options?: CompactOptions): Promise<Compaction | null>;
  async compact(summarize: Summarizer | undefined, options?: CompactOptions): Promise<Compaction | null>;
  async compact(first?: Summarizer | CompactOptions, second?: CompactOptions): Promise<Compaction | null> {
    const summarize = typeof first === "function" ? first : undefined;
    const options: CompactOptions = (typeof first === "function" || first === undefined ? second : first) ?? {};
    if (summarize === undefined) {
      const request = this.compactionRequest(options);
      const response = await this.client.call("Compact", this.key, (o) => this.rpc.compact(request, o), {
        signal: options.signal,
      });
      return response.compacted ? storedCompaction(response.compaction) : null;
    }
    for (let attempt = 1; ; attempt++) {
      const plan = await this.planCompaction(options);
      if (plan === null) return null;
      const summary: unknown = await summarize(plan.prompt, options.signal === undefined ? {} : { signal: options.signal });
      if (typeof summary !== "string") throw new TypeError(`summarize returned ${typeof summary}, not a string`);
      if (summary.trim() === "") return null;
      try {
        return await this.addCompaction(summary, plan.fromMessageId, plan.toMessageId, {
          fromCompact: true,
          planToken: plan.planToken,
          signal: options.signal,
        });
      } catch (error) {
        if (attempt >= COMPACT_ATTEMPTS || !summaryRefused(error)) throw error;
      }
    }
  }

  /**
   * Stores the session's automatic compaction policy and returns it as stored: compact after an
   * inserted append once the session's token estimate exceeds `thresholdTokens` (0: never). A
   * threshold needs the server's summarizer: without one it is refused (FAILED_PRECONDITION,
   * NO_SUMMARIZER) and nothing is stored; a threshold of 0 still stores `keepRecentTokens`.
   */
  async setCompactionPolicy(thresholdTokens: number, options: SetCompactionPolicyOptions = {}): Promise<CompactionPolicy> {
    const request = {
      objectKey: this.key,
      sessionId: this.id,
      policy: {
        thresholdTokens: int64Of("thresholdTokens", thresholdTokens),
        keepRecentTokens: int64Of("keepRecentTokens", options.keepRecentTokens),
      },
    };
    const response = await this.client.call(
      "SetCompactionPolicy",
      this.key,
      (o) => this.rpc.setCompactionPolicy(request, o),
      { signal: options.signal },
    );
    return policyOf(response.policy);
  }

  /** The session's automatic compaction policy (all zero when none was set). */
  async getCompactionPolicy(options: AbortOptions = {}): Promise<CompactionPolicy> {
    const request = { objectKey: this.key, sessionId: this.id };
    const response = await this.client.call(
      "GetCompactionPolicy",
      this.key,
      (o) => this.rpc.getCompactionPolicy(request, o),
      { signal: options.signal },
    );
    return policyOf(response.policy);
  }

  // ── search ────────────────────────────────────────────────────────────────

  /**
   * Full-text search over message text, best match first: the whole query as one phrase
   * (default, upstream's semantics) or, with `mode: "all_words"`, every word in any order; in
   * this session or, with `allSessions`, every session of the object. Hits are asked for packed
   * (many a response) and a hit sent in pieces is joined.
   */
  async search(query: string, options: SearchOptions = {}): Promise<SearchResult[]> {
    const request = {
      objectKey: this.key,
      sessionId: this.id,
      query,
      limit: searchLimit(options.limit),
      mode: searchMode(options.mode),
      allSessions: options.allSessions ?? false,
      maxHitsPerResponse: SEARCH_HITS_PER_RESPONSE,
    };
    const responses = this.client.stream("SearchMessages", this.key, (o) => this.rpc.searchMessages(request, o), {
      signal: options.signal,
    });
    return collectSearch(responses);
  }

  /** The object's change feed, filtered to this session unless `sessionId` says otherwise. */
  subscribe(options: SubscribeOptions = {}): AsyncGenerator<ChangeEvent> {
    return this.object.subscribe({ sessionId: this.id, ...options });
  }

  // ── helpers ───────────────────────────────────────────────────────────────

  private async *messages(
    method: MethodName,
    start: (options: CallOptions) => AsyncIterable<FramedResponse>,
    options: AbortOptions,
  ): AsyncGenerator<Assembled> {
    const assembler = new FrameAssembler();
    for await (const response of this.client.stream(method, this.key, start, { signal: options.signal })) {
      for (const frame of framesOf(response)) {
        const done = assembler.feed(frame);
        if (done !== null) yield done;
      }
    }
    assembler.finish();
  }

  /**
   * The written message: from the response, else the JSON this call sent when the server says
   * the omitted JSON is exactly that (`jsonAsSent`; writes ask it to leave such JSON out), else
   * read back (under the write's `signal`: the caller is waiting for both).
   */
  private async written(written: WrittenMessage | undefined, sent: string, options: AbortOptions): Promise<Message> {
    if (written === undefined) {
      throw new SessionsError(Code.Internal, "the server returned no stored message");
    }
    if (written.jsonOmitted && written.jsonAsSent) {
      return parseMessage(sent);
    }
    if (written.jsonOmitted) {
      const id = written.info?.id ?? "";
      const fetched = await this.getMessage(id, { signal: options.signal });
      if (fetched === null) {
        throw new SessionsError(Code.NotFound, "written message vanished before it was read back");
      }
      return fetched;
    }
    return parseMessage(written.json);
  }

  /** The fields PlanCompaction and Compact share: the path's leaf and the recent tail to keep. */
  private compactionRequest(options: PlanCompactionOptions) {
    return {
      objectKey: this.key,
      sessionId: this.id,
      leafId: options.leafId ?? "",
      keepRecentTokens: int64Of("keepRecentTokens", options.keepRecentTokens),
    };
  }

  private upload(operation: UploadOperation, text: string, options: WriteOptions): Promise<UploadMessageResponse> {
    const header = create(UploadHeaderSchema, {
      objectKey: this.key,
      sessionId: this.id,
      operation,
      source: sourceValue(options.source),
      ...(operation === UploadOperation.UPDATE ? {} : parentFields(options.parentId)),
    });
    async function* frames(): AsyncGenerator<UploadMessageRequest> {
      let first = true;
      for (const piece of pieces(text)) {
        yield create(UploadMessageRequestSchema, first ? { header, jsonPiece: piece } : { jsonPiece: piece });
        first = false;
      }
    }
    // frames() is called per attempt: a retry sends the message again from its first piece.
    return this.client.call("UploadMessage", this.key, (o) => this.rpc.uploadMessage(frames(), o), {
      signal: options.signal,
    });
  }
}

/** An import sends messages of up to this many UTF-8 bytes whole, packed into frames of about
 * IMPORT_FRAME_BYTES (each frame costs the server a read of its own); larger ones in pieces. */
const IMPORT_WHOLE_BYTES = 256 * 1024;
const IMPORT_FRAME_BYTES = 1024 * 1024;

/**
 * ImportMessages frames. An array is packed: messages of up to IMPORT_WHOLE_BYTES go whole
 * (`ImportedMessage`), many a frame; a server older than that field reads none of them, which
 * `importMessages` reports. Other iterables go a message per frame, each as soon as it is
 * yielded. A larger message goes in pieces either way.
 */
/** `frames` as they are made; what making one throws is kept in `made.failure` (and thrown on). */
async function* keepingFailure<T>(frames: AsyncIterable<T>, made: { failure?: unknown }): AsyncGenerator<T> {
  try {
    yield* frames;
  } catch (error) {
    made.failure = error;
    throw error;
  }
}

async function* importFrames(
  objectKey: string,
  sessionId: string,
  items: Iterable<ImportItem | ImportItemLike | MessageInput> | AsyncIterable<ImportItem | ImportItemLike | MessageInput>,
): AsyncGenerator<ImportMessagesRequest> {
  const pack = Array.isArray(items);
  let previous: string | null = null;
  let frame = create(ImportMessagesRequestSchema, { objectKey, sessionId });
  let packed = 0;
  let sent = false;
  for await (const raw of items) {
    const item: ImportItemLike = isImportItem(raw) ? raw : { message: raw, parentId: previous };
    const text = toJson(item.message);
    const size = Buffer.byteLength(text, "utf8");
    const parentId = item.parentId ?? undefined;
    if (pack && size <= IMPORT_WHOLE_BYTES) {
      if (packed > 0 && packed + size > IMPORT_FRAME_BYTES) {
        yield frame;
        frame = create(ImportMessagesRequestSchema);
        packed = 0;
        sent = true;
      }
      const whole = create(ImportedMessageSchema, { json: text, createdAtMs: createdAtMs(item.createdAt) });
      if (parentId !== undefined) whole.parentId = parentId;
      frame.messages.push(whole);
      packed += size;
    } else {
      if (packed > 0) {
        // Whole messages first, in a frame of their own: no frame over ~4 MiB.
        yield frame;
        frame = create(ImportMessagesRequestSchema);
        packed = 0;
        sent = true;
      }
      const parts = [...pieces(text)];
      for (let index = 0; index < parts.length; index++) {
        frame.jsonPiece = parts[index]!;
        frame.morePieces = index < parts.length - 1;
        if (index === 0) {
          frame.createdAtMs = createdAtMs(item.createdAt);
          if (parentId !== undefined) frame.parentId = parentId;
        }
        yield frame;
        frame = create(ImportMessagesRequestSchema);
        packed = 0;
        sent = true;
      }
    }
    previous = messageIdOf(item.message);
  }
  if (packed > 0 || !sent) yield frame; // an empty import still names its object
}
