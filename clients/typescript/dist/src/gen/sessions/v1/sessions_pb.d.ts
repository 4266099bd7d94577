import type { GenEnum, GenFile, GenMessage, GenService } from "@bufbuild/protobuf/codegenv2";
import type { Message } from "@bufbuild/protobuf";
/**
 * Describes the file sessions/v1/sessions.proto.
 */
export declare const file_sessions_v1_sessions: GenFile;
/**
 * Facts about a stored message, lifted beside its JSON. Output only.
 *
 * @generated from message sessions.v1.MessageInfo
 */
export type MessageInfo = Message<"sessions.v1.MessageInfo"> & {
    /**
     * The message id.
     *
     * @generated from field: string id = 1;
     */
    id: string;
    /**
     * The message role.
     *
     * @generated from field: string role = 2;
     */
    role: string;
    /**
     * The parent message id; unset for a root.
     *
     * @generated from field: optional string parent_id = 3;
     */
    parentId?: string | undefined;
    /**
     * Per-session insertion number; the newest message has the highest.
     *
     * @generated from field: int64 seq = 4;
     */
    seq: bigint;
    /**
     * When the row was written (or the created time given to ImportMessages), Unix milliseconds.
     *
     * @generated from field: int64 created_at_ms = 5;
     */
    createdAtMs: bigint;
    /**
     * Token estimate stamped when the row was written.
     *
     * @generated from field: int64 token_estimate = 6;
     */
    tokenEstimate: bigint;
    /**
     * True for a synthetic compaction overlay message (no row; only id and role are set).
     *
     * @generated from field: bool overlay = 7;
     */
    overlay: boolean;
};
/**
 * Describes the message sessions.v1.MessageInfo.
 * Use `create(MessageInfoSchema)` to create a new message.
 */
export declare const MessageInfoSchema: GenMessage<MessageInfo>;
/**
 * One message, or one piece of a large message, in a server stream.
 *
 * @generated from message sessions.v1.MessageFrame
 */
export type MessageFrame = Message<"sessions.v1.MessageFrame"> & {
    /**
     * Set on the first frame of each message.
     *
     * @generated from field: sessions.v1.MessageInfo info = 1;
     */
    info?: MessageInfo | undefined;
    /**
     * The message JSON, or the next piece of it.
     *
     * @generated from field: string json = 2;
     */
    json: string;
    /**
     * True when further pieces of this message follow.
     *
     * @generated from field: bool more_pieces = 3;
     */
    morePieces: boolean;
};
/**
 * Describes the message sessions.v1.MessageFrame.
 * Use `create(MessageFrameSchema)` to create a new message.
 */
export declare const MessageFrameSchema: GenMessage<MessageFrame>;
/**
 * The stored form of a written message, returned by writes.
 *
 * @generated from message sessions.v1.WrittenMessage
 */
export type WrittenMessage = Message<"sessions.v1.WrittenMessage"> & {
    /**
     * Facts about the stored row; `parent_id` is the parent actually used.
     *
     * @generated from field: sessions.v1.MessageInfo info = 1;
     */
    info?: MessageInfo | undefined;
    /**
     * The stored message JSON; empty when `json_omitted`.
     *
     * @generated from field: string json = 2;
     */
    json: string;
    /**
     * True when the JSON is too large for one response frame; read it with GetMessage.
     *
     * @generated from field: bool json_omitted = 3;
     */
    jsonOmitted: boolean;
};
/**
 * Describes the message sessions.v1.WrittenMessage.
 * Use `create(WrittenMessageSchema)` to create a new message.
 */
export declare const WrittenMessageSchema: GenMessage<WrittenMessage>;
/**
 * One appended message and its outcome.
 *
 * @generated from message sessions.v1.AppendResult
 */
export type AppendResult = Message<"sessions.v1.AppendResult"> & {
    /**
     * False when the id already existed; `message` is then the stored one.
     *
     * @generated from field: bool inserted = 1;
     */
    inserted: boolean;
    /**
     * The stored message.
     *
     * @generated from field: sessions.v1.WrittenMessage message = 2;
     */
    message?: WrittenMessage | undefined;
};
/**
 * Describes the message sessions.v1.AppendResult.
 * Use `create(AppendResultSchema)` to create a new message.
 */
export declare const AppendResultSchema: GenMessage<AppendResult>;
/**
 * Request for AppendMessage.
 *
 * @generated from message sessions.v1.AppendMessageRequest
 */
export type AppendMessageRequest = Message<"sessions.v1.AppendMessageRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id; "" is the default session.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The message as JSON text.
     *
     * @generated from field: string message_json = 3;
     */
    messageJson: string;
    /**
     * Where the message attaches.
     *
     * @generated from field: sessions.v1.ParentMode parent_mode = 4;
     */
    parentMode: ParentMode;
    /**
     * The parent for PARENT_MODE_ID (or UNSPECIFIED with a non-empty id).
     *
     * @generated from field: string parent_id = 5;
     */
    parentId: string;
    /**
     * Who produced the message.
     *
     * @generated from field: sessions.v1.Source source = 6;
     */
    source: Source;
};
/**
 * Describes the message sessions.v1.AppendMessageRequest.
 * Use `create(AppendMessageRequestSchema)` to create a new message.
 */
export declare const AppendMessageRequestSchema: GenMessage<AppendMessageRequest>;
/**
 * Response for AppendMessage.
 *
 * @generated from message sessions.v1.AppendMessageResponse
 */
export type AppendMessageResponse = Message<"sessions.v1.AppendMessageResponse"> & {
    /**
     * False when the id already existed; `message` is then the stored one.
     *
     * @generated from field: bool inserted = 1;
     */
    inserted: boolean;
    /**
     * The stored message.
     *
     * @generated from field: sessions.v1.WrittenMessage message = 2;
     */
    message?: WrittenMessage | undefined;
};
/**
 * Describes the message sessions.v1.AppendMessageResponse.
 * Use `create(AppendMessageResponseSchema)` to create a new message.
 */
export declare const AppendMessageResponseSchema: GenMessage<AppendMessageResponse>;
/**
 * One message of an AppendMessages batch.
 *
 * @generated from message sessions.v1.AppendItem
 */
export type AppendItem = Message<"sessions.v1.AppendItem"> & {
    /**
     * The message as JSON text.
     *
     * @generated from field: string message_json = 1;
     */
    messageJson: string;
    /**
     * Where the message attaches.
     *
     * @generated from field: sessions.v1.ParentMode parent_mode = 2;
     */
    parentMode: ParentMode;
    /**
     * The parent for PARENT_MODE_ID.
     *
     * @generated from field: string parent_id = 3;
     */
    parentId: string;
    /**
     * Who produced the message.
     *
     * @generated from field: sessions.v1.Source source = 4;
     */
    source: Source;
};
/**
 * Describes the message sessions.v1.AppendItem.
 * Use `create(AppendItemSchema)` to create a new message.
 */
export declare const AppendItemSchema: GenMessage<AppendItem>;
/**
 * Request for AppendMessages.
 *
 * @generated from message sessions.v1.AppendMessagesRequest
 */
export type AppendMessagesRequest = Message<"sessions.v1.AppendMessagesRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The messages, appended in order in one transaction.
     *
     * @generated from field: repeated sessions.v1.AppendItem items = 3;
     */
    items: AppendItem[];
};
/**
 * Describes the message sessions.v1.AppendMessagesRequest.
 * Use `create(AppendMessagesRequestSchema)` to create a new message.
 */
export declare const AppendMessagesRequestSchema: GenMessage<AppendMessagesRequest>;
/**
 * Response for AppendMessages.
 *
 * @generated from message sessions.v1.AppendMessagesResponse
 */
export type AppendMessagesResponse = Message<"sessions.v1.AppendMessagesResponse"> & {
    /**
     * One result per item, in order.
     *
     * @generated from field: repeated sessions.v1.AppendResult results = 1;
     */
    results: AppendResult[];
};
/**
 * Describes the message sessions.v1.AppendMessagesResponse.
 * Use `create(AppendMessagesResponseSchema)` to create a new message.
 */
export declare const AppendMessagesResponseSchema: GenMessage<AppendMessagesResponse>;
/**
 * Request for UpdateMessage.
 *
 * @generated from message sessions.v1.UpdateMessageRequest
 */
export type UpdateMessageRequest = Message<"sessions.v1.UpdateMessageRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The new message JSON; its `id` names the message to update.
     *
     * @generated from field: string message_json = 3;
     */
    messageJson: string;
    /**
     * Who produced the message.
     *
     * @generated from field: sessions.v1.Source source = 4;
     */
    source: Source;
};
/**
 * Describes the message sessions.v1.UpdateMessageRequest.
 * Use `create(UpdateMessageRequestSchema)` to create a new message.
 */
export declare const UpdateMessageRequestSchema: GenMessage<UpdateMessageRequest>;
/**
 * Response for UpdateMessage.
 *
 * @generated from message sessions.v1.UpdateMessageResponse
 */
export type UpdateMessageResponse = Message<"sessions.v1.UpdateMessageResponse"> & {
    /**
     * False when no message with that id exists in the session (nothing was written).
     *
     * @generated from field: bool found = 1;
     */
    found: boolean;
    /**
     * True when the stored content changed.
     *
     * @generated from field: bool changed = 2;
     */
    changed: boolean;
    /**
     * The message as prepared for storage (set when found).
     *
     * @generated from field: sessions.v1.WrittenMessage message = 3;
     */
    message?: WrittenMessage | undefined;
};
/**
 * Describes the message sessions.v1.UpdateMessageResponse.
 * Use `create(UpdateMessageResponseSchema)` to create a new message.
 */
export declare const UpdateMessageResponseSchema: GenMessage<UpdateMessageResponse>;
/**
 * Request for UpsertMessage.
 *
 * @generated from message sessions.v1.UpsertMessageRequest
 */
