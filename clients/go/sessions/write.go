package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"iter"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// AppendMessage appends one message. msg is JSON text (json.RawMessage, []byte, string), a
// Message, or any value encoding/json can marshal. Idempotent by message id: when the id already
// exists in the session nothing is written and the stored message comes back with
// Inserted=false. Messages over 3 MiB go through the client-streaming UploadMessage path.
func (s *Session) AppendMessage(ctx context.Context, msg any, opts ...Option) (AppendResult, error) {
	o := newWriteOptions(opts)
	text, err := toJSON(msg)
	if err != nil {
		return AppendResult{}, err
	}
	if len(text) > UnaryLimitBytes {
		up, err := s.upload(ctx, pb.UploadOperation_UPLOAD_OPERATION_APPEND, text, o)
		if err != nil {
			return AppendResult{}, err
		}
		written, err := s.written(ctx, up.GetMessage(), text)
		return AppendResult{Inserted: up.GetInserted(), Message: written}, err
	}
	mode, parentID := parentFields(o)
	req := &pb.AppendMessageRequest{
		ObjectKey:      s.object.key,
		SessionId:      s.id,
		MessageJson:    text,
		ParentMode:     mode,
		ParentId:       parentID,
		Source:         pb.Source(o.source),
		OmitJsonAsSent: true,
	}
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.AppendMessage(cctx, req)
	if err != nil {
		return AppendResult{}, toError(err)
	}
	written, err := s.written(ctx, resp.GetMessage(), text)
	return AppendResult{Inserted: resp.GetInserted(), Message: written}, err
}

// AppendMessages appends messages in one transaction: all are stored or none. The parent option
// applies to the first message; the others chain (each attaches to the one before it). The
// source option applies to all.
func (s *Session) AppendMessages(ctx context.Context, msgs []any, opts ...Option) ([]AppendResult, error) {
	o := newWriteOptions(opts)
	items := make([]*pb.AppendItem, 0, len(msgs))
	texts := make([]string, 0, len(msgs))
	for i, msg := range msgs {
		text, err := toJSON(msg)
		if err != nil {
			return nil, err
		}
		texts = append(texts, text)
		item := &pb.AppendItem{MessageJson: text, ParentMode: pb.ParentMode_PARENT_MODE_AUTO, Source: pb.Source(o.source)}
		if i == 0 {
			item.ParentMode, item.ParentId = parentFields(o)
		}
		items = append(items, item)
	}
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.AppendMessages(cctx, &pb.AppendMessagesRequest{
		ObjectKey: s.object.key, SessionId: s.id, Items: items, OmitJsonAsSent: true,
	})
	if err != nil {
		return nil, toError(err)
	}
	if len(resp.GetResults()) != len(texts) {
		return nil, clientError(codes.Internal, "", "the server answered %d results for %d messages",
			len(resp.GetResults()), len(texts))
	}
	out := make([]AppendResult, len(resp.GetResults()))
	var missing []string // JSON the answer had no room for: read back together, in one call
	for i, r := range resp.GetResults() {
		w := r.GetMessage()
		out[i].Inserted = r.GetInserted()
		if w.GetJsonOmitted() && !w.GetJsonAsSent() {
			missing = append(missing, w.GetInfo().GetId())
			continue
		}
		written, err := s.written(ctx, w, texts[i])
		if err != nil {
			return nil, err
		}
		out[i].Message = written
	}
	if len(missing) == 0 {
		return out, nil
	}
	found, err := s.GetMessages(ctx, missing)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]Message, len(found))
	for _, m := range found {
		byID[m.Info.ID] = m
	}
	for i, r := range resp.GetResults() {
		w := r.GetMessage()
		if !w.GetJsonOmitted() || w.GetJsonAsSent() {
			continue
		}
		m, ok := byID[w.GetInfo().GetId()]
		if !ok {
			return nil, clientError(codes.NotFound, "", "written message %q vanished before it was read back", w.GetInfo().GetId())
		}
		out[i].Message = m
	}
	return out, nil
}

// UpdateMessage replaces the content of an existing message, named by the `id` inside msg (its
// parent, seq and created time stay). A missing id answers Found=false; an unchanged message
// writes nothing (Changed=false).
func (s *Session) UpdateMessage(ctx context.Context, msg any, opts ...Option) (UpdateResult, error) {
	o := newWriteOptions(opts)
	text, err := toJSON(msg)
	if err != nil {
		return UpdateResult{}, err
	}
	if len(text) > UnaryLimitBytes {
		up, err := s.upload(ctx, pb.UploadOperation_UPLOAD_OPERATION_UPDATE, text, o)
		if err != nil {
			return UpdateResult{}, err
		}
		res := UpdateResult{Found: up.GetFound(), Changed: up.GetChanged()}
		if res.Found {
			res.Message, err = s.written(ctx, up.GetMessage(), text)
		}
		return res, err
	}
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.UpdateMessage(cctx, &pb.UpdateMessageRequest{
		ObjectKey: s.object.key, SessionId: s.id, MessageJson: text, Source: pb.Source(o.source),
		OmitJsonAsSent: true,
	})
	if err != nil {
		return UpdateResult{}, toError(err)
	}
	res := UpdateResult{Found: resp.GetFound(), Changed: resp.GetChanged()}
	if res.Found {
		res.Message, err = s.written(ctx, resp.GetMessage(), text)
	}
	return res, err
}

