// Package sessions is a thin Go client for the Sessions gRPC service (sessions.v1).
//
// The handle shape mirrors the Python client:
//
//	client, err := sessions.Dial(ctx, "127.0.0.1:50051")
//	defer client.Close()
//	s := client.Object("tenant-1/agent-7").Session("")
//	res, err := s.AppendMessage(ctx, json.RawMessage(`{"id":"m1","role":"user","parts":[]}`))
//	for msg, err := range s.History(ctx).All() { ... }
//
// Messages travel as JSON text and come back exactly as stored, as json.RawMessage. The client sends the
// routing metadata (x-object-key), asks long reads to pack up to 400 messages per response
// (max_messages_per_response), reassembles messages that the server sends in pieces, picks
// the client-streaming UploadMessage path for messages over 3 MiB, turns failures into
// *Error values carrying the gRPC code and the server's ErrorInfo reason, and retries calls the
// server refused before acting or lost in transport when repeating them is safe (WithRetry).
package sessions

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// ObjectKeyHeader is the request metadata that carries the percent-encoded object key, so a
// proxy can route on it without decoding protobuf.
const ObjectKeyHeader = "x-object-key"

// Client is a connection to a Sessions server. It is safe for concurrent use.
type Client struct {
	conn        *grpc.ClientConn
	ownsConn    bool
	stub        pb.SessionServiceClient
	callTimeout time.Duration
	token       string
	// retries is the stub's retrying connection, nil when retries are off; a call whose request
	// the connection cannot replay (ImportMessages) runs its own attempts through it.
	retries *retryConn
	// closing is closed by Close of a connection the client owns: whatever waits to try again
	// (a retried call, a subscription's reconnection) ends then instead of after its wait.
	closing   chan struct{}
	closeOnce sync.Once
}

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	grpcOpts         []grpc.DialOption
	creds            credentials.TransportCredentials
	conn             *grpc.ClientConn
	block            bool
	callTimeout      time.Duration
	token            string
	keepaliveTime    time.Duration
	keepaliveTimeout time.Duration
	retry            RetryPolicy
	retryObserver    func(RetryNotice)
}

// Keepalive defaults: while calls are open, the client pings a connection it has not heard
// from for 30 s and drops it when 10 s pass without an answer.
const (
	DefaultKeepaliveTime    = 30 * time.Second
	DefaultKeepaliveTimeout = 10 * time.Second
)

// MaxReconnectBackoff caps gRPC's wait between attempts to reconnect, which otherwise grows to
// 120 s while a server is away: after a 70 s outage calls failed for 36 s more once the server
// was back, past any retry policy. 3 s, with gRPC's 20% jitter, is within DefaultRetryPolicy's
// attempts (4.6 s at their shortest). Options given through WithGRPCOptions still win.
const MaxReconnectBackoff = 3 * time.Second

// WithKeepalive sets how long a connection may stay silent while calls are open before the
// client pings it (interval, at least 10 s: gRPC's floor), and how long it waits for the answer
// before failing those calls with UNAVAILABLE (timeout). Without pings, a stream whose server
// or network vanished without closing the connection (a Subscribe waiting for its next event)
// would wait forever. A zero interval turns pinging off.
func WithKeepalive(interval, timeout time.Duration) DialOption {
	return func(c *dialConfig) { c.keepaliveTime, c.keepaliveTimeout = interval, timeout }
}

// WithTransportCredentials sets the connection's credentials (TLS, mTLS). The default is an
// insecure (plaintext) connection, as the Python client's insecure_channel. A TLS connection the
// server closes after the handshake, before it speaks HTTP/2, is tried again as any connection
// failure (a proxy ending TLS in front of an unreachable server does that), and its error says
// that the server may have refused the handshake (most likely for want of a client certificate
// it trusts).
func WithTransportCredentials(creds credentials.TransportCredentials) DialOption {
	return func(c *dialConfig) { c.creds = creds }
}