export type UpsertMessageRequest = Message<"sessions.v1.UpsertMessageRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The message JSON.
     *
     * @generated from field: string message_json = 3;
     */
    messageJson: string;
    /**
     * Where the message attaches when it is new (ignored for an existing id).
     *
     * @generated from field: sessions.v1.ParentMode parent_mode = 4;
     */
    parentMode: ParentMode;
    /**
     * The parent for PARENT_MODE_ID.
     *
     * @generated from field: string parent_id = 5;
     */
    parentId: string;
    /**
     * Who produced the message.
     *
     * @generated from field: sessions.v1.Source source = 6;
     */
    source: Source;
};
/**
 * Describes the message sessions.v1.UpsertMessageRequest.
 * Use `create(UpsertMessageRequestSchema)` to create a new message.
 */
export declare const UpsertMessageRequestSchema: GenMessage<UpsertMessageRequest>;
/**
 * Response for UpsertMessage.
 *
 * @generated from message sessions.v1.UpsertMessageResponse
 */
export type UpsertMessageResponse = Message<"sessions.v1.UpsertMessageResponse"> & {
    /**
     * True when the message was new and appended.
     *
     * @generated from field: bool inserted = 1;
     */
    inserted: boolean;
    /**
     * True when an existing message's content changed.
     *
     * @generated from field: bool changed = 2;
     */
    changed: boolean;
    /**
     * The stored message.
     *
     * @generated from field: sessions.v1.WrittenMessage message = 3;
     */
    message?: WrittenMessage | undefined;
};
/**
 * Describes the message sessions.v1.UpsertMessageResponse.
 * Use `create(UpsertMessageResponseSchema)` to create a new message.
 */
export declare const UpsertMessageResponseSchema: GenMessage<UpsertMessageResponse>;
/**
 * The first frame's header of an UploadMessage stream.
 *
 * @generated from message sessions.v1.UploadHeader
 */
export type UploadHeader = Message<"sessions.v1.UploadHeader"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * What to do with the message.
     *
     * @generated from field: sessions.v1.UploadOperation operation = 3;
     */
    operation: UploadOperation;
    /**
     * Where the message attaches (APPEND, UPSERT).
     *
     * @generated from field: sessions.v1.ParentMode parent_mode = 4;
     */
    parentMode: ParentMode;
    /**
     * The parent for PARENT_MODE_ID.
     *
     * @generated from field: string parent_id = 5;
     */
    parentId: string;
    /**
     * Who produced the message.
     *
     * @generated from field: sessions.v1.Source source = 6;
     */
    source: Source;
};
/**
 * Describes the message sessions.v1.UploadHeader.
 * Use `create(UploadHeaderSchema)` to create a new message.
 */
export declare const UploadHeaderSchema: GenMessage<UploadHeader>;
/**
 * One frame of an UploadMessage stream.
 *
 * @generated from message sessions.v1.UploadMessageRequest
 */
export type UploadMessageRequest = Message<"sessions.v1.UploadMessageRequest"> & {
    /**
     * Required on the first frame, absent on the others.
     *
     * @generated from field: sessions.v1.UploadHeader header = 1;
     */
    header?: UploadHeader | undefined;
    /**
     * The next piece of the message JSON.
     *
     * @generated from field: string json_piece = 2;
     */
    jsonPiece: string;
};
/**
 * Describes the message sessions.v1.UploadMessageRequest.
 * Use `create(UploadMessageRequestSchema)` to create a new message.
 */
export declare const UploadMessageRequestSchema: GenMessage<UploadMessageRequest>;
/**
 * Response for UploadMessage.
 *
 * @generated from message sessions.v1.UploadMessageResponse
 */
export type UploadMessageResponse = Message<"sessions.v1.UploadMessageResponse"> & {
    /**
     * True when a new message was appended.
     *
     * @generated from field: bool inserted = 1;
     */
    inserted: boolean;
    /**
     * For UPDATE: false when the id does not exist.
     *
     * @generated from field: bool found = 2;
     */
    found: boolean;
    /**
     * True when an existing message's content changed.
     *
     * @generated from field: bool changed = 3;
     */
    changed: boolean;
    /**
     * The stored message.
     *
     * @generated from field: sessions.v1.WrittenMessage message = 4;
     */
    message?: WrittenMessage | undefined;
};
/**
 * Describes the message sessions.v1.UploadMessageResponse.
 * Use `create(UploadMessageResponseSchema)` to create a new message.
 */
export declare const UploadMessageResponseSchema: GenMessage<UploadMessageResponse>;
/**
 * Request for DeleteMessages.
 *
 * @generated from message sessions.v1.DeleteMessagesRequest
 */
export type DeleteMessagesRequest = Message<"sessions.v1.DeleteMessagesRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The ids to delete; unknown ids are ignored.
     *
     * @generated from field: repeated string message_ids = 3;
     */
    messageIds: string[];
};
/**
 * Describes the message sessions.v1.DeleteMessagesRequest.
 * Use `create(DeleteMessagesRequestSchema)` to create a new message.
 */
export declare const DeleteMessagesRequestSchema: GenMessage<DeleteMessagesRequest>;
/**
 * Response for DeleteMessages.
 *
 * @generated from message sessions.v1.DeleteMessagesResponse
 */
export type DeleteMessagesResponse = Message<"sessions.v1.DeleteMessagesResponse"> & {
    /**
     * How many messages were deleted.
     *
     * @generated from field: int64 deleted_count = 1;
     */
    deletedCount: bigint;
};
/**
 * Describes the message sessions.v1.DeleteMessagesResponse.
 * Use `create(DeleteMessagesResponseSchema)` to create a new message.
 */
export declare const DeleteMessagesResponseSchema: GenMessage<DeleteMessagesResponse>;
/**
 * Request for ClearMessages.
 *
 * @generated from message sessions.v1.ClearMessagesRequest
 */
export type ClearMessagesRequest = Message<"sessions.v1.ClearMessagesRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
};
/**
 * Describes the message sessions.v1.ClearMessagesRequest.
 * Use `create(ClearMessagesRequestSchema)` to create a new message.
 */
export declare const ClearMessagesRequestSchema: GenMessage<ClearMessagesRequest>;
/**
 * Response for ClearMessages.
 *
 * @generated from message sessions.v1.ClearMessagesResponse
 */
export type ClearMessagesResponse = Message<"sessions.v1.ClearMessagesResponse"> & {
    /**
     * How many messages were deleted.
     *
     * @generated from field: int64 deleted_count = 1;
     */
    deletedCount: bigint;
};
/**
 * Describes the message sessions.v1.ClearMessagesResponse.
 * Use `create(ClearMessagesResponseSchema)` to create a new message.
 */
export declare const ClearMessagesResponseSchema: GenMessage<ClearMessagesResponse>;
/**
 * One frame of an ImportMessages stream.
 *
 * @generated from message sessions.v1.ImportMessagesRequest
 */
export type ImportMessagesRequest = Message<"sessions.v1.ImportMessagesRequest"> & {
    /**
     * The object key; required on the first frame, and equal to it when repeated.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id; read from the first frame.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The next piece of the current message's JSON (a whole message when small).
     *
     * @generated from field: string json_piece = 3;
     */
    jsonPiece: string;
    /**
     * True when further pieces of the current message follow.
     *
     * @generated from field: bool more_pieces = 4;
     */
    morePieces: boolean;
    /**
     * The parent id, stored exactly as given (not validated); unset for a root. Read from the
     * first frame of each message.
     *
     * @generated from field: optional string parent_id = 5;
     */
    parentId?: string | undefined;
    /**
     * The created time to store, Unix milliseconds. Read from the first frame of each message.
     *
     * @generated from field: int64 created_at_ms = 6;
     */
    createdAtMs: bigint;
};
/**
 * Describes the message sessions.v1.ImportMessagesRequest.
 * Use `create(ImportMessagesRequestSchema)` to create a new message.
 */
export declare const ImportMessagesRequestSchema: GenMessage<ImportMessagesRequest>;
/**
 * Response for ImportMessages.
 *
 * @generated from message sessions.v1.ImportMessagesResponse
 */
export type ImportMessagesResponse = Message<"sessions.v1.ImportMessagesResponse"> & {
    /**
     * Messages written.
     *
     * @generated from field: int64 imported_count = 1;
     */
    importedCount: bigint;
    /**
     * Messages skipped because their id already existed.
     *
     * @generated from field: int64 skipped_count = 2;
     */
    skippedCount: bigint;
};
/**
 * Describes the message sessions.v1.ImportMessagesResponse.
 * Use `create(ImportMessagesResponseSchema)` to create a new message.
 */
export declare const ImportMessagesResponseSchema: GenMessage<ImportMessagesResponse>;
/**
 * Request for GetMessage.
 *
 * @generated from message sessions.v1.GetMessageRequest
 */
export type GetMessageRequest = Message<"sessions.v1.GetMessageRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The message id.
     *
     * @generated from field: string message_id = 3;
     */
    messageId: string;
    /**
     * How attachment payloads are returned.
     *
     * @generated from field: sessions.v1.AttachmentMode attachments = 4;
     */
    attachments: AttachmentMode;
};
/**
 * Describes the message sessions.v1.GetMessageRequest.
 * Use `create(GetMessageRequestSchema)` to create a new message.
 */
export declare const GetMessageRequestSchema: GenMessage<GetMessageRequest>;
/**
 * Response frame for GetMessage.
 *
 * @generated from message sessions.v1.GetMessageResponse
 */
export type GetMessageResponse = Message<"sessions.v1.GetMessageResponse"> & {
    /**
     * The message, or a piece of it.
     *
     * @generated from field: sessions.v1.MessageFrame frame = 1;
     */
    frame?: MessageFrame | undefined;
};
/**
 * Describes the message sessions.v1.GetMessageResponse.
 * Use `create(GetMessageResponseSchema)` to create a new message.
 */