// UpsertMessage appends the message when its id is new, otherwise updates it (never re-parents
// it; the parent option applies only to a new message).
func (s *Session) UpsertMessage(ctx context.Context, msg any, opts ...Option) (UpsertResult, error) {
	o := newWriteOptions(opts)
	text, err := toJSON(msg)
	if err != nil {
		return UpsertResult{}, err
	}
	if len(text) > UnaryLimitBytes {
		up, err := s.upload(ctx, pb.UploadOperation_UPLOAD_OPERATION_UPSERT, text, o)
		if err != nil {
			return UpsertResult{}, err
		}
		written, err := s.written(ctx, up.GetMessage(), text)
		return UpsertResult{Inserted: up.GetInserted(), Changed: up.GetChanged(), Message: written}, err
	}
	mode, parentID := parentFields(o)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.UpsertMessage(cctx, &pb.UpsertMessageRequest{
		ObjectKey:      s.object.key,
		SessionId:      s.id,
		MessageJson:    text,
		ParentMode:     mode,
		ParentId:       parentID,
		Source:         pb.Source(o.source),
		OmitJsonAsSent: true,
	})
	if err != nil {
		return UpsertResult{}, toError(err)
	}
	written, err := s.written(ctx, resp.GetMessage(), text)
	return UpsertResult{Inserted: resp.GetInserted(), Changed: resp.GetChanged(), Message: written}, err
}

// DeleteMessages deletes messages by id (unknown ids are ignored) and returns how many were
// deleted. Children of a deleted message are re-parented to its nearest surviving ancestor.
func (s *Session) DeleteMessages(ctx context.Context, ids ...string) (int64, error) {
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.DeleteMessages(cctx, &pb.DeleteMessagesRequest{
		ObjectKey: s.object.key, SessionId: s.id, MessageIds: ids,
	})
	if err != nil {
		return 0, toError(err)
	}
	return resp.GetDeletedCount(), nil
}

// ClearMessages deletes every message and compaction of the session and returns how many
// messages were deleted.
func (s *Session) ClearMessages(ctx context.Context) (int64, error) {
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.ClearMessages(cctx, &pb.ClearMessagesRequest{ObjectKey: s.object.key, SessionId: s.id})
	if err != nil {
		return 0, toError(err)
	}
	return resp.GetDeletedCount(), nil
}

// ImportMessages imports historical messages verbatim (explicit parent and created time, no
// sanitizing) in one client stream: messages of up to 256 KiB whole, packed into frames of about
// 1 MiB, larger ones in pieces. Not all or nothing: what committed before a failure stays, and
// ids that already exist are skipped. A server that predates packed frames reads none of their
// messages: the result's counts then fall short, and ImportMessages returns an error saying so.
//
// The call is retried as the client's policy allows (WithRetry), each attempt sending every item
// again: messages an earlier attempt stored then count as skipped.
func (s *Session) ImportMessages(ctx context.Context, items []ImportItem) (ImportResult, error) {
	ctx, cancel := s.object.unaryCtx(ctx) // one deadline for every attempt and wait
	defer cancel()
	var loop *retryLoop
	if r := s.client.retries; r != nil {
		loop = r.loop(ctx, pb.SessionService_ImportMessages_FullMethodName, retryRepeatable)
	}
	var res ImportResult
	var err error
	for {
		res, err = s.importMessages(ctx, slices.Values(items), true)
		if err == nil || loop == nil {
			break
		}
		if err = loop.retry(err); err != nil {
			break
		}
	}
	if err == nil && res.Imported+res.Skipped != int64(len(items)) {
		return res, clientError(codes.FailedPrecondition, "", "the server accounted for %d of the %d messages sent: "+
			"it does not read packed import frames (ImportedMessage); upgrade it, or use ImportMessagesSeq",
			res.Imported+res.Skipped, len(items))
	}
	return res, err
}

// ImportMessagesSeq is ImportMessages for items produced lazily, e.g. read from another server's
// History: only the message being sent is held, and each goes in a frame of its own as soon as
// the sequence yields it. It is never retried (a sequence need not yield its items twice).
func (s *Session) ImportMessagesSeq(ctx context.Context, items iter.Seq[ImportItem]) (ImportResult, error) {
	ctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	return s.importMessages(ctx, items, false)
}

// Whole messages an import packs into one frame (ImportMessages): each at most importWholeBytes,
// about importFrameBytes in all.
const (
	importWholeBytes = 256 * 1024
	importFrameBytes = 1024 * 1024
)

