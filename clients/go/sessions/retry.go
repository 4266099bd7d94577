package sessions

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// RetryPolicy bounds how often, and how patiently, a failed call is tried again. The server
// refuses writes while it drains, moves an object or re-shards, and expects clients to come
// back; a connection can also drop under a call. Which failures are retried is fixed by the
// client (see WithRetry); the policy only says how long to keep going.
//
// A zero field takes its value from DefaultRetryPolicy, so a policy can name only what it
// changes.
type RetryPolicy struct {
	// MaxAttempts counts every try of a call, the first one included: 1 turns retries off, and
	// so does a negative value.
	MaxAttempts int
	// InitialBackoff is the wait after the first failed attempt, before jitter.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait after any failed attempt, before jitter.
	MaxBackoff time.Duration
	// Multiplier grows the wait after each further failed attempt. 0 takes the default (2); any
	// other value below 1, and NaN, is taken as 1, so waits never shrink. (Python's RetryPolicy refuses a
	// multiplier below 1 with ValueError, and the TypeScript client with a RangeError; Go clamps
	// it instead.)
	Multiplier float64
}

// DefaultRetryPolicy is the policy of a client dialled without WithRetry, shared by the Python
// and TypeScript clients: 10 attempts, waits from 50 ms doubling up to 2 s, about 9 s of waiting
// at worst. The wait after failed attempt n is min(MaxBackoff, InitialBackoff*Multiplier^(n-1))
// times a random factor in [0.5, 1], so clients refused together do not come back together.
var DefaultRetryPolicy = RetryPolicy{
	MaxAttempts:    10,
	InitialBackoff: 50 * time.Millisecond,
	MaxBackoff:     2 * time.Second,
	Multiplier:     2,
}

// RetryNotice describes a failed attempt that is about to be retried, for logs and metrics.
type RetryNotice struct {
	// Method is the RPC's name without its service, e.g. "AppendMessage" (an AppendMessage of a
	// message over 3 MiB reports "UploadMessage", the RPC it makes).
	Method string
	// Attempt is the number of the attempt that failed, from 1.
	Attempt int
	// Err is that attempt's failure, an *Error carrying the gRPC code and the ErrorInfo reason
	// (none for a transport failure).
	Err error
	// Delay is the wait chosen before the next attempt, jitter included.
	Delay time.Duration
}

// WithRetry replaces DefaultRetryPolicy. WithRetry(RetryPolicy{MaxAttempts: 1}) turns retries
// off: every failure then reaches the caller as the server or transport reported it.
//
// Whatever the policy, a call is retried only when the failure shows the server did nothing, or
// when repeating the call is harmless:
//   - refused before acting, for any call: UNAVAILABLE with reason DRAINING or OBJECT_MOVING,
//     FAILED_PRECONDITION with reason OBJECT_NOT_OWNED, RESOURCE_EXHAUSTED with reason SERVER_BUSY
//     (the server holds as much of messages being received or written as it takes);
//   - a transport failure (UNAVAILABLE without a reason: the request may or may not have been
//     carried out), only for reads and for writes idempotent by message id or value; never for
//     ClearMessages (it could remove messages others appended in between), AddCompaction and
//     Compact (a repeat adds a second compaction), or the admin calls.
//
// ImportMessages, whose items are in hand, is repeatable (an import skips the ids it holds) and
// sends them all again on each attempt; ImportMessagesSeq is never retried (its sequence need not
// yield twice), nor Subscribe, which reconnects by itself. A server-streaming read is retried only until its first response,
// since after that the caller has seen data a new attempt would repeat. The deadline of the call
// (the caller's context, or WithCallTimeout) covers every attempt and wait: the client never
// starts a wait that would end past it, and returns the last error instead.
func WithRetry(policy RetryPolicy) DialOption {
	return func(c *dialConfig) { c.retry = policy }
}

// WithRetryObserver calls observe before each wait between attempts, on the goroutine making the
// call; the wait's time runs while it does. Concurrent calls call it concurrently.
func WithRetryObserver(observe func(RetryNotice)) DialOption {
	return func(c *dialConfig) { c.retryObserver = observe }
}