export declare const GetMessageResponseSchema: GenMessage<GetMessageResponse>;
/**
 * Request for GetMessages.
 *
 * @generated from message sessions.v1.GetMessagesRequest
 */
export type GetMessagesRequest = Message<"sessions.v1.GetMessagesRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The message ids.
     *
     * @generated from field: repeated string message_ids = 3;
     */
    messageIds: string[];
    /**
     * How attachment payloads are returned.
     *
     * @generated from field: sessions.v1.AttachmentMode attachments = 4;
     */
    attachments: AttachmentMode;
};
/**
 * Describes the message sessions.v1.GetMessagesRequest.
 * Use `create(GetMessagesRequestSchema)` to create a new message.
 */
export declare const GetMessagesRequestSchema: GenMessage<GetMessagesRequest>;
/**
 * Response frame for GetMessages.
 *
 * @generated from message sessions.v1.GetMessagesResponse
 */
export type GetMessagesResponse = Message<"sessions.v1.GetMessagesResponse"> & {
    /**
     * A message, or a piece of one.
     *
     * @generated from field: sessions.v1.MessageFrame frame = 1;
     */
    frame?: MessageFrame | undefined;
};
/**
 * Describes the message sessions.v1.GetMessagesResponse.
 * Use `create(GetMessagesResponseSchema)` to create a new message.
 */
export declare const GetMessagesResponseSchema: GenMessage<GetMessagesResponse>;
/**
 * Request for GetLatestLeaf.
 *
 * @generated from message sessions.v1.GetLatestLeafRequest
 */
export type GetLatestLeafRequest = Message<"sessions.v1.GetLatestLeafRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * How attachment payloads are returned.
     *
     * @generated from field: sessions.v1.AttachmentMode attachments = 3;
     */
    attachments: AttachmentMode;
};
/**
 * Describes the message sessions.v1.GetLatestLeafRequest.
 * Use `create(GetLatestLeafRequestSchema)` to create a new message.
 */
export declare const GetLatestLeafRequestSchema: GenMessage<GetLatestLeafRequest>;
/**
 * Response frame for GetLatestLeaf.
 *
 * @generated from message sessions.v1.GetLatestLeafResponse
 */
export type GetLatestLeafResponse = Message<"sessions.v1.GetLatestLeafResponse"> & {
    /**
     * The leaf message, or a piece of it.
     *
     * @generated from field: sessions.v1.MessageFrame frame = 1;
     */
    frame?: MessageFrame | undefined;
};
/**
 * Describes the message sessions.v1.GetLatestLeafResponse.
 * Use `create(GetLatestLeafResponseSchema)` to create a new message.
 */
export declare const GetLatestLeafResponseSchema: GenMessage<GetLatestLeafResponse>;
/**
 * Request for GetBranches.
 *
 * @generated from message sessions.v1.GetBranchesRequest
 */
export type GetBranchesRequest = Message<"sessions.v1.GetBranchesRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The parent whose children to read.
     *
     * @generated from field: string message_id = 3;
     */
    messageId: string;
    /**
     * How attachment payloads are returned.
     *
     * @generated from field: sessions.v1.AttachmentMode attachments = 4;
     */
    attachments: AttachmentMode;
};
/**
 * Describes the message sessions.v1.GetBranchesRequest.
 * Use `create(GetBranchesRequestSchema)` to create a new message.
 */
export declare const GetBranchesRequestSchema: GenMessage<GetBranchesRequest>;
/**
 * Response frame for GetBranches.
 *
 * @generated from message sessions.v1.GetBranchesResponse
 */
export type GetBranchesResponse = Message<"sessions.v1.GetBranchesResponse"> & {
    /**
     * A child message, or a piece of one.
     *
     * @generated from field: sessions.v1.MessageFrame frame = 1;
     */
    frame?: MessageFrame | undefined;
};
/**
 * Describes the message sessions.v1.GetBranchesResponse.
 * Use `create(GetBranchesResponseSchema)` to create a new message.
 */
export declare const GetBranchesResponseSchema: GenMessage<GetBranchesResponse>;
/**
 * Request for StreamHistory.
 *
 * @generated from message sessions.v1.StreamHistoryRequest
 */
export type StreamHistoryRequest = Message<"sessions.v1.StreamHistoryRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The leaf whose path to read; empty means the active leaf. An unknown id reads nothing.
     *
     * @generated from field: string leaf_id = 3;
     */
    leafId: string;
    /**
     * Read from the leaf towards the root. Its cost grows with what is read, not with the
     * transcript, so stop early when looking for something recent.
     *
     * @generated from field: bool newest_first = 4;
     */
    newestFirst: boolean;
    /**
     * When set, mark batch ends after at most this many messages (0: unbatched, or 50 when
     * only max_batch_bytes is set).
     *
     * @generated from field: uint32 batch_size = 5;
     */
    batchSize: number;
    /**
     * When set, mark batch ends before the batch's JSON bytes would exceed this (a larger
     * message forms a batch alone; 0: 4 MiB when batch_size is set).
     *
     * @generated from field: uint64 max_batch_bytes = 6;
     */
    maxBatchBytes: bigint;
    /**
     * How attachment payloads are returned.
     *
     * @generated from field: sessions.v1.AttachmentMode attachments = 7;
     */
    attachments: AttachmentMode;
};
/**
 * Describes the message sessions.v1.StreamHistoryRequest.
 * Use `create(StreamHistoryRequestSchema)` to create a new message.
 */
export declare const StreamHistoryRequestSchema: GenMessage<StreamHistoryRequest>;
/**
 * Response frame for StreamHistory.
 *
 * @generated from message sessions.v1.StreamHistoryResponse
 */
export type StreamHistoryResponse = Message<"sessions.v1.StreamHistoryResponse"> & {
    /**
     * A message, or a piece of one.
     *
     * @generated from field: sessions.v1.MessageFrame frame = 1;
     */
    frame?: MessageFrame | undefined;
    /**
     * True on the last frame of a batch (batched reads only).
     *
     * @generated from field: bool batch_end = 2;
     */
    batchEnd: boolean;
};
/**
 * Describes the message sessions.v1.StreamHistoryResponse.
 * Use `create(StreamHistoryResponseSchema)` to create a new message.
 */
export declare const StreamHistoryResponseSchema: GenMessage<StreamHistoryResponse>;
/**
 * Request for GetRecentHistory.
 *
 * @generated from message sessions.v1.GetRecentHistoryRequest
 */
export type GetRecentHistoryRequest = Message<"sessions.v1.GetRecentHistoryRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The byte budget, counted in stored bytes (message row plus continuation rows).
     *
     * @generated from field: int64 max_content_bytes = 3;
     */
    maxContentBytes: bigint;
    /**
     * The leaf whose path to read; empty means the active leaf.
     *
     * @generated from field: string leaf_id = 4;
     */
    leafId: string;
    /**
     * How attachment payloads are returned.
     *
     * @generated from field: sessions.v1.AttachmentMode attachments = 5;
     */
    attachments: AttachmentMode;
};
/**
 * Describes the message sessions.v1.GetRecentHistoryRequest.
 * Use `create(GetRecentHistoryRequestSchema)` to create a new message.
 */
export declare const GetRecentHistoryRequestSchema: GenMessage<GetRecentHistoryRequest>;
/**
 * Summary of a recent-history read.
 *
 * @generated from message sessions.v1.RecentHistorySummary
 */
export type RecentHistorySummary = Message<"sessions.v1.RecentHistorySummary"> & {
    /**
     * True when older messages on the path were left out.
     *
     * @generated from field: bool truncated = 1;
     */
    truncated: boolean;
    /**
     * Stored bytes of the whole path.
     *
     * @generated from field: int64 total_content_bytes = 2;
     */
    totalContentBytes: bigint;
};
/**
 * Describes the message sessions.v1.RecentHistorySummary.
 * Use `create(RecentHistorySummarySchema)` to create a new message.
 */
export declare const RecentHistorySummarySchema: GenMessage<RecentHistorySummary>;
/**
 * Response frame for GetRecentHistory.
 *
 * @generated from message sessions.v1.GetRecentHistoryResponse
 */
export type GetRecentHistoryResponse = Message<"sessions.v1.GetRecentHistoryResponse"> & {
    /**
     * Set on the first response only.
     *
     * @generated from field: sessions.v1.RecentHistorySummary summary = 1;
     */
    summary?: RecentHistorySummary | undefined;
    /**
     * A message, or a piece of one.
     *
     * @generated from field: sessions.v1.MessageFrame frame = 2;
     */
    frame?: MessageFrame | undefined;
};
/**
 * Describes the message sessions.v1.GetRecentHistoryResponse.
 * Use `create(GetRecentHistoryResponseSchema)` to create a new message.
 */
export declare const GetRecentHistoryResponseSchema: GenMessage<GetRecentHistoryResponse>;
/**
 * Request for GetHistoryRowStats.
 *
 * @generated from message sessions.v1.GetHistoryRowStatsRequest
 */
export type GetHistoryRowStatsRequest = Message<"sessions.v1.GetHistoryRowStatsRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The leaf whose path to read; empty means the active leaf.
     *
     * @generated from field: string leaf_id = 3;
     */
    leafId: string;
};
/**
 * Describes the message sessions.v1.GetHistoryRowStatsRequest.
 * Use `create(GetHistoryRowStatsRequestSchema)` to create a new message.
 */
export declare const GetHistoryRowStatsRequestSchema: GenMessage<GetHistoryRowStatsRequest>;
/**
 * Stored size and token estimate of one message on a path.
 *
 * @generated from message sessions.v1.RowStat
 */
