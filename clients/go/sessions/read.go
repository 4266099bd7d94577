package sessions

import (
	"context"
	"io"

	"google.golang.org/grpc"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

func attachmentMode(o readOptions) pb.AttachmentMode {
	if o.pointers {
		return pb.AttachmentMode_ATTACHMENT_MODE_POINTER
	}
	return pb.AttachmentMode_ATTACHMENT_MODE_UNSPECIFIED
}

// GetMessage reads one message by id; found is false when it does not exist.
func (s *Session) GetMessage(ctx context.Context, id string, opts ...ReadOption) (msg Message, found bool, err error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.GetMessage(cctx, &pb.GetMessageRequest{
		ObjectKey: s.object.key, SessionId: s.id, MessageId: id, Attachments: attachmentMode(o),
	})
	if err != nil {
		return Message{}, false, toError(err)
	}
	msgs, err := collect(stream, (*pb.GetMessageResponse).GetFrame, nil)
	if err != nil || len(msgs) == 0 {
		return Message{}, false, err
	}
	return msgs[0], true, nil
}

// GetMessages reads several messages by id, in the order of ids; missing ids are left out.
func (s *Session) GetMessages(ctx context.Context, ids []string, opts ...ReadOption) ([]Message, error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.GetMessages(cctx, &pb.GetMessagesRequest{
		ObjectKey: s.object.key, SessionId: s.id, MessageIds: ids, Attachments: attachmentMode(o),
	})
	if err != nil {
		return nil, toError(err)
	}
	return collect(stream, (*pb.GetMessagesResponse).GetFrame, nil)
}

// GetLatestLeaf reads the active leaf, the newest message of the session; found is false for
// an empty session.
func (s *Session) GetLatestLeaf(ctx context.Context, opts ...ReadOption) (msg Message, found bool, err error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.GetLatestLeaf(cctx, &pb.GetLatestLeafRequest{
		ObjectKey: s.object.key, SessionId: s.id, Attachments: attachmentMode(o),
	})
	if err != nil {
		return Message{}, false, toError(err)
	}
	msgs, err := collect(stream, (*pb.GetLatestLeafResponse).GetFrame, nil)
	if err != nil || len(msgs) == 0 {
		return Message{}, false, err
	}
	return msgs[0], true, nil
}

// GetBranches reads the direct children of a message, oldest first.
func (s *Session) GetBranches(ctx context.Context, id string, opts ...ReadOption) ([]Message, error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.GetBranches(cctx, &pb.GetBranchesRequest{
		ObjectKey: s.object.key, SessionId: s.id, MessageId: id, Attachments: attachmentMode(o),
	})
	if err != nil {
		return nil, toError(err)
	}
	return collect(stream, (*pb.GetBranchesResponse).GetFrame, nil)
}

// GetHistory reads a whole path into memory (root first, or newest first with NewestFirst).
// Prefer History for long paths: it streams.
func (s *Session) GetHistory(ctx context.Context, opts ...ReadOption) ([]Message, error) {
	var out []Message
	it := s.History(ctx, opts...)
	defer it.Close()
	for it.Next() {
		out = append(out, it.Message())
	}
	return out, it.Err()
}

// GetRecentHistory reads the longest recent suffix of a path (the active branch, or WithLeaf)
// whose stored size fits maxContentBytes; always at least the newest message. Messages are
// root first.
func (s *Session) GetRecentHistory(ctx context.Context, maxContentBytes int64, opts ...ReadOption) (RecentHistory, error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.GetRecentHistory(cctx, &pb.GetRecentHistoryRequest{
		ObjectKey:       s.object.key,
		SessionId:       s.id,
		MaxContentBytes: maxContentBytes,
		LeafId:          o.leafID,
		Attachments:     attachmentMode(o),
	})
	if err != nil {
		return RecentHistory{}, toError(err)
	}
	var out RecentHistory
	msgs, err := collect(stream, (*pb.GetRecentHistoryResponse).GetFrame, func(r *pb.GetRecentHistoryResponse) {
		if summary := r.GetSummary(); summary != nil {
			out.Truncated = summary.GetTruncated()
			out.TotalContentBytes = summary.GetTotalContentBytes()
		}
	})
	if err != nil {
		return RecentHistory{}, err
	}
	out.Messages = msgs
	return out, nil
}

// GetHistoryRowStats reads per-message stored sizes and token estimates along a path (the
// active branch, or WithLeaf), root first, without reading message content.
func (s *Session) GetHistoryRowStats(ctx context.Context, opts ...ReadOption) ([]RowStat, error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.GetHistoryRowStats(cctx, &pb.GetHistoryRowStatsRequest{
		ObjectKey: s.object.key, SessionId: s.id, LeafId: o.leafID,
	})
	if err != nil {
		return nil, toError(err)
	}
	var out []RowStat
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, toError(err)
		}
		for _, st := range resp.GetStats() {
			out = append(out, RowStat{ID: st.GetId(), Role: st.GetRole(), Bytes: st.GetBytes(), TokenEstimate: st.GetTokenEstimate()})
		}
	}
}

// messageStream reads whole messages from a server stream of MessageFrames, holding at most the
// pieces of one message.
type messageStream[R any] struct {
	recv       func() (*R, error)
	frame      func(*R) *pb.MessageFrame
	onResponse func(*R)
	asm        assembler
	frames     int64
}

func newMessageStream[R any](stream grpc.ServerStreamingClient[R], frame func(*R) *pb.MessageFrame, onResponse func(*R)) *messageStream[R] {
	return &messageStream[R]{recv: stream.Recv, frame: frame, onResponse: onResponse}
}

// next returns the next whole message and the response that carried its last piece; io.EOF
// when the stream ended cleanly.
func (m *messageStream[R]) next() (Message, *R, error) {
	for {
		resp, err := m.recv()
		if err == io.EOF {
			if err := m.asm.finish(); err != nil {
				return Message{}, nil, err
			}
			return Message{}, nil, io.EOF
		}
		if err != nil {
			return Message{}, nil, toError(err)
		}
		m.frames++
		if m.onResponse != nil {
			m.onResponse(resp)
		}
		if msg, ok := m.asm.feed(m.frame(resp)); ok {
			return msg, resp, nil
		}
	}
}

// collect reads every message of a short server stream.
func collect[R any](stream grpc.ServerStreamingClient[R], frame func(*R) *pb.MessageFrame, onResponse func(*R)) ([]Message, error) {
	ms := newMessageStream(stream, frame, onResponse)
	var out []Message
	for {
		msg, _, err := ms.next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, msg)
	}
}
