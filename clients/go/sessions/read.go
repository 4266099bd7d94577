package sessions

import (
	"context"
	"io"

	"google.golang.org/grpc"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// packedMessages is how many messages a long read asks the server to pack into one response
// (max_messages_per_response), the Python client's PACKED_MESSAGES: one gRPC frame per message
// would otherwise dominate the cost of streaming history. 400 is what the server reads at once,
// and it frames each read separately: a larger value gains nothing, a smaller one cuts a read
// into more responses (about 0.15 ms of server time each). The server also stops a response at
// about 1 MiB of JSON, and sends each piece of a message over 3 MiB in a response of its own.
const packedMessages = 400

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
	msgs, err := collect(stream, nil)
	if err != nil || len(msgs) == 0 {
		return Message{}, false, err
	}
	return msgs[0], true, nil
}

// GetMessages reads several messages by id. It returns the messages found, each once, in the
// order their ids first appear in ids: a missing id is left out, and a repeated id gives one
// message (the server reads each id once), so the result is not aligned with ids. Python's
// get_messages and TypeScript's getMessages instead return one entry per requested id (None /
// null where missing); match the result to ids by Message.Info.ID.
func (s *Session) GetMessages(ctx context.Context, ids []string, opts ...ReadOption) ([]Message, error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.GetMessages(cctx, &pb.GetMessagesRequest{
		ObjectKey: s.object.key, SessionId: s.id, MessageIds: ids, Attachments: attachmentMode(o),
		MaxMessagesPerResponse: packedMessages,
	})
	if err != nil {
		return nil, toError(err)
	}
	return collect(stream, nil)
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
	msgs, err := collect(stream, nil)
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
		MaxMessagesPerResponse: packedMessages,
	})
	if err != nil {
		return nil, toError(err)
	}
	return collect(stream, nil)
}

// GetHistory reads a whole path into memory (root first, or newest first with NewestFirst).
// Prefer History for long paths: it streams. Unlike History, it is a collected read:
// WithCallTimeout bounds it (codes.DeadlineExceeded when the path takes longer).
func (s *Session) GetHistory(ctx context.Context, opts ...ReadOption) ([]Message, error) {
	cctx, cancel := s.client.timeoutCtx(ctx)
	defer cancel()
	var out []Message
	it := s.History(cctx, opts...)
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
		ObjectKey:              s.object.key,
		SessionId:              s.id,
		MaxContentBytes:        maxContentBytes,
		LeafId:                 o.leafID,
		Attachments:            attachmentMode(o),
		MaxMessagesPerResponse: packedMessages,
	})
	if err != nil {
		return RecentHistory{}, toError(err)
	}
	var out RecentHistory
	msgs, err := collect(stream, func(r *pb.GetRecentHistoryResponse) {
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

// frameResponse is a message-read response: each has a single `frame`.
type frameResponse interface {
	GetFrame() *pb.MessageFrame
}

// packedResponse is the response of a long read, which can also carry packed `frames`.
type packedResponse interface {
	frameResponse
	GetFrames() []*pb.MessageFrame
}

// framesOf returns the MessageFrames of a read response: its packed `frames` when it has any,
// else its single `frame` (none when neither is set), as the Python client's frames_of.
func framesOf(resp frameResponse) []*pb.MessageFrame {
	if packed, ok := resp.(packedResponse); ok {
		if frames := packed.GetFrames(); len(frames) > 0 {
			return frames
		}
	}
	if frame := resp.GetFrame(); frame != nil {
		return []*pb.MessageFrame{frame}
	}
	return nil
}

// messageStream reads whole messages from a server stream of MessageFrames. It reads a response
// only when the previous one's frames are used up, and holds the frames of that one response
// not yet returned (up to packedMessages messages) and the pieces of at most one message.
type messageStream[R any] struct {
	recv       func() (*R, error)
	framesOf   func(*R) []*pb.MessageFrame
	onResponse func(*R)
	asm        assembler
	resp       *R                 // the response being read; nil when it is used up
	pending    []*pb.MessageFrame // its frames not fed yet
	responses  int64
}

func newMessageStream[R any, P interface {
	*R
	frameResponse
}](stream grpc.ServerStreamingClient[R], onResponse func(*R)) *messageStream[R] {
	return &messageStream[R]{
		recv:       stream.Recv,
		framesOf:   func(r *R) []*pb.MessageFrame { return framesOf(P(r)) },
		onResponse: onResponse,
	}
}

// step feeds the assembler one frame, reading the next response when the current one is used
// up. It returns a message when that frame completes one (ok), or, once every frame of a
// response has been fed, that response (ended) before any later response is read; io.EOF when
// the stream ended cleanly.
func (m *messageStream[R]) step() (msg Message, ok bool, ended *R, err error) {
	for {
		if m.resp == nil {
			resp, err := m.recv()
			if err == io.EOF {
				if err := m.asm.finish(); err != nil {
					return Message{}, false, nil, err
				}
				return Message{}, false, nil, io.EOF
			}
			if err != nil {
				return Message{}, false, nil, toError(err)
			}
			m.responses++
			if m.onResponse != nil {
				m.onResponse(resp)
			}
			m.resp, m.pending = resp, m.framesOf(resp)
		}
		if len(m.pending) == 0 {
			ended, m.resp, m.pending = m.resp, nil, nil
			return Message{}, false, ended, nil
		}
		frame := m.pending[0]
		m.pending[0] = nil // fed: let it go before the rest of the response
		m.pending = m.pending[1:]
		if msg, ok := m.asm.feed(frame); ok {
			return msg, true, nil, nil
		}
	}
}

// next returns the next whole message; io.EOF when the stream ended cleanly.
func (m *messageStream[R]) next() (Message, error) {
	for {
		msg, ok, _, err := m.step()
		if err != nil {
			return Message{}, err
		}
		if ok {
			return msg, nil
		}
	}
}

// collect reads every message of a short server stream.
func collect[R any, P interface {
	*R
	frameResponse
}](stream grpc.ServerStreamingClient[R], onResponse func(*R)) ([]Message, error) {
	ms := newMessageStream[R, P](stream, onResponse)
	var out []Message
	for {
		msg, err := ms.next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, msg)
	}
}