export type RowStat = Message<"sessions.v1.RowStat"> & {
    /**
     * The message id.
     *
     * @generated from field: string id = 1;
     */
    id: string;
    /**
     * The message role.
     *
     * @generated from field: string role = 2;
     */
    role: string;
    /**
     * Stored bytes: the message row plus its continuation rows.
     *
     * @generated from field: int64 bytes = 3;
     */
    bytes: bigint;
    /**
     * The token estimate stamped when the row was written.
     *
     * @generated from field: int64 token_estimate = 4;
     */
    tokenEstimate: bigint;
};
/**
 * Describes the message sessions.v1.RowStat.
 * Use `create(RowStatSchema)` to create a new message.
 */
export declare const RowStatSchema: GenMessage<RowStat>;
/**
 * Response frame for GetHistoryRowStats.
 *
 * @generated from message sessions.v1.GetHistoryRowStatsResponse
 */
export type GetHistoryRowStatsResponse = Message<"sessions.v1.GetHistoryRowStatsResponse"> & {
    /**
     * The next stats along the path, root first.
     *
     * @generated from field: repeated sessions.v1.RowStat stats = 1;
     */
    stats: RowStat[];
};
/**
 * Describes the message sessions.v1.GetHistoryRowStatsResponse.
 * Use `create(GetHistoryRowStatsResponseSchema)` to create a new message.
 */
export declare const GetHistoryRowStatsResponseSchema: GenMessage<GetHistoryRowStatsResponse>;
/**
 * Request for ReadAttachment.
 *
 * @generated from message sessions.v1.ReadAttachmentRequest
 */
export type ReadAttachmentRequest = Message<"sessions.v1.ReadAttachmentRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The lowercase hex SHA-256 of the payload (the part after `attachment:sha256:`).
     *
     * @generated from field: string hash = 2;
     */
    hash: string;
};
/**
 * Describes the message sessions.v1.ReadAttachmentRequest.
 * Use `create(ReadAttachmentRequestSchema)` to create a new message.
 */
export declare const ReadAttachmentRequestSchema: GenMessage<ReadAttachmentRequest>;
/**
 * Response frame for ReadAttachment.
 *
 * @generated from message sessions.v1.ReadAttachmentResponse
 */
export type ReadAttachmentResponse = Message<"sessions.v1.ReadAttachmentResponse"> & {
    /**
     * The payload's media type (first frame only).
     *
     * @generated from field: string media_type = 1;
     */
    mediaType: string;
    /**
     * The payload's size in bytes (first frame only).
     *
     * @generated from field: int64 size_bytes = 2;
     */
    sizeBytes: bigint;
    /**
     * The next bytes of the payload.
     *
     * @generated from field: bytes data = 3;
     */
    data: Uint8Array;
};
/**
 * Describes the message sessions.v1.ReadAttachmentResponse.
 * Use `create(ReadAttachmentResponseSchema)` to create a new message.
 */
export declare const ReadAttachmentResponseSchema: GenMessage<ReadAttachmentResponse>;
/**
 * A stored compaction record.
 *
 * @generated from message sessions.v1.Compaction
 */
export type Compaction = Message<"sessions.v1.Compaction"> & {
    /**
     * The record id (a UUID); its overlay message id is `compaction_<id>`.
     *
     * @generated from field: string id = 1;
     */
    id: string;
    /**
     * Per-session order of records.
     *
     * @generated from field: int64 seq = 2;
     */
    seq: bigint;
    /**
     * The summary text.
     *
     * @generated from field: string summary = 3;
     */
    summary: string;
    /**
     * First message of the replaced span.
     *
     * @generated from field: string from_message_id = 4;
     */
    fromMessageId: string;
    /**
     * Last message of the replaced span.
     *
     * @generated from field: string to_message_id = 5;
     */
    toMessageId: string;
    /**
     * When it was stored, Unix milliseconds.
     *
     * @generated from field: int64 created_at_ms = 6;
     */
    createdAtMs: bigint;
};
/**
 * Describes the message sessions.v1.Compaction.
 * Use `create(CompactionSchema)` to create a new message.
 */
export declare const CompactionSchema: GenMessage<Compaction>;
/**
 * Request for AddCompaction.
 *
 * @generated from message sessions.v1.AddCompactionRequest
 */
export type AddCompactionRequest = Message<"sessions.v1.AddCompactionRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The summary text.
     *
     * @generated from field: string summary = 3;
     */
    summary: string;
    /**
     * First message of the span (not validated, as upstream).
     *
     * @generated from field: string from_message_id = 4;
     */
    fromMessageId: string;
    /**
     * Last message of the span (not validated, as upstream).
     *
     * @generated from field: string to_message_id = 5;
     */
    toMessageId: string;
};
/**
 * Describes the message sessions.v1.AddCompactionRequest.
 * Use `create(AddCompactionRequestSchema)` to create a new message.
 */
export declare const AddCompactionRequestSchema: GenMessage<AddCompactionRequest>;
/**
 * Response for AddCompaction.
 *
 * @generated from message sessions.v1.AddCompactionResponse
 */
export type AddCompactionResponse = Message<"sessions.v1.AddCompactionResponse"> & {
    /**
     * The stored record.
     *
     * @generated from field: sessions.v1.Compaction compaction = 1;
     */
    compaction?: Compaction | undefined;
};
/**
 * Describes the message sessions.v1.AddCompactionResponse.
 * Use `create(AddCompactionResponseSchema)` to create a new message.
 */
export declare const AddCompactionResponseSchema: GenMessage<AddCompactionResponse>;
/**
 * Request for ListCompactions.
 *
 * @generated from message sessions.v1.ListCompactionsRequest
 */
export type ListCompactionsRequest = Message<"sessions.v1.ListCompactionsRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
};
/**
 * Describes the message sessions.v1.ListCompactionsRequest.
 * Use `create(ListCompactionsRequestSchema)` to create a new message.
 */
export declare const ListCompactionsRequestSchema: GenMessage<ListCompactionsRequest>;
/**
 * Response for ListCompactions.
 *
 * @generated from message sessions.v1.ListCompactionsResponse
 */
export type ListCompactionsResponse = Message<"sessions.v1.ListCompactionsResponse"> & {
    /**
     * Every record, oldest first.
     *
     * @generated from field: repeated sessions.v1.Compaction compactions = 1;
     */
    compactions: Compaction[];
};
/**
 * Describes the message sessions.v1.ListCompactionsResponse.
 * Use `create(ListCompactionsResponseSchema)` to create a new message.
 */
export declare const ListCompactionsResponseSchema: GenMessage<ListCompactionsResponse>;
/**
 * Request for PlanCompaction.
 *
 * @generated from message sessions.v1.PlanCompactionRequest
 */
export type PlanCompactionRequest = Message<"sessions.v1.PlanCompactionRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The leaf whose path to plan; empty means the active leaf.
     *
     * @generated from field: string leaf_id = 3;
     */
    leafId: string;
    /**
     * Token budget of the recent tail kept verbatim (0: 20,000).
     *
     * @generated from field: int64 keep_recent_tokens = 4;
     */
    keepRecentTokens: bigint;
};
/**
 * Describes the message sessions.v1.PlanCompactionRequest.
 * Use `create(PlanCompactionRequestSchema)` to create a new message.
 */
export declare const PlanCompactionRequestSchema: GenMessage<PlanCompactionRequest>;
/**
 * Response for PlanCompaction.
 *
 * @generated from message sessions.v1.PlanCompactionResponse
 */
export type PlanCompactionResponse = Message<"sessions.v1.PlanCompactionResponse"> & {
    /**
     * False when there is nothing to compact (too few messages, or an empty middle).
     *
     * @generated from field: bool planned = 1;
     */
    planned: boolean;
    /**
     * The first message the summary replaces (after the iterative-compaction extension).
     *
     * @generated from field: string from_message_id = 2;
     */
    fromMessageId: string;
    /**
     * The last message the summary replaces.
     *
     * @generated from field: string to_message_id = 3;
     */
    toMessageId: string;
    /**
     * The prompt for the summarizer.
     *
     * @generated from field: string prompt = 4;
     */
    prompt: string;
    /**
     * The summary length target given in the prompt, in tokens.
     *
     * @generated from field: int64 budget_tokens = 5;
     */
    budgetTokens: bigint;
};
/**
 * Describes the message sessions.v1.PlanCompactionResponse.
 * Use `create(PlanCompactionResponseSchema)` to create a new message.
 */
export declare const PlanCompactionResponseSchema: GenMessage<PlanCompactionResponse>;
/**
 * Request for Compact.
 *
 * @generated from message sessions.v1.CompactRequest
 */
export type CompactRequest = Message<"sessions.v1.CompactRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The leaf whose path to compact; empty means the active leaf.
     *
     * @generated from field: string leaf_id = 3;
     */
    leafId: string;
};
/**
 * Describes the message sessions.v1.CompactRequest.
 * Use `create(CompactRequestSchema)` to create a new message.
 */
export declare const CompactRequestSchema: GenMessage<CompactRequest>;
/**
 * Response for Compact.
 *
 * @generated from message sessions.v1.CompactResponse
 */
export type CompactResponse = Message<"sessions.v1.CompactResponse"> & {
    /**
     * False when there was nothing to compact or the summary was empty.
     *
     * @generated from field: bool compacted = 1;
     */
    compacted: boolean;
    /**
     * The stored record when compacted.
     *
     * @generated from field: sessions.v1.Compaction compaction = 2;
     */
    compaction?: Compaction | undefined;
};
/**
 * Describes the message sessions.v1.CompactResponse.
 * Use `create(CompactResponseSchema)` to create a new message.
 */
export declare const CompactResponseSchema: GenMessage<CompactResponse>;
/**
 * A session's automatic compaction policy.
 *
 * @generated from message sessions.v1.CompactionPolicy
 */
