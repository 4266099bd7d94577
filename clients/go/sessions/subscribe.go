package sessions

import (
	"context"
	"io"
	"iter"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// defaultReconnectAttempts is how many times in a row Subscribe reconnects before giving up. A
// stream that delivered more than the PROGRESS opening every stream (an event, or a second
// PROGRESS) ends a row; one that fails after that PROGRESS alone counts as a failure.
const defaultReconnectAttempts = 20

// Subscription streams an object's change events in commit order, one at a time. When the
// server drains or restarts, when the object moves to another shard, or when a proxy ends the
// stream (UNKNOWN), it reconnects by itself, resuming after the last revision seen; a
// ChangeReset event means events were missed (re-read state, then continue). PROGRESS events
// are dropped unless IncludeProgress is given. Not safe for concurrent use.
type Subscription struct {
	ctx             context.Context
	cancel          context.CancelFunc
	stub            pb.SessionServiceClient
	conn            *grpc.ClientConn // its client's: once shut down (Close), nothing to reconnect to
	closing         <-chan struct{}  // its client's Client.closing
	key             string
	sessionID       *string
	attachments     pb.AttachmentMode
	includeProgress bool
	maxAttempts     int

	stream       grpc.ServerStreamingClient[pb.SubscribeResponse]
	streamCancel context.CancelFunc
	attempts     int
	acknowledged bool // the current stream delivered its first PROGRESS (the "subscribed")
	last         uint64
	asm          assembler
	pending      *Event
	cur          Event
	err          error
	done         bool
}

// Subscribe streams the changes of every session of the object. It starts live (from the next
// event) unless ResumeAfter is given, and runs until ctx ends or Close. One dropped without
// Close is cancelled once garbage-collected, as the history iterators are; Close is the way.
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
	maxAttempts := defaultReconnectAttempts
	if ro.reconnectAttempts != nil {
		maxAttempts = *ro.reconnectAttempts
	}
	sub := &Subscription{
		ctx:             sctx,
		cancel:          cancel,
		stub:            o.client.stub,
		conn:            o.client.conn,
		closing:         o.client.closing,
		key:             o.key,
		sessionID:       sessionID,
		attachments:     attachmentMode(ro),
		includeProgress: ro.includeProgress,
		maxAttempts:     maxAttempts,
		last:            ro.resumeAfter,
	}
	cancelWhenDropped(sub, cancel)
	return sub
}

// Next waits for the next event. It returns false when the server ends the stream, on an error
// that reconnecting did not cure (see Err), when ctx ends, or after Close.
func (s *Subscription) Next() bool {
	s.cur = Event{}
	for !s.done {
		if s.stream == nil {
			if err := s.connect(); err != nil {
				s.retryOrFinish(err)
				continue
			}
		}
		resp, err := s.stream.Recv()
		if err == io.EOF {
			s.finish(s.asm.finish())
			return false
		}
		if err != nil {
			s.retryOrFinish(toError(err))
			continue
		}
		ev, complete := s.feed(resp)
		if !complete {
			continue
		}
		// A stream opens with a PROGRESS (a resume that missed events with a RESET), which alone
		// is no sign that it works: a proxy could accept every stream and fail it at once. Only
		// what follows it (an event, or a second PROGRESS a progress interval later) ends a row
		// of failed attempts.
		if (ev.Type == ChangeProgress || ev.Type == ChangeReset) && !s.acknowledged {
			s.acknowledged = true
		} else {
			s.attempts = 0
		}
		s.last = ev.Revision // everything up to it has been delivered (or reset)
		if ev.Type == ChangeProgress && !s.includeProgress {
			continue
		}
		s.cur = ev
		return true
	}
	return false
}

// Revision returns the revision of the last event received (PROGRESS included): pass it to
// ResumeAfter to continue a later subscription where this one stopped.
func (s *Subscription) Revision() uint64 { return s.last }

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