// normalized fills the zero fields from DefaultRetryPolicy and clamps the others into range, so
// the retry loop needs no checks of its own.
func (p RetryPolicy) normalized() RetryPolicy {
	d := DefaultRetryPolicy
	switch {
	case p.MaxAttempts == 0:
		p.MaxAttempts = d.MaxAttempts
	case p.MaxAttempts < 0:
		p.MaxAttempts = 1
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = d.InitialBackoff
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = d.MaxBackoff
	}
	if p.Multiplier == 0 {
		p.Multiplier = d.Multiplier
	}
	p.InitialBackoff, p.MaxBackoff = max(p.InitialBackoff, 0), max(p.MaxBackoff, 0)
	if !(p.Multiplier >= 1) { // NaN too: max(NaN, 1) is NaN, which made every wait zero
		p.Multiplier = 1
	}
	return p
}

// delay is the wait after failed attempt n (from 1), jitter included. The growth is computed in
// floating point and capped before it becomes a Duration, which a large n would overflow.
func (p RetryPolicy) delay(n int) time.Duration {
	backoff := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(n-1))
	backoff = min(backoff, float64(p.MaxBackoff))
	return time.Duration(backoff * (0.5 + 0.5*rand.Float64()))
}

// retryClass is what a method may be retried after.
type retryClass uint8

const (
	// retryRefused: only after a refusal before acting.
	retryRefused retryClass = iota
	// retryRepeatable: also after a transport failure, the method being safe to repeat.
	retryRepeatable
	// retryNever: the call goes through untouched.
	retryNever
)

// retryClasses follows the contract shared with the Python and TypeScript clients. A method
// missing here (one added to the proto later) is retried after refusals only, or never when the
// caller streams its request.
var retryClasses = map[string]retryClass{
	// Reads.
	pb.SessionService_GetMessage_FullMethodName:          retryRepeatable,
	pb.SessionService_GetMessages_FullMethodName:         retryRepeatable,
	pb.SessionService_GetLatestLeaf_FullMethodName:       retryRepeatable,
	pb.SessionService_GetBranches_FullMethodName:         retryRepeatable,
	pb.SessionService_StreamHistory_FullMethodName:       retryRepeatable,
	pb.SessionService_GetRecentHistory_FullMethodName:    retryRepeatable,
	pb.SessionService_GetHistoryRowStats_FullMethodName:  retryRepeatable,
	pb.SessionService_ReadAttachment_FullMethodName:      retryRepeatable,
	pb.SessionService_ListCompactions_FullMethodName:     retryRepeatable,
	pb.SessionService_PlanCompaction_FullMethodName:      retryRepeatable,
	pb.SessionService_GetCompactionPolicy_FullMethodName: retryRepeatable,
	pb.SessionService_SearchMessages_FullMethodName:      retryRepeatable,
	pb.SessionService_ListSessions_FullMethodName:        retryRepeatable,
	pb.SessionService_GetObjectStats_FullMethodName:      retryRepeatable,
	// Writes idempotent by message id or by value. UploadMessage's frames are recorded and
	// re-sent: the client holds the whole message anyway.
	pb.SessionService_AppendMessage_FullMethodName:       retryRepeatable,
	pb.SessionService_AppendMessages_FullMethodName:      retryRepeatable,
	pb.SessionService_UploadMessage_FullMethodName:       retryRepeatable,
	pb.SessionService_UpdateMessage_FullMethodName:       retryRepeatable,
	pb.SessionService_UpsertMessage_FullMethodName:       retryRepeatable,
	pb.SessionService_DeleteMessages_FullMethodName:      retryRepeatable,
	pb.SessionService_SetCompactionPolicy_FullMethodName: retryRepeatable,
	// Not safe to repeat once the server may have acted.
	pb.SessionService_ClearMessages_FullMethodName: retryRefused,
	pb.SessionService_AddCompaction_FullMethodName: retryRefused,
	pb.SessionService_Compact_FullMethodName:       retryRefused,
	pb.SessionService_ListObjects_FullMethodName:   retryRefused,
	pb.SessionService_ExportObject_FullMethodName:  retryRefused,
	pb.SessionService_DeleteObject_FullMethodName:  retryRefused,
	pb.SessionService_AbortMove_FullMethodName:     retryRefused,
	pb.SessionService_VacuumObject_FullMethodName:  retryRefused,
	// The caller's request stream cannot be replayed, or the call retries by itself
	// (Session.ImportMessages makes its attempts from the items it holds).
	pb.SessionService_ImportMessages_FullMethodName: retryNever,
	pb.SessionService_ImportObject_FullMethodName:   retryNever,
	pb.SessionService_Subscribe_FullMethodName:      retryNever,
}