export type CompactionPolicy = Message<"sessions.v1.CompactionPolicy"> & {
    /**
     * Compact after an inserted append when the session's token estimate exceeds this
     * (strictly); 0 disables automatic compaction.
     *
     * @generated from field: int64 threshold_tokens = 1;
     */
    thresholdTokens: bigint;
    /**
     * Token budget of the recent tail kept verbatim (0: 20,000).
     *
     * @generated from field: int64 keep_recent_tokens = 2;
     */
    keepRecentTokens: bigint;
};
/**
 * Describes the message sessions.v1.CompactionPolicy.
 * Use `create(CompactionPolicySchema)` to create a new message.
 */
export declare const CompactionPolicySchema: GenMessage<CompactionPolicy>;
/**
 * Request for SetCompactionPolicy.
 *
 * @generated from message sessions.v1.SetCompactionPolicyRequest
 */
export type SetCompactionPolicyRequest = Message<"sessions.v1.SetCompactionPolicyRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The policy to store.
     *
     * @generated from field: sessions.v1.CompactionPolicy policy = 3;
     */
    policy?: CompactionPolicy | undefined;
};
/**
 * Describes the message sessions.v1.SetCompactionPolicyRequest.
 * Use `create(SetCompactionPolicyRequestSchema)` to create a new message.
 */
export declare const SetCompactionPolicyRequestSchema: GenMessage<SetCompactionPolicyRequest>;
/**
 * Response for SetCompactionPolicy.
 *
 * @generated from message sessions.v1.SetCompactionPolicyResponse
 */
export type SetCompactionPolicyResponse = Message<"sessions.v1.SetCompactionPolicyResponse"> & {
    /**
     * The stored policy.
     *
     * @generated from field: sessions.v1.CompactionPolicy policy = 1;
     */
    policy?: CompactionPolicy | undefined;
};
/**
 * Describes the message sessions.v1.SetCompactionPolicyResponse.
 * Use `create(SetCompactionPolicyResponseSchema)` to create a new message.
 */
export declare const SetCompactionPolicyResponseSchema: GenMessage<SetCompactionPolicyResponse>;
/**
 * Request for GetCompactionPolicy.
 *
 * @generated from message sessions.v1.GetCompactionPolicyRequest
 */
export type GetCompactionPolicyRequest = Message<"sessions.v1.GetCompactionPolicyRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id.
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
};
/**
 * Describes the message sessions.v1.GetCompactionPolicyRequest.
 * Use `create(GetCompactionPolicyRequestSchema)` to create a new message.
 */
export declare const GetCompactionPolicyRequestSchema: GenMessage<GetCompactionPolicyRequest>;
/**
 * Response for GetCompactionPolicy.
 *
 * @generated from message sessions.v1.GetCompactionPolicyResponse
 */
export type GetCompactionPolicyResponse = Message<"sessions.v1.GetCompactionPolicyResponse"> & {
    /**
     * The stored policy (all zero when none was set).
     *
     * @generated from field: sessions.v1.CompactionPolicy policy = 1;
     */
    policy?: CompactionPolicy | undefined;
};
/**
 * Describes the message sessions.v1.GetCompactionPolicyResponse.
 * Use `create(GetCompactionPolicyResponseSchema)` to create a new message.
 */
export declare const GetCompactionPolicyResponseSchema: GenMessage<GetCompactionPolicyResponse>;
/**
 * Request for SearchMessages.
 *
 * @generated from message sessions.v1.SearchMessagesRequest
 */
export type SearchMessagesRequest = Message<"sessions.v1.SearchMessagesRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * The session id (ignored when all_sessions is set).
     *
     * @generated from field: string session_id = 2;
     */
    sessionId: string;
    /**
     * The query text; FTS operators are treated as literal text.
     *
     * @generated from field: string query = 3;
     */
    query: string;
    /**
     * Maximum results (0: 20; capped by the server).
     *
     * @generated from field: int32 limit = 4;
     */
    limit: number;
    /**
     * How the query matches.
     *
     * @generated from field: sessions.v1.SearchMode mode = 5;
     */
    mode: SearchMode;
    /**
     * Search every session of the object.
     *
     * @generated from field: bool all_sessions = 6;
     */
    allSessions: boolean;
};
/**
 * Describes the message sessions.v1.SearchMessagesRequest.
 * Use `create(SearchMessagesRequestSchema)` to create a new message.
 */
export declare const SearchMessagesRequestSchema: GenMessage<SearchMessagesRequest>;
/**
 * Response frame for SearchMessages: one hit, or one piece of a hit's text.
 *
 * @generated from message sessions.v1.SearchMessagesResponse
 */
export type SearchMessagesResponse = Message<"sessions.v1.SearchMessagesResponse"> & {
    /**
     * The matching message id (first piece of a hit).
     *
     * @generated from field: string id = 1;
     */
    id: string;
    /**
     * The message role (first piece of a hit).
     *
     * @generated from field: string role = 2;
     */
    role: string;
    /**
     * The message's session (first piece of a hit).
     *
     * @generated from field: string session_id = 3;
     */
    sessionId: string;
    /**
     * The indexed text, or the next piece of it.
     *
     * @generated from field: string content = 4;
     */
    content: string;
    /**
     * True when further pieces of this hit's text follow.
     *
     * @generated from field: bool more_pieces = 5;
     */
    morePieces: boolean;
};
/**
 * Describes the message sessions.v1.SearchMessagesResponse.
 * Use `create(SearchMessagesResponseSchema)` to create a new message.
 */
export declare const SearchMessagesResponseSchema: GenMessage<SearchMessagesResponse>;
/**
 * Request for Subscribe.
 *
 * @generated from message sessions.v1.SubscribeRequest
 */
export type SubscribeRequest = Message<"sessions.v1.SubscribeRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * Only events of this session (unset: every session).
     *
     * @generated from field: optional string session_id = 2;
     */
    sessionId?: string | undefined;
    /**
     * Resume after this revision (0: start live, from the next event).
     *
     * @generated from field: uint64 resume_after_revision = 3;
     */
    resumeAfterRevision: bigint;
    /**
     * How attachment payloads in messages are returned.
     *
     * @generated from field: sessions.v1.AttachmentMode attachments = 4;
     */
    attachments: AttachmentMode;
};
/**
 * Describes the message sessions.v1.SubscribeRequest.
 * Use `create(SubscribeRequestSchema)` to create a new message.
 */
export declare const SubscribeRequestSchema: GenMessage<SubscribeRequest>;
/**
 * One change event, or one piece of an event's message.
 *
 * @generated from message sessions.v1.SubscribeResponse
 */
export type SubscribeResponse = Message<"sessions.v1.SubscribeResponse"> & {
    /**
     * The object-wide revision of the event; increases with every event.
     *
     * @generated from field: uint64 revision = 1;
     */
    revision: bigint;
    /**
     * The kind of event.
     *
     * @generated from field: sessions.v1.ChangeType type = 2;
     */
    type: ChangeType;
    /**
     * The session the event belongs to.
     *
     * @generated from field: string session_id = 3;
     */
    sessionId: string;
    /**
     * The message of an APPEND, UPDATE or IMPORT event (in pieces when large).
     *
     * @generated from field: sessions.v1.MessageFrame message = 4;
     */
    message?: MessageFrame | undefined;
    /**
     * APPEND: whether a new row was written.
     *
     * @generated from field: bool inserted = 5;
     */
    inserted: boolean;
    /**
     * APPEND: the parent option as the caller passed it; IMPORT: the parent stored.
     *
     * @generated from field: sessions.v1.ParentMode parent_mode = 6;
     */
    parentMode: ParentMode;
    /**
     * The parent id that goes with parent_mode.
     *
     * @generated from field: string parent_id = 7;
     */
    parentId: string;
    /**
     * DELETE: the ids the caller passed.
     *
     * @generated from field: repeated string message_ids = 8;
     */
    messageIds: string[];
    /**
     * COMPACTION: the stored record.
     *
     * @generated from field: sessions.v1.Compaction compaction = 9;
     */
    compaction?: Compaction | undefined;
    /**
     * COMPACTION_ERROR: what failed; RESET: why events were missed.
     *
     * @generated from field: string error = 10;
     */
    error: string;
};
/**
 * Describes the message sessions.v1.SubscribeResponse.
 * Use `create(SubscribeResponseSchema)` to create a new message.
 */
export declare const SubscribeResponseSchema: GenMessage<SubscribeResponse>;
/**
 * Request for ListSessions.
 *
 * @generated from message sessions.v1.ListSessionsRequest
 */
export type ListSessionsRequest = Message<"sessions.v1.ListSessionsRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
};
/**
 * Describes the message sessions.v1.ListSessionsRequest.
 * Use `create(ListSessionsRequestSchema)` to create a new message.
 */
export declare const ListSessionsRequestSchema: GenMessage<ListSessionsRequest>;
/**
 * A session of an object.
 *
 * @generated from message sessions.v1.SessionSummary
 */
export type SessionSummary = Message<"sessions.v1.SessionSummary"> & {
    /**
     * The session id.
     *
     * @generated from field: string session_id = 1;
     */
    sessionId: string;
    /**
     * Its message rows.
     *
     * @generated from field: int64 message_count = 2;
     */
    messageCount: bigint;
};
/**
 * Describes the message sessions.v1.SessionSummary.
 * Use `create(SessionSummarySchema)` to create a new message.
 */
export declare const SessionSummarySchema: GenMessage<SessionSummary>;
/**
 * Response for ListSessions.
 *
 * @generated from message sessions.v1.ListSessionsResponse
 */
export type ListSessionsResponse = Message<"sessions.v1.ListSessionsResponse"> & {
    /**
     * The sessions that hold messages or compactions.
     *
     * @generated from field: repeated sessions.v1.SessionSummary sessions = 1;
     */
    sessions: SessionSummary[];
};
/**
 * Describes the message sessions.v1.ListSessionsResponse.
 * Use `create(ListSessionsResponseSchema)` to create a new message.
 */
export declare const ListSessionsResponseSchema: GenMessage<ListSessionsResponse>;
/**
 * Request for GetObjectStats.
 *
 * @generated from message sessions.v1.GetObjectStatsRequest
 */
