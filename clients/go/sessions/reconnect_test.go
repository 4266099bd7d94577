package sessions_test

// Subscribe's reconnect budget (WithReconnectAttempts: failures in a row) against a proxy that
// accepts every stream and fails it soon after. Every Subscribe stream (here: on an object never
// written) opens with a PROGRESS, the "subscribed"
// acknowledgement, which alone is no sign that the stream works: only something more (an event,
// or a second PROGRESS a progress interval later) ends a row of failures and resets the count
// (and the backoff). Counting the acknowledgement made the client reconnect forever at its
// shortest backoff.

import (
	"context"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
	"github.com/sessions-dev/sessions/clients/go/internal/testserver"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

const (
	reconnectAttempts = 2
	failingStreams    = 2*reconnectAttempts + 1 // more failures than the attempts allow in a row
	unlimited         = 1 << 30
	progressType      = "CHANGE_TYPE_PROGRESS"
)

// failingRelay is a gRPC server on a loopback port implementing only Subscribe: it relays each
// stream to a real sessions-server and fails stream n (from 1), while n <= failing, with
// UNAVAILABLE as soon as the change types it forwarded satisfy cut; later streams are relayed
// whole. Streams past limit are refused FAILED_PRECONDITION (no reason to reconnect), so that a
// client which would reconnect forever fails a test at once instead of hanging.
type failingRelay struct {
	pb.UnimplementedSessionServiceServer
	addr     string
	upstream pb.SessionServiceClient
	cut      func(forwarded []string) bool
	failing  int
	limit    int
	// forgetful makes every stream resume from revision 1, which no feed knows: as after a
	// server that restarted since the client's last revision, each stream opens with RESET.
	forgetful bool
	// failure ends a failing stream (nil: UNAVAILABLE, as a backend that went away).
	failure error

	mu      sync.Mutex
	streams [][]string // per stream, the change types it forwarded
}

func startRelay(t *testing.T, target string, cut func([]string) bool, failing, limit int) *failingRelay {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &failingRelay{addr: lis.Addr().String(), upstream: pb.NewSessionServiceClient(conn), cut: cut, failing: failing, limit: limit}
	srv := grpc.NewServer()
	pb.RegisterSessionServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r
}

func (r *failingRelay) Subscribe(req *pb.SubscribeRequest, stream grpc.ServerStreamingServer[pb.SubscribeResponse]) error {
	r.mu.Lock()
	r.streams = append(r.streams, []string{})
	n := len(r.streams)
	r.mu.Unlock()
	if n > r.limit {
		return status.Error(codes.FailedPrecondition, "relay: too many Subscribe streams")
	}
	ctx := stream.Context()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if key := md.Get("x-object-key"); len(key) > 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-object-key", key[0])
		}
	}
	if r.forgetful {
		req.ResumeAfterRevision = 1
	}
	up, err := r.upstream.Subscribe(ctx, req)
	if err != nil {
		return err
	}
	for {
		resp, err := up.Recv()
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.streams[n-1] = append(r.streams[n-1], resp.GetType().String())
		forwarded := slices.Clone(r.streams[n-1])
		r.mu.Unlock()
		if err := stream.Send(resp); err != nil {
			return err
		}
		if n <= r.failing && r.cut(forwarded) {
			if r.failure != nil {
				return r.failure
			}
			return status.Error(codes.Unavailable, "relay: the backend went away")
		}
	}
}

// recorded returns a copy of what each stream forwarded so far.
func (r *failingRelay) recorded() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([][]string, len(r.streams))
	for i, s := range r.streams {
		out[i] = slices.Clone(s)
	}
	return out
}

func afterOne(forwarded []string) bool { return len(forwarded) >= 1 }
func afterTwo(forwarded []string) bool { return len(forwarded) >= 2 }