// WithGRPCOptions passes extra options to grpc.NewClient (interceptors, per-RPC credentials, ...).
func WithGRPCOptions(opts ...grpc.DialOption) DialOption {
	return func(c *dialConfig) { c.grpcOpts = append(c.grpcOpts, opts...) }
}

// WithConn uses an existing connection instead of opening one; Close leaves it open.
func WithConn(conn *grpc.ClientConn) DialOption {
	return func(c *dialConfig) { c.conn = conn }
}

// WithToken sends `authorization: Bearer <token>` with every call, for servers that check
// bearer tokens. Use it with TLS (WithTransportCredentials) outside loopback.
func WithToken(token string) DialOption {
	return func(c *dialConfig) { c.token = token }
}

// WithBlock makes Dial wait until the connection is ready (or ctx ends) instead of connecting
// lazily on the first call.
func WithBlock() DialOption {
	return func(c *dialConfig) { c.block = true }
}

// WithCallTimeout bounds every call that returns a complete result (writes and collected reads:
// GetHistory, GetMessages, ListSessions with all its pages, ...) when the caller's context has no
// earlier deadline, retries and the waits between them included. Streaming iterators (History,
// HistoryBatches, Subscribe) are bounded only by their context.
func WithCallTimeout(d time.Duration) DialOption {
	return func(c *dialConfig) { c.callTimeout = d }
}

// Dial connects to a Sessions server at target (e.g. "127.0.0.1:50051" or "dns:///host:port").
func Dial(ctx context.Context, target string, opts ...DialOption) (*Client, error) {
	cfg := dialConfig{keepaliveTime: DefaultKeepaliveTime, keepaliveTimeout: DefaultKeepaliveTimeout, retry: DefaultRetryPolicy}
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := ctx.Err(); err != nil {
		return nil, toError(err)
	}
	client := &Client{conn: cfg.conn, callTimeout: cfg.callTimeout, token: cfg.token, closing: make(chan struct{})}
	if client.conn == nil {
		creds := cfg.creds
		if creds == nil {
			creds = insecure.NewCredentials()
		}
		creds = noticingRefusal(creds) // tells a refused client certificate from a network fault
		reconnect := backoff.DefaultConfig
		reconnect.MaxDelay = MaxReconnectBackoff
		grpcOpts := []grpc.DialOption{
			grpc.WithTransportCredentials(creds),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnect, MinConnectTimeout: 20 * time.Second}),
		}
		if cfg.keepaliveTime > 0 {
			params := keepalive.ClientParameters{Time: cfg.keepaliveTime, Timeout: cfg.keepaliveTimeout}
			grpcOpts = append(grpcOpts, grpc.WithKeepaliveParams(params))
		}
		grpcOpts = append(grpcOpts, cfg.grpcOpts...) // the caller's options come last and win
		conn, err := grpc.NewClient(target, grpcOpts...)
		if err != nil {
			return nil, toError(err)
		}
		client.conn = conn
		client.ownsConn = true
	}
	var cc grpc.ClientConnInterface = client.conn
	if policy := cfg.retry.normalized(); policy.MaxAttempts > 1 {
		client.retries = &retryConn{cc: client.conn, policy: policy, observe: cfg.retryObserver, closing: client.closing}
		cc = client.retries
	}
	client.stub = pb.NewSessionServiceClient(keyCheckedConn{cc})
	if cfg.block {
		if err := waitReady(ctx, client.conn); err != nil {
			_ = client.Close()
			return nil, err
		}
	}
	return client, nil
}

func waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		state := conn.GetState()
		if state == connectivity.Ready {
			return nil
		}
		if state == connectivity.Shutdown {
			return &Error{Code: codeUnavailable, Message: "connection is shut down"}
		}
		if !conn.WaitForStateChange(ctx, state) {
			return toError(ctx.Err())
		}
	}
}

// Close closes the connection (unless it was passed in with WithConn). Calls waiting to be tried
// again and subscriptions waiting to reconnect end at once, with CANCELLED.
func (c *Client) Close() error {
	if c.ownsConn && c.conn != nil {
		c.closeOnce.Do(func() { close(c.closing) })
		return c.conn.Close()
	}
	return nil
}