export type GetObjectStatsRequest = Message<"sessions.v1.GetObjectStatsRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
};
/**
 * Describes the message sessions.v1.GetObjectStatsRequest.
 * Use `create(GetObjectStatsRequestSchema)` to create a new message.
 */
export declare const GetObjectStatsRequestSchema: GenMessage<GetObjectStatsRequest>;
/**
 * Response for GetObjectStats.
 *
 * @generated from message sessions.v1.GetObjectStatsResponse
 */
export type GetObjectStatsResponse = Message<"sessions.v1.GetObjectStatsResponse"> & {
    /**
     * Size of the object's database file and WAL, bytes.
     *
     * @generated from field: int64 file_bytes = 1;
     */
    fileBytes: bigint;
    /**
     * Message rows (all sessions).
     *
     * @generated from field: int64 message_rows = 2;
     */
    messageRows: bigint;
    /**
     * Continuation rows of large messages.
     *
     * @generated from field: int64 continuation_rows = 3;
     */
    continuationRows: bigint;
    /**
     * Distinct attachment payloads.
     *
     * @generated from field: int64 attachment_count = 4;
     */
    attachmentCount: bigint;
    /**
     * Bytes of attachment payloads.
     *
     * @generated from field: int64 attachment_bytes = 5;
     */
    attachmentBytes: bigint;
    /**
     * Rows written since the object was created by this service, counted as upstream bills
     * them (message rows, continuation rows, attachment chunks, metadata and references).
     *
     * @generated from field: int64 row_writes = 6;
     */
    rowWrites: bigint;
    /**
     * Sessions holding messages.
     *
     * @generated from field: int64 session_count = 7;
     */
    sessionCount: bigint;
};
/**
 * Describes the message sessions.v1.GetObjectStatsResponse.
 * Use `create(GetObjectStatsResponseSchema)` to create a new message.
 */
export declare const GetObjectStatsResponseSchema: GenMessage<GetObjectStatsResponse>;
/**
 * Request for ListObjects.
 *
 * @generated from message sessions.v1.ListObjectsRequest
 */
export type ListObjectsRequest = Message<"sessions.v1.ListObjectsRequest"> & {
    /**
     * Keys per page (0: 100; at most 1,000).
     *
     * @generated from field: int32 page_size = 1;
     */
    pageSize: number;
    /**
     * The next_page_token of the previous page; empty for the first.
     *
     * @generated from field: string page_token = 2;
     */
    pageToken: string;
};
/**
 * Describes the message sessions.v1.ListObjectsRequest.
 * Use `create(ListObjectsRequestSchema)` to create a new message.
 */
export declare const ListObjectsRequestSchema: GenMessage<ListObjectsRequest>;
/**
 * Response for ListObjects.
 *
 * @generated from message sessions.v1.ListObjectsResponse
 */
export type ListObjectsResponse = Message<"sessions.v1.ListObjectsResponse"> & {
    /**
     * The object keys of this page.
     *
     * @generated from field: repeated string object_keys = 1;
     */
    objectKeys: string[];
    /**
     * Pass to the next call; empty on the last page.
     *
     * @generated from field: string next_page_token = 2;
     */
    nextPageToken: string;
};
/**
 * Describes the message sessions.v1.ListObjectsResponse.
 * Use `create(ListObjectsResponseSchema)` to create a new message.
 */
export declare const ListObjectsResponseSchema: GenMessage<ListObjectsResponse>;
/**
 * Request for ExportObject.
 *
 * @generated from message sessions.v1.ExportObjectRequest
 */
export type ExportObjectRequest = Message<"sessions.v1.ExportObjectRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * Refuse writes to the object from the snapshot on (a move in progress).
     *
     * @generated from field: bool lock_for_move = 2;
     */
    lockForMove: boolean;
    /**
     * How long the move lock lasts after the export ends without a DeleteObject (0: 60 s).
     *
     * @generated from field: int32 lease_seconds = 3;
     */
    leaseSeconds: number;
};
/**
 * Describes the message sessions.v1.ExportObjectRequest.
 * Use `create(ExportObjectRequestSchema)` to create a new message.
 */
export declare const ExportObjectRequestSchema: GenMessage<ExportObjectRequest>;
/**
 * One frame of an exported object file.
 *
 * @generated from message sessions.v1.ExportObjectResponse
 */
export type ExportObjectResponse = Message<"sessions.v1.ExportObjectResponse"> & {
    /**
     * The file's size in bytes (first frame only).
     *
     * @generated from field: int64 size_bytes = 1;
     */
    sizeBytes: bigint;
    /**
     * The next bytes of the file (at most 3 MiB per frame).
     *
     * @generated from field: bytes data = 2;
     */
    data: Uint8Array;
    /**
     * The lowercase hex SHA-256 of the whole file (last frame only).
     *
     * @generated from field: string sha256 = 3;
     */
    sha256: string;
};
/**
 * Describes the message sessions.v1.ExportObjectResponse.
 * Use `create(ExportObjectResponseSchema)` to create a new message.
 */
export declare const ExportObjectResponseSchema: GenMessage<ExportObjectResponse>;
/**
 * One frame of an ImportObject stream.
 *
 * @generated from message sessions.v1.ImportObjectRequest
 */
export type ImportObjectRequest = Message<"sessions.v1.ImportObjectRequest"> & {
    /**
     * The object key (first frame only).
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * Replace an existing object with the same key (first frame only).
     *
     * @generated from field: bool replace = 2;
     */
    replace: boolean;
    /**
     * The next bytes of the file.
     *
     * @generated from field: bytes data = 3;
     */
    data: Uint8Array;
    /**
     * The lowercase hex SHA-256 of the whole file (required on the last frame).
     *
     * @generated from field: string sha256 = 4;
     */
    sha256: string;
};
/**
 * Describes the message sessions.v1.ImportObjectRequest.
 * Use `create(ImportObjectRequestSchema)` to create a new message.
 */
export declare const ImportObjectRequestSchema: GenMessage<ImportObjectRequest>;
/**
 * Response for ImportObject.
 *
 * @generated from message sessions.v1.ImportObjectResponse
 */
export type ImportObjectResponse = Message<"sessions.v1.ImportObjectResponse"> & {
    /**
     * Bytes received.
     *
     * @generated from field: int64 size_bytes = 1;
     */
    sizeBytes: bigint;
    /**
     * Message rows in the imported object.
     *
     * @generated from field: int64 message_rows = 2;
     */
    messageRows: bigint;
};
/**
 * Describes the message sessions.v1.ImportObjectResponse.
 * Use `create(ImportObjectResponseSchema)` to create a new message.
 */
export declare const ImportObjectResponseSchema: GenMessage<ImportObjectResponse>;
/**
 * Request for DeleteObject.
 *
 * @generated from message sessions.v1.DeleteObjectRequest
 */
export type DeleteObjectRequest = Message<"sessions.v1.DeleteObjectRequest"> & {
    /**
     * The object key.
     *
     * @generated from field: string object_key = 1;
     */
    objectKey: string;
    /**
     * Where the object went (e.g. the destination's address), reported to later callers.
     *
     * @generated from field: string moved_to = 2;
     */
    movedTo: string;
};
/**
 * Describes the message sessions.v1.DeleteObjectRequest.
 * Use `create(DeleteObjectRequestSchema)` to create a new message.
 */
export declare const DeleteObjectRequestSchema: GenMessage<DeleteObjectRequest>;
/**
 * Response for DeleteObject.
 *
 * @generated from message sessions.v1.DeleteObjectResponse
 */
export type DeleteObjectResponse = Message<"sessions.v1.DeleteObjectResponse"> & {
    /**
     * True when a stored object was removed.
     *
     * @generated from field: bool deleted = 1;
     */
    deleted: boolean;
};
/**
 * Describes the message sessions.v1.DeleteObjectResponse.
 * Use `create(DeleteObjectResponseSchema)` to create a new message.
 */
export declare const DeleteObjectResponseSchema: GenMessage<DeleteObjectResponse>;
/**
 * How reads return inline media that is stored as an attachment.
 *
 * @generated from enum sessions.v1.AttachmentMode
 */
export declare enum AttachmentMode {
    /**
     * Same as INLINE.
     *
     * @generated from enum value: ATTACHMENT_MODE_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Payloads are restored into the message exactly as upstream's reads restore them.
     *
     * @generated from enum value: ATTACHMENT_MODE_INLINE = 1;
     */
    INLINE = 1,
    /**
     * Payloads stay `attachment:sha256:<hex>` pointers; fetch them with ReadAttachment.
     *
     * @generated from enum value: ATTACHMENT_MODE_POINTER = 2;
     */
    POINTER = 2
}
/**
 * Describes the enum sessions.v1.AttachmentMode.
 */
export declare const AttachmentModeSchema: GenEnum<AttachmentMode>;
/**
 * Where an appended message attaches in the tree.
 *
 * @generated from enum sessions.v1.ParentMode
 */
export declare enum ParentMode {
    /**
     * AUTO, unless `parent_id` is non-empty, in which case ID.
     *
     * @generated from enum value: PARENT_MODE_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Attach to the session's newest message (a root when the session is empty).
     *
     * @generated from enum value: PARENT_MODE_AUTO = 1;
     */
    AUTO = 1,
    /**
     * Start a new root.
     *
     * @generated from enum value: PARENT_MODE_ROOT = 2;
     */
    ROOT = 2,
    /**
     * Attach to `parent_id`. An empty, unknown or other-session id makes a root, as upstream does;
     * the response's `info.parent_id` shows which parent was used.
     *
     * @generated from enum value: PARENT_MODE_ID = 3;
     */
    ID = 3
}
/**
 * Describes the enum sessions.v1.ParentMode.
 */