// importMessages makes one attempt of an import; ctx is routed and bounded (unaryCtx).
func (s *Session) importMessages(ctx context.Context, items iter.Seq[ImportItem], pack bool) (ImportResult, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.client.stub.ImportMessages(cctx)
	if err != nil {
		return ImportResult{}, toError(err)
	}
	frame := &pb.ImportMessagesRequest{ObjectKey: s.object.key, SessionId: s.id}
	packed, sent := 0, false
	send := func() error {
		err := stream.Send(frame)
		frame, packed, sent = &pb.ImportMessagesRequest{}, 0, true
		return err
	}
	var sendErr error
	for item := range items {
		text, err := toJSON(item.Message)
		if err != nil {
			sendErr = err
			break
		}
		createdAt := item.CreatedAt
		if createdAt.IsZero() {
			createdAt = time.Now()
		}
		var parentID *string
		if item.ParentID != "" {
			parentID = &item.ParentID
		}
		if pack && len(text) <= importWholeBytes {
			if packed > 0 && packed+len(text) > importFrameBytes {
				if sendErr = send(); sendErr != nil {
					break
				}
			}
			frame.Messages = append(frame.Messages, &pb.ImportedMessage{Json: text, ParentId: parentID, CreatedAtMs: createdAt.UnixMilli()})
			packed += len(text)
			continue
		}
		if packed > 0 { // whole messages first, in a frame of their own: no frame over ~4 MiB
			if sendErr = send(); sendErr != nil {
				break
			}
		}
		parts := pieces(text)
		for i, piece := range parts {
			frame.JsonPiece, frame.MorePieces = piece, i < len(parts)-1
			if i == 0 {
				frame.CreatedAtMs, frame.ParentId = createdAt.UnixMilli(), parentID
			}
			if sendErr = send(); sendErr != nil {
				break
			}
		}
		if sendErr != nil {
			break
		}
	}
	if sendErr == nil && (packed > 0 || !sent) { // an empty import still names its object
		sendErr = send()
	}
	if sendErr != nil {
		var e *Error
		if errors.As(sendErr, &e) && e.status == nil {
			// A client-side problem (a message that is not JSON text): abort the stream. Messages
			// sent before it may have been imported already (an import is not all or nothing).
			cancel()
			return ImportResult{}, e
		}
		if sendErr != io.EOF { // io.EOF: the server ended the stream; CloseAndRecv has its status
			cancel()
			return ImportResult{}, toError(sendErr)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return ImportResult{}, toError(err)
	}
	return ImportResult{Imported: resp.GetImportedCount(), Skipped: resp.GetSkippedCount()}, nil
}

// ImportChain turns messages into ImportItems that form a chain: each one's parent is the id of
// the message before it (the first is a root), all created now.
func ImportChain(msgs ...any) []ImportItem {
	items := make([]ImportItem, 0, len(msgs))
	previous := ""
	for _, msg := range msgs {
		items = append(items, ImportItem{Message: msg, ParentID: previous})
		previous = messageID(msg)
	}
	return items
}

func messageID(msg any) string {
	text, err := toJSON(msg)
	if err != nil {
		return ""
	}
	var head struct {
		ID any `json:"id"`
	}
	if json.Unmarshal([]byte(text), &head) != nil {
		return ""
	}
	id, _ := head.ID.(string)
	return id
}

// upload sends one message through the client-streaming UploadMessage RPC, in pieces.
func (s *Session) upload(ctx context.Context, op pb.UploadOperation, text string, o writeOptions) (*pb.UploadMessageResponse, error) {
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.UploadMessage(cctx)
	if err != nil {
		return nil, toError(err)
	}
	mode, parentID := parentFields(o)
	header := &pb.UploadHeader{
		ObjectKey:  s.object.key,
		SessionId:  s.id,
		Operation:  op,
		ParentMode: mode,
		ParentId:   parentID,
		Source:     pb.Source(o.source),
	}
	if op == pb.UploadOperation_UPLOAD_OPERATION_UPDATE {
		header.ParentMode, header.ParentId = pb.ParentMode_PARENT_MODE_UNSPECIFIED, ""
	}
	for i, piece := range pieces(text) {
		req := &pb.UploadMessageRequest{JsonPiece: piece}
		if i == 0 {
			req.Header = header
		}
		if err := stream.Send(req); err != nil {
			if err == io.EOF {
				break // the server ended the stream early; CloseAndRecv returns its status
			}
			return nil, toError(err)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, toError(err)
	}
	return resp, nil
}

// written turns a write's WrittenMessage into a Message. When the server left the JSON out of
// the response (as this client's writes ask when it is what they sent, or for being too large
// for one frame), it is sent (the JSON text this call sent) if the server marks the stored JSON
// as byte for byte that (json_as_sent), else read back.
func (s *Session) written(ctx context.Context, w *pb.WrittenMessage, sent string) (Message, error) {
	if !w.GetJsonOmitted() {
		return Message{JSON: json.RawMessage(w.GetJson()), Info: infoFrom(w.GetInfo())}, nil
	}
	if w.GetJsonAsSent() {
		return Message{JSON: json.RawMessage(sent), Info: infoFrom(w.GetInfo())}, nil
	}
	msg, found, err := s.GetMessage(ctx, w.GetInfo().GetId())
	if err != nil {
		return Message{}, err
	}
	if !found {
		return Message{}, clientError(codes.NotFound, "", "written message %q vanished before it was read back", w.GetInfo().GetId())
	}
	return msg, nil
}