func dialRelay(t *testing.T, ctx context.Context, r *failingRelay) *sessions.Client {
	t.Helper()
	c, err := sessions.Dial(ctx, r.addr, sessions.WithBlock())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func repeated(stream []string, n int) [][]string {
	out := make([][]string, n)
	for i := range out {
		out[i] = stream
	}
	return out
}

// TestSubscribeGivesUpOnStreamsFailedAfterTheirAcknowledgement: every stream delivers the
// server's opening PROGRESS, then fails. The subscription gives up with UNAVAILABLE after
// reconnectAttempts reconnections (attempts + 1 streams).
func TestSubscribeGivesUpOnStreamsFailedAfterTheirAcknowledgement(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
	defer cancel()
	relay := startRelay(t, server.Addr, afterOne, unlimited, reconnectAttempts+3)
	c := dialRelay(t, ctx, relay)
	sub := c.Object(objectKey(t)).Subscribe(ctx, sessions.IncludeProgress(), sessions.WithReconnectAttempts(reconnectAttempts))
	defer sub.Close()
	seen := 0
	for sub.Next() {
		if ev := sub.Event(); ev.Type != sessions.ChangeProgress {
			t.Fatalf("event %v, want only PROGRESS", ev.Type)
		}
		seen++
		if seen > reconnectAttempts+1 {
			t.Fatalf("still reconnecting after %d streams", len(relay.recorded()))
		}
	}
	if err := sub.Err(); sessions.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "relay: the backend went away") {
		t.Fatalf("ended with %v, want the relay's UNAVAILABLE", err)
	}
	if seen != reconnectAttempts+1 {
		t.Fatalf("%d PROGRESS events, want %d", seen, reconnectAttempts+1)
	}
	if got, want := relay.recorded(), repeated([]string{progressType}, reconnectAttempts+1); !reflect.DeepEqual(got, want) {
		t.Fatalf("streams forwarded %v, want %v", got, want)
	}
}

// TestSubscribeGivesUpOnStreamsThatOpenWithAReset: a resume the server cannot place opens with
// RESET instead of PROGRESS; streams failed after that opening must use up the attempts too. A
// review: only a PROGRESS was taken for the opening, so each RESET reset the count and the
// subscription reconnected forever.
func TestSubscribeGivesUpOnStreamsThatOpenWithAReset(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
	defer cancel()
	relay := startRelay(t, server.Addr, afterOne, unlimited, reconnectAttempts+3)
	relay.forgetful = true
	c := dialRelay(t, ctx, relay)
	sub := c.Object(objectKey(t)).Subscribe(ctx, sessions.ResumeAfter(1), sessions.WithReconnectAttempts(reconnectAttempts))
	defer sub.Close()
	seen := 0
	for sub.Next() {
		if ev := sub.Event(); ev.Type != sessions.ChangeReset {
			t.Fatalf("event %v, want only RESET", ev.Type)
		}
		seen++
		if seen > reconnectAttempts+1 {
			t.Fatalf("still reconnecting after %d streams", len(relay.recorded()))
		}
	}
	if err := sub.Err(); sessions.Code(err) != codes.Unavailable {
		t.Fatalf("ended with %v, want the relay's UNAVAILABLE", err)
	}
	if got, want := relay.recorded(), repeated([]string{"CHANGE_TYPE_RESET"}, reconnectAttempts+1); !reflect.DeepEqual(got, want) {
		t.Fatalf("streams forwarded %v, want %v", got, want)
	}
}

// TestSubscribeGivesUpWithProgressDropped: the same with PROGRESS dropped (the default): Next
// returns false with the error, having seen no event.
func TestSubscribeGivesUpWithProgressDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
	defer cancel()
	relay := startRelay(t, server.Addr, afterOne, unlimited, reconnectAttempts+3)
	c := dialRelay(t, ctx, relay)
	sub := c.Object(objectKey(t)).Subscribe(ctx, sessions.WithReconnectAttempts(1))
	defer sub.Close()
	if sub.Next() {
		t.Fatalf("an event: %+v", sub.Event())
	}
	if err := sub.Err(); sessions.Code(err) != codes.Unavailable {
		t.Fatalf("ended with %v after %d streams, want UNAVAILABLE after 2", err, len(relay.recorded()))
	}
	if n := len(relay.recorded()); n != 2 {
		t.Fatalf("%d streams, want 2", n)
	}
}