export declare const ParentModeSchema: GenEnum<ParentMode>;
/**
 * Who produced a message. Client input has the server's reserved metadata keys removed.
 *
 * @generated from enum sessions.v1.Source
 */
export declare enum Source {
    /**
     * Same as SERVER.
     *
     * @generated from enum value: SOURCE_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Trusted input from the application itself.
     *
     * @generated from enum value: SOURCE_SERVER = 1;
     */
    SERVER = 1,
    /**
     * Untrusted input: reserved `metadata` keys (server flag --reserved-metadata-key) are removed.
     *
     * @generated from enum value: SOURCE_CLIENT = 2;
     */
    CLIENT = 2
}
/**
 * Describes the enum sessions.v1.Source.
 */
export declare const SourceSchema: GenEnum<Source>;
/**
 * The reasons found in google.rpc.ErrorInfo.reason (without the ERROR_REASON_ prefix).
 *
 * @generated from enum sessions.v1.ErrorReason
 */
export declare enum ErrorReason {
    /**
     * Not used.
     *
     * @generated from enum value: ERROR_REASON_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * A message is not valid JSON (metadata: field, detail).
     *
     * @generated from enum value: ERROR_REASON_INVALID_JSON = 1;
     */
    INVALID_JSON = 1,
    /**
     * A JSON value is not a message: it needs a string `id`, a string `role` and an array
     * `parts` of objects with a string `type` (metadata: field, detail).
     *
     * @generated from enum value: ERROR_REASON_INVALID_MESSAGE = 2;
     */
    INVALID_MESSAGE = 2,
    /**
     * The object key is empty, too long, or holds control characters (metadata: limit_bytes).
     *
     * @generated from enum value: ERROR_REASON_INVALID_OBJECT_KEY = 3;
     */
    INVALID_OBJECT_KEY = 3,
    /**
     * Another request field is invalid (metadata: field, detail).
     *
     * @generated from enum value: ERROR_REASON_INVALID_FIELD = 4;
     */
    INVALID_FIELD = 4,
    /**
     * The x-object-key metadata differs from the request's object_key.
     *
     * @generated from enum value: ERROR_REASON_OBJECT_KEY_MISMATCH = 5;
     */
    OBJECT_KEY_MISMATCH = 5,
    /**
     * A client stream is malformed: missing header, unfinished message, mixed objects.
     *
     * @generated from enum value: ERROR_REASON_INVALID_STREAM = 6;
     */
    INVALID_STREAM = 6,
    /**
     * The server is shutting down; retry on another connection.
     *
     * @generated from enum value: ERROR_REASON_DRAINING = 7;
     */
    DRAINING = 7,
    /**
     * The storage engine failed (disk full, I/O error); nothing was written.
     *
     * @generated from enum value: ERROR_REASON_STORAGE_FAILURE = 8;
     */
    STORAGE_FAILURE = 8,
    /**
     * A configured limit was exceeded (metadata: limit, limit_value).
     *
     * @generated from enum value: ERROR_REASON_LIMIT_EXCEEDED = 9;
     */
    LIMIT_EXCEEDED = 9,
    /**
     * The disk holding the object is full (or the file size limit was reached); nothing was written.
     *
     * @generated from enum value: ERROR_REASON_STORAGE_FULL = 10;
     */
    STORAGE_FULL = 10,
    /**
     * A thing named by id does not exist where an answer needs it (e.g. an attachment hash).
     *
     * @generated from enum value: ERROR_REASON_NOT_FOUND = 11;
     */
    NOT_FOUND = 11,
    /**
     * Compact was called but the server has no summarizer configured.
     *
     * @generated from enum value: ERROR_REASON_NO_SUMMARIZER = 12;
     */
    NO_SUMMARIZER = 12,
    /**
     * The call carries no valid bearer token.
     *
     * @generated from enum value: ERROR_REASON_UNAUTHENTICATED = 13;
     */
    UNAUTHENTICATED = 13,
    /**
     * The bearer token does not grant this object key or this kind of access.
     *
     * @generated from enum value: ERROR_REASON_PERMISSION_DENIED = 14;
     */
    PERMISSION_DENIED = 14,
    /**
     * The server failed on its own; the message names the error class and the log has details.
     *
     * @generated from enum value: ERROR_REASON_INTERNAL = 15;
     */
    INTERNAL = 15,
    /**
     * The stored state does not allow the request (see the message).
     *
     * @generated from enum value: ERROR_REASON_FAILED_PRECONDITION = 16;
     */
    FAILED_PRECONDITION = 16,
    /**
     * This server does not own the object (ownership guard); route it to its shard.
     *
     * @generated from enum value: ERROR_REASON_OBJECT_NOT_OWNED = 17;
     */
    OBJECT_NOT_OWNED = 17,
    /**
     * The object is being moved to another server; retry shortly.
     *
     * @generated from enum value: ERROR_REASON_OBJECT_MOVING = 18;
     */
    OBJECT_MOVING = 18
}
/**
 * Describes the enum sessions.v1.ErrorReason.
 */
export declare const ErrorReasonSchema: GenEnum<ErrorReason>;
/**
 * What an UploadMessage stream does with its message.
 *
 * @generated from enum sessions.v1.UploadOperation
 */
export declare enum UploadOperation {
    /**
     * Invalid.
     *
     * @generated from enum value: UPLOAD_OPERATION_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * As AppendMessage.
     *
     * @generated from enum value: UPLOAD_OPERATION_APPEND = 1;
     */
    APPEND = 1,
    /**
     * As UpdateMessage.
     *
     * @generated from enum value: UPLOAD_OPERATION_UPDATE = 2;
     */
    UPDATE = 2,
    /**
     * As UpsertMessage.
     *
     * @generated from enum value: UPLOAD_OPERATION_UPSERT = 3;
     */
    UPSERT = 3
}
/**
 * Describes the enum sessions.v1.UploadOperation.
 */
export declare const UploadOperationSchema: GenEnum<UploadOperation>;
/**
 * How a search query matches.
 *
 * @generated from enum sessions.v1.SearchMode
 */
export declare enum SearchMode {
    /**
     * Same as PHRASE.
     *
     * @generated from enum value: SEARCH_MODE_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Upstream's semantics: the whole query is one phrase (adjacent words, in order).
     *
     * @generated from enum value: SEARCH_MODE_PHRASE = 1;
     */
    PHRASE = 1,
    /**
     * Every word of the query, in any order.
     *
     * @generated from enum value: SEARCH_MODE_ALL_WORDS = 2;
     */
    ALL_WORDS = 2
}
/**
 * Describes the enum sessions.v1.SearchMode.
 */
export declare const SearchModeSchema: GenEnum<SearchMode>;
/**
 * The kinds of change events.
 *
 * @generated from enum sessions.v1.ChangeType
 */
export declare enum ChangeType {
    /**
     * Not used.
     *
     * @generated from enum value: CHANGE_TYPE_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * A message append (also duplicates, with inserted=false).
     *
     * @generated from enum value: CHANGE_TYPE_APPEND = 1;
     */
    APPEND = 1,
    /**
     * A message's content changed.
     *
     * @generated from enum value: CHANGE_TYPE_UPDATE = 2;
     */
    UPDATE = 2,
    /**
     * Messages were deleted (message_ids as the caller passed them).
     *
     * @generated from enum value: CHANGE_TYPE_DELETE = 3;
     */
    DELETE = 3,
    /**
     * A session was cleared.
     *
     * @generated from enum value: CHANGE_TYPE_CLEAR = 4;
     */
    CLEAR = 4,
    /**
     * Compact stored an overlay.
     *
     * @generated from enum value: CHANGE_TYPE_COMPACT = 5;
     */
    COMPACT = 5,
    /**
     * AddCompaction stored an overlay (compaction is set).
     *
     * @generated from enum value: CHANGE_TYPE_COMPACTION = 6;
     */
    COMPACTION = 6,
    /**
     * A message was imported.
     *
     * @generated from enum value: CHANGE_TYPE_IMPORT = 7;
     */
    IMPORT = 7,
    /**
     * Automatic compaction failed (error is set); the append that triggered it succeeded.
     *
     * @generated from enum value: CHANGE_TYPE_COMPACTION_ERROR = 8;
     */
    COMPACTION_ERROR = 8,
    /**
     * Events were missed (restart, retention or a full queue): re-read state, then continue.
     *
     * @generated from enum value: CHANGE_TYPE_RESET = 9;
     */
    RESET = 9,
    /**
     * Nothing happened; the stream is alive at this revision.
     *
     * @generated from enum value: CHANGE_TYPE_PROGRESS = 10;
     */
    PROGRESS = 10
}
/**
 * Describes the enum sessions.v1.ChangeType.
 */
export declare const ChangeTypeSchema: GenEnum<ChangeType>;
/**
 * SessionService reads and writes the messages of sessions inside objects.
 *
 * @generated from service sessions.v1.SessionService
 */