// Conn returns the underlying gRPC connection.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Stub returns the generated stub, for RPCs this package does not wrap. Add the routing
// metadata with CallContext. Calls through it are retried as the client's own are (WithRetry);
// stubs made on Conn() are not.
func (c *Client) Stub() pb.SessionServiceClient { return c.stub }

// Object returns a handle on one object (an isolated store) of the server.
func (c *Client) Object(key string) *Object {
	return &Object{client: c, key: key, escapedKey: EscapeObjectKey(key), tooLong: keyTooLong(key)}
}

// Object is one object on the server, named by its key.
type Object struct {
	client     *Client
	key        string
	escapedKey string
	tooLong    error // keyTooLong's: every call for the object fails so, unsent
}

// Key returns the object key.
func (o *Object) Key() string { return o.key }

// Session returns a handle on one session of the object ("" is the default session).
func (o *Object) Session(id string) *Session {
	return &Session{object: o, client: o.client, id: id}
}

// Session is one session inside an object. Handles are cheap values; make as many as needed.
type Session struct {
	object *Object
	client *Client
	id     string
}

// ID returns the session id.
func (s *Session) ID() string { return s.id }

// Object returns the session's object.
func (s *Session) Object() *Object { return s.object }

// CallContext returns ctx with the metadata this client sends on calls for the object key (the
// x-object-key routing header and the bearer token, if any), for calls made directly on Stub().
func (c *Client) CallContext(ctx context.Context, key string) context.Context {
	return c.Object(key).routed(ctx)
}

// EscapeObjectKey percent-encodes a key as Python's urllib.parse.quote(key, safe="") does:
// every byte of its UTF-8 form except ASCII letters, digits and "_.-~" becomes %XX (uppercase).
func EscapeObjectKey(key string) string {
	const hex = "0123456789ABCDEF"
	n := 0
	for i := 0; i < len(key); i++ {
		if !unreservedByte(key[i]) {
			n++
		}
	}
	if n == 0 {
		return key
	}
	out := make([]byte, 0, len(key)+2*n)
	for i := 0; i < len(key); i++ {
		b := key[i]
		if unreservedByte(b) {
			out = append(out, b)
			continue
		}
		out = append(out, '%', hex[b>>4], hex[b&0x0F])
	}
	return string(out)
}

func unreservedByte(b byte) bool {
	switch {
	case 'A' <= b && b <= 'Z', 'a' <= b && b <= 'z', '0' <= b && b <= '9':
		return true
	case b == '_', b == '.', b == '-', b == '~':
		return true
	}
	return false
}

// routed returns ctx carrying the object's routing metadata (and the bearer token, if any).
func (o *Object) routed(ctx context.Context) context.Context {
	if o.tooLong != nil {
		ctx = context.WithValue(ctx, refusedKey{}, o.tooLong)
	}
	if o.client.token != "" {
		return metadata.AppendToOutgoingContext(ctx, ObjectKeyHeader, o.escapedKey, "authorization", "Bearer "+o.client.token)
	}
	return metadata.AppendToOutgoingContext(ctx, ObjectKeyHeader, o.escapedKey)
}

// unaryCtx returns the context for a call that completes with a result: routed, and bounded by
// the client's call timeout when one is set.
func (o *Object) unaryCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return o.client.timeoutCtx(o.routed(ctx))
}

// timeoutCtx returns ctx bounded by the client's call timeout when one is set and ctx has no
// earlier deadline, for a call that returns a complete result. It adds no metadata: a read
// collected from a stream (GetHistory) passes it to the stream, which routes it.
func (c *Client) timeoutCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if d := c.callTimeout; d > 0 {
		if deadline, ok := ctx.Deadline(); !ok || time.Until(deadline) > d {
			return context.WithTimeout(ctx, d)
		}
	}
	return context.WithCancel(ctx)
}
