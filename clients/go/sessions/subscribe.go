package sessions

import (
	"context"
	"io"
	"iter"

	"google.golang.org/grpc"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// Subscription streams an object's change events in commit order, one at a time. Remember the
// last Revision seen to resume with ResumeAfter; a ChangeReset event means events were missed
// (re-read state, then continue). Not safe for concurrent use.
type Subscription struct {
	cancel  context.CancelFunc
	stream  grpc.ServerStreamingClient[pb.SubscribeResponse]
	asm     assembler
	pending *Event
	cur     Event
	err     error
	done    bool
}

// Subscribe streams the changes of every session of the object. It starts live (from the next
// event) unless ResumeAfter is given. The stream runs until ctx ends or Close.
func (o *Object) Subscribe(ctx context.Context, opts ...ReadOption) *Subscription {
	return o.subscribe(ctx, nil, opts)
}

// Subscribe streams the changes of this session only.
func (s *Session) Subscribe(ctx context.Context, opts ...ReadOption) *Subscription {
	id := s.id
	return s.object.subscribe(ctx, &id, opts)
}

func (o *Object) subscribe(ctx context.Context, sessionID *string, opts []ReadOption) *Subscription {
	ro := newReadOptions(opts)
	sctx, cancel := context.WithCancel(o.routed(ctx))
	sub := &Subscription{cancel: cancel}
	stream, err := o.client.stub.Subscribe(sctx, &pb.SubscribeRequest{
		ObjectKey:           o.key,
		SessionId:           sessionID,
		ResumeAfterRevision: ro.resumeAfter,
		Attachments:         attachmentMode(ro),
	})
	if err != nil {
		sub.finish(toError(err))
		return sub
	}
	sub.stream = stream
	return sub
}

// Next waits for the next event. It returns false when the stream ends, on an error (see Err),
// or after Close.
func (s *Subscription) Next() bool {
	s.cur = Event{}
	if s.done {
		return false
	}
	for {
		resp, err := s.stream.Recv()
		if err == io.EOF {
			s.finish(s.asm.finish())
			return false
		}
		if err != nil {
			s.finish(toError(err))
			return false
		}
		if resp.GetMessage() == nil {
			s.cur = eventFrom(resp)
			return true
		}
		msg, ok := s.asm.feed(resp.GetMessage())
		if !ok { // the first of several pieces carries the event's fields
			if s.pending == nil {
				ev := eventFrom(resp)
				s.pending = &ev
			}
			continue
		}
		ev := eventFrom(resp)
		if s.pending != nil {
			ev, s.pending = *s.pending, nil
		}
		ev.Message = &msg
		s.cur = ev
		return true
	}
}

// Event returns the current event (valid after Next returned true).
func (s *Subscription) Event() Event { return s.cur }

// Err returns the error that ended the stream, or nil after a clean end or Close.
func (s *Subscription) Err() error { return s.err }

// Close cancels the stream. It is safe to call more than once.
func (s *Subscription) Close() error {
	s.cur, s.pending = Event{}, nil
	if !s.done {
		s.done = true
		s.cancel()
	}
	return nil
}

// All returns the subscription as a range-over-func sequence; breaking out closes it.
func (s *Subscription) All() iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		defer s.Close()
		for s.Next() {
			if !yield(s.Event(), nil) {
				return
			}
		}
		if err := s.Err(); err != nil {
			yield(Event{}, err)
		}
	}
}

func (s *Subscription) finish(err error) {
	s.err, s.done = err, true
	s.cancel()
}

func eventFrom(r *pb.SubscribeResponse) Event {
	return Event{
		Revision:   r.GetRevision(),
		Type:       ChangeType(r.GetType()),
		SessionID:  r.GetSessionId(),
		Inserted:   r.GetInserted(),
		ParentMode: ParentMode(r.GetParentMode()),
		ParentID:   r.GetParentId(),
		MessageIDs: r.GetMessageIds(),
		Compaction: compactionFrom(r.GetCompaction()),
		Error:      r.GetError(),
	}
}