export declare const SessionService: GenService<{
    /**
     * Appends one message. Idempotent by message id: when the id already exists in the session,
     * nothing is written and the stored message is returned with inserted=false.
     *
     * @generated from rpc sessions.v1.SessionService.AppendMessage
     */
    appendMessage: {
        methodKind: "unary";
        input: typeof AppendMessageRequestSchema;
        output: typeof AppendMessageResponseSchema;
    };
    /**
     * Appends several messages in one transaction: all are stored or none. Each item resolves
     * its parent after the items before it, so AUTO items form a chain.
     *
     * @generated from rpc sessions.v1.SessionService.AppendMessages
     */
    appendMessages: {
        methodKind: "unary";
        input: typeof AppendMessagesRequestSchema;
        output: typeof AppendMessagesResponseSchema;
    };
    /**
     * Replaces the content of an existing message (its parent, seq and created time stay).
     * An unchanged message writes nothing. A missing id answers found=false.
     *
     * @generated from rpc sessions.v1.SessionService.UpdateMessage
     */
    updateMessage: {
        methodKind: "unary";
        input: typeof UpdateMessageRequestSchema;
        output: typeof UpdateMessageResponseSchema;
    };
    /**
     * Appends the message when its id is new, otherwise updates it (never re-parents it).
     *
     * @generated from rpc sessions.v1.SessionService.UpsertMessage
     */
    upsertMessage: {
        methodKind: "unary";
        input: typeof UpsertMessageRequestSchema;
        output: typeof UpsertMessageResponseSchema;
    };
    /**
     * Appends, updates or upserts one message sent in pieces, for messages larger than a
     * client's or proxy's request size limit. The first frame carries the header.
     *
     * @generated from rpc sessions.v1.SessionService.UploadMessage
     */
    uploadMessage: {
        methodKind: "client_streaming";
        input: typeof UploadMessageRequestSchema;
        output: typeof UploadMessageResponseSchema;
    };
    /**
     * Deletes messages by id. Children of a deleted message are re-parented to its nearest
     * surviving ancestor (or become roots), so older history stays reachable.
     *
     * @generated from rpc sessions.v1.SessionService.DeleteMessages
     */
    deleteMessages: {
        methodKind: "unary";
        input: typeof DeleteMessagesRequestSchema;
        output: typeof DeleteMessagesResponseSchema;
    };
    /**
     * Deletes every message and compaction of a session.
     *
     * @generated from rpc sessions.v1.SessionService.ClearMessages
     */
    clearMessages: {
        methodKind: "unary";
        input: typeof ClearMessagesRequestSchema;
        output: typeof ClearMessagesResponseSchema;
    };
    /**
     * Imports historical messages verbatim (explicit parent and created time, no sanitizing),
     * e.g. to move a conversation between objects or servers. Each message commits on its own;
     * ids that already exist are skipped. Messages may be sent in pieces.
     *
     * @generated from rpc sessions.v1.SessionService.ImportMessages
     */
    importMessages: {
        methodKind: "client_streaming";
        input: typeof ImportMessagesRequestSchema;
        output: typeof ImportMessagesResponseSchema;
    };
    /**
     * Reads one message by id. The stream is empty when the message does not exist.
     *
     * @generated from rpc sessions.v1.SessionService.GetMessage
     */
    getMessage: {
        methodKind: "server_streaming";
        input: typeof GetMessageRequestSchema;
        output: typeof GetMessageResponseSchema;
    };
    /**
     * Reads several messages by id, in request order; missing ids are left out.
     *
     * @generated from rpc sessions.v1.SessionService.GetMessages
     */
    getMessages: {
        methodKind: "server_streaming";
        input: typeof GetMessagesRequestSchema;
        output: typeof GetMessagesResponseSchema;
    };
    /**
     * Reads the active leaf: the newest message of the session. Empty for an empty session.
     *
     * @generated from rpc sessions.v1.SessionService.GetLatestLeaf
     */
    getLatestLeaf: {
        methodKind: "server_streaming";
        input: typeof GetLatestLeafRequestSchema;
        output: typeof GetLatestLeafResponseSchema;
    };
    /**
     * Reads the direct children of a message, oldest first.
     *
     * @generated from rpc sessions.v1.SessionService.GetBranches
     */
    getBranches: {
        methodKind: "server_streaming";
        input: typeof GetBranchesRequestSchema;
        output: typeof GetBranchesResponseSchema;
    };
    /**
     * Streams one root-to-leaf path (the active branch by default), root first or newest first,
     * optionally marking batch boundaries by message count and bytes.
     *
     * @generated from rpc sessions.v1.SessionService.StreamHistory
     */
    streamHistory: {
        methodKind: "server_streaming";
        input: typeof StreamHistoryRequestSchema;
        output: typeof StreamHistoryResponseSchema;
    };
    /**
     * Reads the longest recent suffix of a path whose stored size fits a byte budget; always at
     * least the newest message. The first response carries the summary.
     *
     * @generated from rpc sessions.v1.SessionService.GetRecentHistory
     */
    getRecentHistory: {
        methodKind: "server_streaming";
        input: typeof GetRecentHistoryRequestSchema;
        output: typeof GetRecentHistoryResponseSchema;
    };
    /**
     * Reads per-message stored sizes and token estimates along a path, root first, without
     * reading message content.
     *
     * @generated from rpc sessions.v1.SessionService.GetHistoryRowStats
     */
    getHistoryRowStats: {
        methodKind: "server_streaming";
        input: typeof GetHistoryRowStatsRequestSchema;
        output: typeof GetHistoryRowStatsResponseSchema;
    };
    /**
     * Reads one attachment payload by its content hash, in frames of at most 3 MiB.
     *
     * @generated from rpc sessions.v1.SessionService.ReadAttachment
     */
    readAttachment: {
        methodKind: "server_streaming";
        input: typeof ReadAttachmentRequestSchema;
        output: typeof ReadAttachmentResponseSchema;
    };
    /**
     * Stores a compaction overlay: at read time the path from `from_message_id` to
     * `to_message_id` is replaced by one synthetic message holding the summary. Nothing is deleted.
     *
     * @generated from rpc sessions.v1.SessionService.AddCompaction
     */
    addCompaction: {
        methodKind: "unary";
        input: typeof AddCompactionRequestSchema;
        output: typeof AddCompactionResponseSchema;
    };
    /**
     * Lists every compaction record of a session, oldest first (superseded ones included).
     *
     * @generated from rpc sessions.v1.SessionService.ListCompactions
     */
    listCompactions: {
        methodKind: "unary";
        input: typeof ListCompactionsRequestSchema;
        output: typeof ListCompactionsResponseSchema;
    };
    /**
     * Plans a compaction as upstream's createCompactFunction does and returns the range and the
     * prompt, for a summarizer that runs on the client. Store the summary with AddCompaction.
     *
     * @generated from rpc sessions.v1.SessionService.PlanCompaction
     */
    planCompaction: {
        methodKind: "unary";
        input: typeof PlanCompactionRequestSchema;
        output: typeof PlanCompactionResponseSchema;
    };
    /**
     * Plans, summarizes with the server's configured summarizer, and stores the overlay.
     * FAILED_PRECONDITION when no summarizer is configured.
     *
     * @generated from rpc sessions.v1.SessionService.Compact
     */
    compact: {
        methodKind: "unary";
        input: typeof CompactRequestSchema;
        output: typeof CompactResponseSchema;
    };
    /**
     * Sets a session's automatic compaction policy (persisted in the object).
     *
     * @generated from rpc sessions.v1.SessionService.SetCompactionPolicy
     */
    setCompactionPolicy: {
        methodKind: "unary";
        input: typeof SetCompactionPolicyRequestSchema;
        output: typeof SetCompactionPolicyResponseSchema;
    };
    /**
     * Reads a session's automatic compaction policy.
     *
     * @generated from rpc sessions.v1.SessionService.GetCompactionPolicy
     */
    getCompactionPolicy: {
        methodKind: "unary";
        input: typeof GetCompactionPolicyRequestSchema;
        output: typeof GetCompactionPolicyResponseSchema;
    };
    /**
     * Full-text search over message text, best match first.
     *
     * @generated from rpc sessions.v1.SessionService.SearchMessages
     */
    searchMessages: {
        methodKind: "server_streaming";
        input: typeof SearchMessagesRequestSchema;
        output: typeof SearchMessagesResponseSchema;
    };
    /**
     * Streams an object's changes in commit order, each with a revision; resumable.
     *
     * @generated from rpc sessions.v1.SessionService.Subscribe
     */
    subscribe: {
        methodKind: "server_streaming";
        input: typeof SubscribeRequestSchema;
        output: typeof SubscribeResponseSchema;
    };
    /**
     * Lists the sessions of an object with their message counts.
     *
     * @generated from rpc sessions.v1.SessionService.ListSessions
     */
    listSessions: {
        methodKind: "unary";
        input: typeof ListSessionsRequestSchema;
        output: typeof ListSessionsResponseSchema;
    };
    /**
     * Reports an object's storage: bytes, rows, attachments and row writes.
     *
     * @generated from rpc sessions.v1.SessionService.GetObjectStats
     */
    getObjectStats: {
        methodKind: "unary";
        input: typeof GetObjectStatsRequestSchema;
        output: typeof GetObjectStatsResponseSchema;
    };
    /**
     * Lists the object keys stored on this server, a page at a time (in file order, not key order).
     *
     * @generated from rpc sessions.v1.SessionService.ListObjects
     */
    listObjects: {
        methodKind: "unary";
        input: typeof ListObjectsRequestSchema;
        output: typeof ListObjectsResponseSchema;
    };
    /**
     * Streams a consistent copy of an object's file, for moving it to another server. With
     * `lock_for_move`, writes to the object are refused (UNAVAILABLE, OBJECT_MOVING: retry) from
     * the snapshot on, until DeleteObject completes the move or the lease expires.
     *
     * @generated from rpc sessions.v1.SessionService.ExportObject
     */
    exportObject: {
        methodKind: "server_streaming";
        input: typeof ExportObjectRequestSchema;
        output: typeof ExportObjectResponseSchema;
    };
    /**
     * Receives an exported object file, verifies its digest and integrity, and serves it.
     *
     * @generated from rpc sessions.v1.SessionService.ImportObject
     */
    importObject: {
        methodKind: "client_streaming";
        input: typeof ImportObjectRequestSchema;
        output: typeof ImportObjectResponseSchema;
    };
    /**
     * Removes an object from this server (the last step of a move). Later calls for the key are
     * refused with FAILED_PRECONDITION (OBJECT_NOT_OWNED) naming where it went, until restart.
     *
     * @generated from rpc sessions.v1.SessionService.DeleteObject
     */
    deleteObject: {
        methodKind: "unary";
        input: typeof DeleteObjectRequestSchema;
        output: typeof DeleteObjectResponseSchema;
    };
}>;