func retryClassOf(method string, clientStreams bool) retryClass {
	if class, ok := retryClasses[method]; ok {
		return class
	}
	if clientStreams {
		return retryNever
	}
	return retryRefused
}

// retryable reports whether a method of the class may be tried again after err. Anything not
// named here is final: DATA_LOSS with ReasonObjectDamaged above all (a damaged object file stays
// damaged until an operator acts), and STORAGE_FAILURE.
func retryable(class retryClass, err *Error) bool {
	switch {
	case tlsFailed(err):
		return false // the next handshake meets the same certificates (the TypeScript client agrees)
	case err.Code == codes.Unavailable && (err.Reason == ReasonDraining || err.Reason == ReasonObjectMoving):
		return true
	case err.Code == codes.FailedPrecondition && err.Reason == ReasonObjectNotOwned:
		return true
	case err.Code == codes.ResourceExhausted && err.Reason == ReasonServerBusy:
		return true
	case err.Code == codes.Unavailable && err.Reason == "":
		return class == retryRepeatable
	case err.Code == codes.Canceled && err.Reason == "":
		// Not the caller's (retryLoop.retry checks the context and the connection first): a
		// stopping server's gRPC cancels the calls that reached it, carried out or not.
		return class == retryRepeatable
	}
	return false
}

// retryConn retries the calls made through it, below the generated stub and above the
// connection. Wrapping the stub's connection rather than installing interceptors keeps retries
// on connections passed in with WithConn, and lets the caller's own interceptors see every
// attempt.
type retryConn struct {
	cc      grpc.ClientConnInterface
	policy  RetryPolicy
	observe func(RetryNotice)
	// closing is the client's (Client.closing): a call waiting to go again ends at once when
	// the client closes, as a call made after the close does, not after its wait.
	closing <-chan struct{}
}

// errClientClosing is how a wait to try again ends when its client closes: CANCELLED, with the
// words gRPC uses for a call made on a closed connection.
func errClientClosing() error {
	return toError(status.Error(codes.Canceled, "grpc: the client connection is closing"))
}

// Invoke makes a unary call, again after each retryable failure.
func (r *retryConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	class := retryClassOf(method, false)
	if class == retryNever {
		return r.cc.Invoke(ctx, method, args, reply, opts...)
	}
	loop := r.loop(ctx, method, class)
	for {
		err := r.cc.Invoke(ctx, method, args, reply, opts...)
		if err == nil {
			return nil
		}
		if err = loop.retry(err); err != nil {
			return err
		}
	}
}