// TestSubscribeStreamThatLivedResetsTheAttempts: streams cut after their second PROGRESS (they
// lived a progress interval), more of them than reconnectAttempts. Each counts as progress, so
// a long-lived subscription cut now and then keeps reconnecting, and goes on on the stream that
// stays. The server sends PROGRESS every 50 ms when idle.
func TestSubscribeStreamThatLivedResetsTheAttempts(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
	defer cancel()
	chatty, err := testserver.Start("--progress-seconds", "0.05")
	if err != nil {
		t.Fatal(err)
	}
	defer chatty.Stop()
	relay := startRelay(t, chatty.Addr, afterTwo, failingStreams, unlimited)
	c := dialRelay(t, ctx, relay)
	sub := c.Object(objectKey(t)).Subscribe(ctx, sessions.IncludeProgress(), sessions.WithReconnectAttempts(reconnectAttempts))
	defer sub.Close()
	for {
		if !sub.Next() {
			t.Fatalf("ended with %v after streams %v", sub.Err(), relay.recorded())
		}
		if streams := relay.recorded(); len(streams) > failingStreams && len(streams[len(streams)-1]) >= 3 {
			break // the stream that stays delivered three PROGRESS events
		}
	}
	streams := relay.recorded()
	if len(streams) != failingStreams+1 {
		t.Fatalf("%d streams, want %d", len(streams), failingStreams+1)
	}
	if want := repeated([]string{progressType, progressType}, failingStreams); !reflect.DeepEqual(streams[:failingStreams], want) {
		t.Fatalf("failing streams forwarded %v, want %v", streams[:failingStreams], want)
	}
}

// TestCallsAndASubscriptionRideThroughConnectionAge: a server run with
// --max-connection-age-seconds asks each connection to go once that old (GOAWAY) and closes it
// under the calls still open after the grace. New calls go on a new connection and the
// subscription resumes after the last revision it saw: every append arrives once, in order.
func TestCallsAndASubscriptionRideThroughConnectionAge(t *testing.T) {
	srv, err := testserver.Start("--max-connection-age-seconds", "0.3", "--max-connection-age-grace-seconds", "0.3")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx := testCtx(t)
	var log retryLog
	object := dialRetrying(t, srv.Addr, &log).Object("aging")
	events := object.Subscribe(ctx, sessions.IncludeProgress())
	defer events.Close()
	if !events.Next() || events.Event().Type != sessions.ChangeProgress {
		t.Fatalf("subscription: %+v, %v; want its PROGRESS", events.Event(), events.Err())
	}
	var appended []string
	// Past several ages and graces (0.33 s + 0.3 s at most each): each connection is replaced.
	for start := time.Now(); time.Since(start) < 3*time.Second || len(appended) < 20; {
		id := "m" + strconv.Itoa(len(appended))
		if _, err := object.Session("").AppendMessage(ctx, textMessage(id, "user", "hi")); err != nil {
			t.Fatalf("append %d across connection ages: %v", len(appended), err)
		}
		appended = append(appended, id)
	}
	var seen []string
	for len(seen) < len(appended) {
		if !events.Next() {
			t.Fatalf("subscription ended after %d of %d appends: %v", len(seen), len(appended), events.Err())
		}
		if ev := events.Event(); ev.Type == sessions.ChangeAppend {
			seen = append(seen, ev.Message.Info.ID)
		}
	}
	if !slices.Equal(seen, appended) {
		t.Fatalf("the subscription saw %d appends, not the %d made in order", len(seen), len(appended))
	}
	if opened := log.attemptsOf("Subscribe"); opened < 2 {
		t.Fatalf("the subscription was opened %d times: the connection it was on was never closed", opened)
	}
}