func (s *Subscription) connect() error {
	sctx, cancel := context.WithCancel(s.ctx)
	stream, err := s.stub.Subscribe(sctx, &pb.SubscribeRequest{
		ObjectKey:           s.key,
		SessionId:           s.sessionID,
		ResumeAfterRevision: s.last,
		Attachments:         s.attachments,
	})
	if err != nil {
		cancel()
		return toError(err)
	}
	s.stream, s.streamCancel = stream, cancel
	return nil
}

// retryOrFinish drops the current stream and, when resubscribable(err), waits and reconnects;
// any other error ends the subscription, and so does the last one allowed by its attempts.
func (s *Subscription) retryOrFinish(err error) {
	s.dropStream()
	if s.ctx.Err() != nil {
		s.finish(toError(s.ctx.Err()))
		return
	}
	// Client.Close ends the stream with CANCELLED, as a server going away can: reconnecting to a
	// closed connection failed the same way for every attempt (20, about 33 s).
	closed := s.conn != nil && s.conn.GetState() == connectivity.Shutdown
	if closed || !resubscribable(err) || s.attempts >= s.maxAttempts {
		s.finish(err)
		return
	}
	s.attempts++
	select {
	case <-time.After(resubscribeWait(s.attempts)):
	case <-s.ctx.Done():
		s.finish(toError(s.ctx.Err()))
	case <-s.closing:
		s.finish(errClientClosing())
	}
}

// resubscribeWait is resubscribeDelay; a test stretches it to see what ends a wait.
var resubscribeWait = resubscribeDelay

// resubscribeDelay is the wait before a subscription's reconnection attempt n (from 1): 0.1 s
// doubling to 2 s, times a random factor from 0.5 to 1, so that the subscribers of a server that
// went away do not all come back at the same instant.
func resubscribeDelay(n int) time.Duration {
	backoff := min(2*time.Second, 50*time.Millisecond<<min(n, 6)) // 3.2 s at 6: no overflow past it
	return time.Duration(float64(backoff) * (0.5 + 0.5*rand.Float64()))
}

// resubscribable reports whether a subscription resumes after err (a resume repeats nothing, so
// any failure that says nothing about the subscription itself will do), as Python's
// may_resubscribe:
//   - the server went away: UNAVAILABLE, or CANCELLED (one the caller or Client.Close made is
//     checked for by retryOrFinish);
//   - it refused before acting, as every call is retried after (retryable's refusals: draining,
//     the object moving or moved to another shard, busy): after a move the old owner refuses the
//     key (FAILED_PRECONDITION, OBJECT_NOT_OWNED) until the proxy routes it to the new owner,
//     whose feed answers the resume with a RESET;
//   - a proxy ended the stream without the server's status: UNKNOWN without a reason (nginx's
//     "Stream removed" when the shard's connection closed under it).
func resubscribable(err error) bool {
	e := FromError(err)
	switch {
	case tlsFailed(e):
		return false // the next handshake would fail alike
	case e.Code == codes.Unavailable || e.Code == codes.Canceled:
		return true
	case retryable(retryRefused, e): // a refusal before acting, and nothing else, for this class
		return true
	}
	return e.Code == codes.Unknown && e.Reason == ""
}

func (s *Subscription) dropStream() {
	if s.streamCancel != nil {
		s.streamCancel()
	}
	s.stream, s.streamCancel, s.pending = nil, nil, nil
	s.asm = assembler{}
	s.acknowledged = false
}

// feed joins the frames of one event; the first frame carries the event's fields.
func (s *Subscription) feed(resp *pb.SubscribeResponse) (Event, bool) {
	if resp.GetMessage() == nil {
		return eventFrom(resp), true
	}
	if s.pending == nil {
		ev := eventFrom(resp)
		s.pending = &ev
	}
	msg, ok := s.asm.feed(resp.GetMessage())
	if !ok {
		return Event{}, false
	}
	ev := *s.pending
	s.pending = nil
	ev.Message = &msg
	return ev, true
}

func (s *Subscription) finish(err error) {
	if s.done {
		return
	}
	s.err, s.done = err, true
	s.dropStream()
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