// NewStream opens a stream that is opened again, and sent its request again, after a retryable
// failure that came before any response.
func (r *retryConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	class := retryClassOf(method, desc.ClientStreams)
	if class == retryNever {
		return r.cc.NewStream(ctx, desc, method, opts...)
	}
	s := &retryStream{conn: r, ctx: ctx, desc: desc, method: method, opts: opts, loop: r.loop(ctx, method, class)}
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

func (r *retryConn) loop(ctx context.Context, method string, class retryClass) *retryLoop {
	return &retryLoop{conn: r, ctx: ctx, method: method[strings.LastIndexByte(method, '/')+1:], class: class}
}

// retryLoop counts the attempts of one call and waits between them.
type retryLoop struct {
	conn     *retryConn
	ctx      context.Context
	method   string
	class    retryClass
	attempts int
}

// retry takes the failure of an attempt and returns nil once it is time for the next one, or
// the error to give the caller: err itself when it is not retryable, the attempts are used up
// or the wait would end past the call's deadline (a later attempt could not finish in time),
// and the context's error when the context ended during the wait.
func (l *retryLoop) retry(err error) error {
	l.attempts++
	failure := FromError(err)
	policy := l.conn.policy
	if l.attempts >= policy.MaxAttempts || !retryable(l.class, failure) || l.cancelledHere() {
		return err
	}
	delay := policy.delay(l.attempts)
	if deadline, ok := l.ctx.Deadline(); ok && time.Now().Add(delay).After(deadline) {
		return err
	}
	timer := time.NewTimer(delay) // started first: the observer's time counts as waiting
	defer timer.Stop()
	if l.conn.observe != nil {
		l.conn.observe(RetryNotice{Method: l.method, Attempt: l.attempts, Err: failure, Delay: delay})
	}
	select {
	case <-timer.C:
		return nil
	case <-l.ctx.Done():
		return toError(l.ctx.Err())
	case <-l.conn.closing:
		return errClientClosing()
	}
}

// cancelledHere reports whether this side ended the call: the caller's context, or the
// connection closed (Client.Close): its CANCELLED is then no failure to cure by trying again.
func (l *retryLoop) cancelledHere() bool {
	if l.ctx.Err() != nil {
		return true
	}
	conn, ok := l.conn.cc.(*grpc.ClientConn)
	return ok && conn.GetState() == connectivity.Shutdown
}

// retryStream is one streaming call across its attempts. The embedded stream is the current
// attempt's (Header, Trailer and Context come from it). The request messages are kept until the
// call ends, to be sent again on a new attempt: one for a server-streaming read, the pieces of
// the message for UploadMessage (which the caller holds anyway).
//
// A retry needs the whole request, so only a stream whose sending side was closed (CloseSend)
// is retried, and only while no response has been received.
type retryStream struct {
	grpc.ClientStream

	conn   *retryConn
	ctx    context.Context
	desc   *grpc.StreamDesc
	method string
	opts   []grpc.CallOption
	loop   *retryLoop

	sent       []any
	closed     bool // CloseSend was called: sent is the whole request
	sendFailed bool // the current attempt took no more messages; its status comes from RecvMsg
	received   bool
}

// open starts an attempt; a stream that could not even start (no connection) is retried here.
func (s *retryStream) open() error {
	for {
		stream, err := s.conn.cc.NewStream(s.ctx, s.desc, s.method, s.opts...)
		if err == nil {
			s.ClientStream, s.sendFailed = stream, false
			return nil
		}
		if err = s.loop.retry(err); err != nil {
			return err
		}
	}
}

// SendMsg records m for later attempts and sends it on the current one. When the current attempt
// has ended (gRPC's io.EOF) it still takes m and reports success, so the caller sends the whole
// request and a retry can replay all of it; the attempt's status comes from RecvMsg.
func (s *retryStream) SendMsg(m any) error {
	s.sent = append(s.sent, m)
	if s.sendFailed {
		return nil
	}
	err := s.ClientStream.SendMsg(m)
	if err == io.EOF {
		s.sendFailed = true
		return nil
	}
	return err
}

// CloseSend marks the request complete.
func (s *retryStream) CloseSend() error {
	s.closed = true
	return s.ClientStream.CloseSend()
}

// RecvMsg receives the next response; a retryable failure before the first one starts a new
// attempt with the same request.
func (s *retryStream) RecvMsg(m any) error {
	for {
		err := s.ClientStream.RecvMsg(m)
		if err == nil {
			s.received = true
			return nil
		}
		if err == io.EOF || s.received || !s.closed {
			return err
		}
		if err = s.loop.retry(err); err != nil {
			return err
		}
		if err = s.reopen(); err != nil {
			return err
		}
	}
}

// reopen starts a new attempt and sends it the request again.
func (s *retryStream) reopen() error {
	if err := s.open(); err != nil {
		return err
	}
	for _, m := range s.sent {
		if err := s.ClientStream.SendMsg(m); err != nil {
			if err == io.EOF {
				break // this attempt ended already: RecvMsg returns its status
			}
			return err
		}
	}
	return s.ClientStream.CloseSend()
}

// tlsFailed reports whether err is a connection whose TLS handshake failed: grpc-go's words for
// a handshake that crypto/tls or x509 refused (a server certificate not trusted or not valid now,
// a server's alert). A handshake cut by the network (EOF, a reset: a server stopping, a load
// balancer whose backend went away) is a connection failure, tried again as the Python and
// TypeScript clients do; so is a connection closed after its handshake (closedBeforeHTTP2), which a
// proxy ending TLS in front of an unreachable server does as well as a server refusing this
// client's certificate.
func tlsFailed(err *Error) bool {
	if err.Code != codes.Unavailable || err.Reason != "" {
		return false
	}
	_, refusal, found := strings.Cut(err.Message, "authentication handshake failed")
	return found && (strings.Contains(refusal, "tls:") || strings.Contains(refusal, "x509:"))
}
