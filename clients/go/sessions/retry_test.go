package sessions_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
	"github.com/sessions-dev/sessions/clients/go/internal/testserver"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// fastRetry retries at once (1 ms waits), so transport-failure tests run in milliseconds.
var fastRetry = sessions.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}

// retryLog records the notices a client's observer receives, and counts the attempts its calls
// make on the connection (an interceptor below the retries sees each attempt).
type retryLog struct {
	mu       sync.Mutex
	notices  []sessions.RetryNotice
	attempts map[string]int
	// onNotice, when set, runs inside the observer (e.g. to release a move lock).
	onNotice func(sessions.RetryNotice)
}

func (l *retryLog) options() []sessions.DialOption {
	count := func(method string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.attempts == nil {
			l.attempts = map[string]int{}
		}
		l.attempts[method[strings.LastIndexByte(method, '/')+1:]]++
	}
	return []sessions.DialOption{
		sessions.WithRetryObserver(func(n sessions.RetryNotice) {
			l.mu.Lock()
			l.notices = append(l.notices, n)
			l.mu.Unlock()
			if l.onNotice != nil {
				l.onNotice(n)
			}
		}),
		sessions.WithGRPCOptions(
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				count(method)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				count(method)
				return streamer(ctx, desc, cc, method, opts...)
			}),
		),
	}
}

func (l *retryLog) seen() []sessions.RetryNotice {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sessions.RetryNotice(nil), l.notices...)
}

func (l *retryLog) attemptsOf(method string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.attempts[method]
}

// dialRetrying connects a client of its own to addr, recording into log.
func dialRetrying(t *testing.T, addr string, log *retryLog, opts ...sessions.DialOption) *sessions.Client {
	t.Helper()
	c, err := sessions.Dial(testCtx(t), addr, append(log.options(), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// deadAddr is a loopback address where nothing listens: every call fails UNAVAILABLE without a
// reason, as when a server is gone.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// lockForMove exports key with the move lock, reading the export to its end: the lock then stays
// for the lease (an hour), and the server refuses writes to key with OBJECT_MOVING until
// abortMove. The test's end releases it in any case.
func lockForMove(t *testing.T, key string) {
	t.Helper()
	ctx := testCtx(t)
	stream, err := client.Stub().ExportObject(client.CallContext(ctx, key), &pb.ExportObjectRequest{
		ObjectKey: key, LockForMove: true, LeaseSeconds: 3600,
	})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("ExportObject: %v", err)
		}
	}
	t.Cleanup(func() { _ = abortMove(context.Background(), key) })
}

func abortMove(ctx context.Context, key string) error {
	_, err := client.Stub().AbortMove(client.CallContext(ctx, key), &pb.AbortMoveRequest{ObjectKey: key})
	return err
}

// checkNotices checks that the notices are those of attempts 1..len(want) of method, each failed
// with its code and reason.
func checkNotices(t *testing.T, got []sessions.RetryNotice, method string, code codes.Code, reasons ...string) {
	t.Helper()
	if len(got) != len(reasons) {
		t.Fatalf("%d notices, want %d: %+v", len(got), len(reasons), got)
	}
	for i, n := range got {
		if n.Method != method || n.Attempt != i+1 || sessions.Code(n.Err) != code || sessions.Reason(n.Err) != reasons[i] {
			t.Errorf("notice %d = {%s attempt %d: %v}, want {%s attempt %d: %v [%s]}", i, n.Method, n.Attempt, n.Err, method, i+1, code, reasons[i])
		}
		var e *sessions.Error
		if !errors.As(n.Err, &e) {
			t.Errorf("notice %d: Err is a %T, want *sessions.Error", i, n.Err)
		}
	}
}

func TestRetryDefaultPolicy(t *testing.T) {
	want := sessions.RetryPolicy{MaxAttempts: 10, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 2 * time.Second, Multiplier: 2}
	if sessions.DefaultRetryPolicy != want {
		t.Fatalf("DefaultRetryPolicy = %+v, want %+v", sessions.DefaultRetryPolicy, want)
	}
}

// TestRetryAfterObjectMoving: a write refused with OBJECT_MOVING succeeds once the lock goes. The
// observer releases the lock when it hears of the refusal, so the second attempt must succeed
// and no timing is involved. The client runs with the default policy.
func TestRetryAfterObjectMoving(t *testing.T) {
	ctx := testCtx(t)
	key := objectKey(t)
	mustAppend(t, client.Object(key).Session("s"), textMessage("m0", "user", "creates the object"))
	lockForMove(t, key)

	log := &retryLog{}
	log.onNotice = func(n sessions.RetryNotice) {
		if len(log.seen()) == 1 {
			if err := abortMove(ctx, key); err != nil {
				t.Errorf("AbortMove: %v", err)
			}
		}
	}
	s := dialRetrying(t, server.Addr, log).Object(key).Session("s")
	res, err := s.AppendMessage(ctx, textMessage("m1", "user", "written during a move"))
	if err != nil {
		t.Fatalf("AppendMessage: %v", err)
	}
	if !res.Inserted {
		t.Fatal("the retried append did not insert")
	}
	notices := log.seen()
	checkNotices(t, notices, "AppendMessage", codes.Unavailable, sessions.ReasonObjectMoving)
	first := sessions.DefaultRetryPolicy.InitialBackoff
	if d := notices[0].Delay; d < first/2 || d > first {
		t.Errorf("first wait %v, want within [%v, %v] (the default policy with jitter)", d, first/2, first)
	}
	if got := collectHistory(t, client.Object(key).Session("s")); !equalStrings(got, []string{"m0", "m1"}) {
		t.Fatalf("history = %v", got)
	}
}

// TestRetryRefusedClearMessages: a refusal before acting is retried for every call, even one
// never repeated after a transport failure: the server did nothing.
func TestRetryRefusedClearMessages(t *testing.T) {
	ctx := testCtx(t)
	key := objectKey(t)
	mustAppend(t, client.Object(key).Session("s"), textMessage("m0", "user", "creates the object"))
	lockForMove(t, key)

	log := &retryLog{}
	log.onNotice = func(sessions.RetryNotice) {
		if err := abortMove(ctx, key); err != nil {
			t.Errorf("AbortMove: %v", err)
		}
	}
	s := dialRetrying(t, server.Addr, log).Object(key).Session("s")
	deleted, err := s.ClearMessages(ctx)
	if err != nil || deleted != 1 {
		t.Fatalf("ClearMessages during a move: deleted %d, %v; want 1 once the lock went", deleted, err)
	}
	checkNotices(t, log.seen(), "ClearMessages", codes.Unavailable, sessions.ReasonObjectMoving)
}

// TestRetryOffFailsObjectMoving: with retries off the refusal reaches the caller and nothing is
// written, although the observer would release the lock.
func TestRetryOffFailsObjectMoving(t *testing.T) {
	ctx := testCtx(t)
	key := objectKey(t)
	mustAppend(t, client.Object(key).Session("s"), textMessage("m0", "user", "creates the object"))
	lockForMove(t, key)

	log := &retryLog{onNotice: func(sessions.RetryNotice) { _ = abortMove(ctx, key) }}
	s := dialRetrying(t, server.Addr, log, sessions.WithRetry(sessions.RetryPolicy{MaxAttempts: 1})).Object(key).Session("s")
	_, err := s.AppendMessage(ctx, textMessage("m1", "user", "written during a move"))
	if sessions.Code(err) != codes.Unavailable || sessions.Reason(err) != sessions.ReasonObjectMoving {
		t.Fatalf("AppendMessage with retries off: %v, want UNAVAILABLE [OBJECT_MOVING]", err)
	}
	if n := log.seen(); len(n) != 0 || log.attemptsOf("AppendMessage") != 1 {
		t.Fatalf("retries off, yet %d attempts and notices %+v", log.attemptsOf("AppendMessage"), n)
	}
	if err := abortMove(ctx, key); err != nil {
		t.Fatal(err)
	}
	if got := collectHistory(t, client.Object(key).Session("s")); !equalStrings(got, []string{"m0"}) {
		t.Fatalf("history = %v, want only m0", got)
	}
}

// TestRetryReplaysUpload: a message over 3 MiB goes through the client-streaming UploadMessage in
// pieces; a retry must send every piece again, so the stored message is byte-exact.
func TestRetryReplaysUpload(t *testing.T) {
	ctx := testCtx(t)
	key := objectKey(t)
	mustAppend(t, client.Object(key).Session("s"), textMessage("m0", "user", "creates the object"))
	lockForMove(t, key)

	log := &retryLog{}
	log.onNotice = func(sessions.RetryNotice) {
		if err := abortMove(ctx, key); err != nil {
			t.Errorf("AbortMove: %v", err)
		}
	}
	big := textMessage("big", "user", strings.Repeat("0123456789abcdef", (sessions.PieceBytes+sessions.PieceBytes/2)/16))
	s := dialRetrying(t, server.Addr, log).Object(key).Session("s")
	if _, err := s.AppendMessage(ctx, big); err != nil {
		t.Fatalf("AppendMessage of %d bytes: %v", len(big), err)
	}
	checkNotices(t, log.seen(), "UploadMessage", codes.Unavailable, sessions.ReasonObjectMoving)
	msg, found, err := client.Object(key).Session("s").GetMessage(ctx, "big")
	if err != nil || !found {
		t.Fatalf("GetMessage: found %v, %v", found, err)
	}
	if string(msg.JSON) != string(big) {
		t.Fatalf("stored %d bytes, sent %d: the retry did not send the message whole", len(msg.JSON), len(big))
	}
}

// TestRetryImportMessages: ImportMessages holds its items and sends them all again when refused
// before acting; ImportMessagesSeq, whose sequence need not yield twice, is not retried.
func TestRetryImportMessages(t *testing.T) {
	ctx := testCtx(t)
	key := objectKey(t)
	mustAppend(t, client.Object(key).Session("s"), textMessage("m0", "user", "creates the object"))
	lockForMove(t, key)

	log := &retryLog{onNotice: func(sessions.RetryNotice) { _ = abortMove(ctx, key) }}
	s := dialRetrying(t, server.Addr, log).Object(key).Session("s")
	chain := sessions.ImportChain(textMessage("i1", "user", "imported"), textMessage("i2", "assistant", "too"))
	res, err := s.ImportMessages(ctx, chain)
	if err != nil || res.Imported != 2 {
		t.Fatalf("ImportMessages during a move: %+v, %v; want both imported after the lock", res, err)
	}
	checkNotices(t, log.seen(), "ImportMessages", codes.Unavailable, sessions.ReasonObjectMoving)
	if n := log.attemptsOf("ImportMessages"); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}

	lockForMove(t, key)
	_, err = s.ImportMessagesSeq(ctx, slices.Values(sessions.ImportChain(textMessage("i3", "user", "lazy"))))
	if sessions.Code(err) != codes.Unavailable || sessions.Reason(err) != sessions.ReasonObjectMoving {
		t.Fatalf("ImportMessagesSeq during a move: %v, want UNAVAILABLE [OBJECT_MOVING]", err)
	}
	if n := log.attemptsOf("ImportMessages"); n != 3 {
		t.Fatalf("ImportMessagesSeq was retried: %d attempts in all, want 3", n)
	}
	if err := abortMove(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, found, err := s.GetMessage(ctx, "i3"); err != nil || found {
		t.Fatalf("the refused lazy import stored i3 (found %v, %v)", found, err)
	}
}

// TestRetryObjectNotOwned: FAILED_PRECONDITION [OBJECT_NOT_OWNED] (re-sharding) is retried, up to
// the policy's attempts. An object deleted as moved elsewhere answers it for good.
func TestRetryObjectNotOwned(t *testing.T) {
	ctx := testCtx(t)
	key := objectKey(t)
	mustAppend(t, client.Object(key).Session("s"), textMessage("m0", "user", "creates the object"))
	if _, err := client.Stub().DeleteObject(client.CallContext(ctx, key), &pb.DeleteObjectRequest{ObjectKey: key, MovedTo: "elsewhere:1"}); err != nil {
		t.Fatal(err)
	}
	log := &retryLog{}
	s := dialRetrying(t, server.Addr, log, sessions.WithRetry(fastRetry)).Object(key).Session("s")
	_, err := s.AppendMessage(ctx, textMessage("m1", "user", "to a moved object"))
	if sessions.Code(err) != codes.FailedPrecondition || sessions.Reason(err) != sessions.ReasonObjectNotOwned {
		t.Fatalf("AppendMessage to a moved object: %v, want FAILED_PRECONDITION [OBJECT_NOT_OWNED]", err)
	}
	checkNotices(t, log.seen(), "AppendMessage", codes.FailedPrecondition, sessions.ReasonObjectNotOwned, sessions.ReasonObjectNotOwned)
	if n := log.attemptsOf("AppendMessage"); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
}

// heldUpload streams a message of about size bytes of text through the raw UploadMessage (on
// the connection, so never retried) and holds back its last piece until release is closed: until
// then the server holds what came of it. It returns the call's outcome.
func heldUpload(ctx context.Context, c *sessions.Client, key, session string, size int, release <-chan struct{}) (*pb.UploadMessageResponse, error) {
	stream, err := pb.NewSessionServiceClient(c.Conn()).UploadMessage(c.CallContext(ctx, key))
	if err != nil {
		return nil, err
	}
	header := &pb.UploadHeader{
		ObjectKey: key, SessionId: session,
		Operation: pb.UploadOperation_UPLOAD_OPERATION_APPEND, Source: pb.Source_SOURCE_SERVER,
	}
	const piece = 256 * 1024
	frames := []*pb.UploadMessageRequest{{Header: header, JsonPiece: `{"id":"held","role":"user","parts":[{"type":"text","text":"`}}
	for range size / piece {
		frames = append(frames, &pb.UploadMessageRequest{JsonPiece: strings.Repeat("h", piece)})
	}
	for _, frame := range frames {
		if err := stream.Send(frame); err != nil {
			_, err = stream.CloseAndRecv() // the server ended the stream: its status
			return nil, err
		}
	}
	select {
	case <-release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := stream.Send(&pb.UploadMessageRequest{JsonPiece: `"}]}`}); err != nil {
		_, err = stream.CloseAndRecv()
		return nil, err
	}
	return stream.CloseAndRecv()
}

// assemblyBytes reads the sessions_assembly_bytes gauge from a server's Prometheus endpoint.
func assemblyBytes(ctx context.Context, metricsAddr string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if value, ok := strings.CutPrefix(line, "sessions_assembly_bytes "); ok {
			return strconv.ParseFloat(strings.TrimSpace(value), 64)
		}
	}
	return 0, fmt.Errorf("no sessions_assembly_bytes on %s/metrics", metricsAddr)
}

// TestRetryServerBusy: an upload whose last piece is held back keeps 7 MiB of the server's 8 MiB
// for messages being received or written, so a 2 MiB append is refused RESOURCE_EXHAUSTED
// [SERVER_BUSY] before anything is done. The observer releases the upload and waits for it to
// be stored (its bytes given back) before the next attempt, which must then land, after the
// uploaded message. A message larger than the whole budget is refused for good
// (LIMIT_EXCEEDED), without a retry.
func TestRetryServerBusy(t *testing.T) {
	const budget = 8 * 1024 * 1024
	metricsAddr, err := testserver.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	busy, err := testserver.Start("--max-assembly-bytes", strconv.Itoa(budget), "--metrics-listen", metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log (tail):\n%s", busy.LogTail(4000))
		}
		_ = busy.Stop()
	})
	ctx := testCtx(t)
	key := objectKey(t)

	holder, err := sessions.Dial(ctx, busy.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Close() })
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseUpload := func() { releaseOnce.Do(func() { close(release) }) }
	var (
		uploaded  *pb.UploadMessageResponse
		uploadErr error
	)
	uploadDone := make(chan struct{})
	go func() {
		defer close(uploadDone)
		uploaded, uploadErr = heldUpload(ctx, holder, key, "s", 7*1024*1024, release)
	}()
	t.Cleanup(func() { releaseUpload(); <-uploadDone }) // runs before the server stops

	// Wait (polling, with a deadline) until the server holds the upload's 7 MiB.
	deadline := time.Now().Add(30 * time.Second)
	for {
		held, err := assemblyBytes(ctx, metricsAddr)
		if err == nil && held >= 7*1024*1024 {
			break
		}
		select {
		case <-uploadDone:
			t.Fatalf("the held upload ended before the server held its bytes: %v, %v", uploaded, uploadErr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not hold the upload's 7 MiB within 30 s: %v bytes (%v)", held, err)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
	}

	log := &retryLog{onNotice: func(sessions.RetryNotice) {
		releaseUpload()
		<-uploadDone // the upload is stored and its bytes given back before the next attempt
	}}
	s := dialRetrying(t, busy.Addr, log).Object(key).Session("s")
	res, err := s.AppendMessage(ctx, textMessage("m1", "user", strings.Repeat("t", 2*1024*1024)))
	if err != nil {
		t.Fatalf("AppendMessage of 2 MiB while the server was busy: %v", err)
	}
	if uploadErr != nil || !uploaded.GetInserted() {
		t.Fatalf("the held upload: inserted %v, %v", uploaded.GetInserted(), uploadErr)
	}
	if !res.Inserted || res.Message.Info.ParentID != "held" {
		t.Fatalf("retried append: Inserted=%v parent %q; want a new message after the upload's (held)", res.Inserted, res.Message.Info.ParentID)
	}
	checkNotices(t, log.seen(), "AppendMessage", codes.ResourceExhausted, sessions.ReasonServerBusy)
	if n := log.attemptsOf("AppendMessage"); n != 2 {
		t.Fatalf("%d AppendMessage attempts, want 2", n)
	}

	// Larger than the whole budget: no other call holds any of it, and no retry could help.
	_, err = s.AppendMessage(ctx, textMessage("huge", "user", strings.Repeat("t", 9*1024*1024)))
	if sessions.Code(err) != codes.ResourceExhausted || sessions.Reason(err) != sessions.ReasonLimitExceeded {
		t.Fatalf("AppendMessage of 9 MiB: %v, want RESOURCE_EXHAUSTED [LIMIT_EXCEEDED]", err)
	}
	if n := log.seen(); len(n) != 1 || log.attemptsOf("UploadMessage") != 1 {
		t.Fatalf("the message over the budget was retried: %d UploadMessage attempts, notices %+v", log.attemptsOf("UploadMessage"), n)
	}
	if got := collectHistory(t, s); !equalStrings(got, []string{"held", "m1"}) {
		t.Fatalf("history = %v, want [held m1]", got)
	}
}

// TestRetryNotOtherErrors: an error the server answers after looking at the request is final.
func TestRetryNotOtherErrors(t *testing.T) {
	log := &retryLog{}
	s := dialRetrying(t, server.Addr, log, sessions.WithRetry(fastRetry)).Object(objectKey(t)).Session("s")
	_, err := s.AppendMessage(testCtx(t), "not json")
	if sessions.Code(err) != codes.InvalidArgument {
		t.Fatalf("AppendMessage of invalid JSON: %v", err)
	}
	if n := log.seen(); len(n) != 0 || log.attemptsOf("AppendMessage") != 1 {
		t.Fatalf("an INVALID_ARGUMENT was retried: %d attempts, notices %+v", log.attemptsOf("AppendMessage"), n)
	}
}

// TestRetryTransportFailureByMethod calls every method against a port where nothing listens: the
// methods safe to repeat are tried exactly MaxAttempts times, the others once.
func TestRetryTransportFailureByMethod(t *testing.T) {
	addr := deadAddr(t)
	big := textMessage("big", "user", strings.Repeat("x", sessions.UnaryLimitBytes))
	msg := textMessage("m1", "user", "hello")
	type call func(ctx context.Context, c *sessions.Client, s *sessions.Session) error
	cases := []struct {
		rpc        string
		repeatable bool
		call       call
	}{
		{"GetMessage", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, _, err := s.GetMessage(ctx, "m1")
			return err
		}},
		{"GetMessages", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.GetMessages(ctx, []string{"m1"})
			return err
		}},
		{"GetLatestLeaf", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, _, err := s.GetLatestLeaf(ctx)
			return err
		}},
		{"GetBranches", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.GetBranches(ctx, "m1")
			return err
		}},
		{"StreamHistory", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.GetHistory(ctx)
			return err
		}},
		{"GetRecentHistory", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.GetRecentHistory(ctx, 1000)
			return err
		}},
		{"GetHistoryRowStats", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.GetHistoryRowStats(ctx)
			return err
		}},
		{"ReadAttachment", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.Object().ReadAttachment(ctx, strings.Repeat("0", 64))
			return err
		}},
		{"ListCompactions", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.ListCompactions(ctx)
			return err
		}},
		{"PlanCompaction", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, _, err := s.PlanCompaction(ctx, 0)
			return err
		}},
		{"GetCompactionPolicy", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.GetCompactionPolicy(ctx)
			return err
		}},
		{"SearchMessages", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.Search(ctx, "hello", sessions.SearchOptions{})
			return err
		}},
		{"ListSessions", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.Object().ListSessions(ctx)
			return err
		}},
		{"GetObjectStats", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.Object().GetObjectStats(ctx)
			return err
		}},
		{"AppendMessage", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.AppendMessage(ctx, msg)
			return err
		}},
		{"AppendMessages", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.AppendMessages(ctx, []any{msg})
			return err
		}},
		{"UploadMessage", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.AppendMessage(ctx, big)
			return err
		}},
		{"UpdateMessage", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.UpdateMessage(ctx, msg)
			return err
		}},
		{"UpsertMessage", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.UpsertMessage(ctx, msg)
			return err
		}},
		{"DeleteMessages", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.DeleteMessages(ctx, "m1")
			return err
		}},
		{"SetCompactionPolicy", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.SetCompactionPolicy(ctx, sessions.CompactionPolicy{KeepRecentTokens: 1000})
			return err
		}},
		{"ClearMessages", false, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.ClearMessages(ctx)
			return err
		}},
		{"AddCompaction", false, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.AddCompaction(ctx, "summary", "m1", "m1")
			return err
		}},
		{"Compact", false, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.Compact(ctx)
			return err
		}},
		{"ImportMessages", true, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			_, err := s.ImportMessages(ctx, sessions.ImportChain(msg))
			return err
		}},
		{"Subscribe", false, func(ctx context.Context, _ *sessions.Client, s *sessions.Session) error {
			sub := s.Subscribe(ctx, sessions.WithReconnectAttempts(0))
			defer sub.Close()
			for sub.Next() {
			}
			return sub.Err()
		}},
		{"AbortMove", false, func(ctx context.Context, c *sessions.Client, s *sessions.Session) error {
			_, err := c.Stub().AbortMove(c.CallContext(ctx, s.Object().Key()), &pb.AbortMoveRequest{ObjectKey: s.Object().Key()})
			return err
		}},
		{"ExportObject", false, func(ctx context.Context, c *sessions.Client, s *sessions.Session) error {
			stream, err := c.Stub().ExportObject(c.CallContext(ctx, s.Object().Key()), &pb.ExportObjectRequest{ObjectKey: s.Object().Key()})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.rpc, func(t *testing.T) {
			log := &retryLog{}
			c := dialRetrying(t, addr, log, sessions.WithRetry(fastRetry))
			err := tc.call(testCtx(t), c, c.Object("dead/"+tc.rpc).Session("s"))
			if sessions.Code(err) != codes.Unavailable || sessions.Reason(err) != "" {
				t.Fatalf("error %v, want UNAVAILABLE without a reason", err)
			}
			if tc.repeatable {
				checkNotices(t, log.seen(), tc.rpc, codes.Unavailable, "", "")
				if n := log.attemptsOf(tc.rpc); n != fastRetry.MaxAttempts {
					t.Fatalf("%d attempts, want %d", n, fastRetry.MaxAttempts)
				}
				return
			}
			if n := log.seen(); len(n) != 0 {
				t.Fatalf("retried after a transport failure: %+v", n)
			}
			if n := log.attemptsOf(tc.rpc); n != 1 {
				t.Fatalf("%d attempts, want 1", n)
			}
		})
	}
}

// TestRetryBackoffSchedule: the wait after failed attempt n is min(max, initial*multiplier^(n-1))
// times a factor in [0.5, 1].
func TestRetryBackoffSchedule(t *testing.T) {
	policy := sessions.RetryPolicy{MaxAttempts: 6, InitialBackoff: time.Millisecond, MaxBackoff: 8 * time.Millisecond, Multiplier: 2}
	log := &retryLog{}
	s := dialRetrying(t, deadAddr(t), log, sessions.WithRetry(policy)).Object(objectKey(t)).Session("s")
	if _, _, err := s.GetMessage(testCtx(t), "m1"); sessions.Code(err) != codes.Unavailable {
		t.Fatalf("GetMessage: %v", err)
	}
	notices := log.seen()
	checkNotices(t, notices, "GetMessage", codes.Unavailable, "", "", "", "", "")
	for i, ceiling := range []time.Duration{1, 2, 4, 8, 8} {
		ceiling *= time.Millisecond
		if d := notices[i].Delay; d < ceiling/2 || d > ceiling {
			t.Errorf("wait after attempt %d = %v, want within [%v, %v]", i+1, d, ceiling/2, ceiling)
		}
	}
}

// TestRetryMultiplierBelowOneIsOne: a Multiplier below 1, or NaN, is taken as 1, so waits never
// shrink (Python refuses such a policy, TypeScript throws a RangeError; Go clamps, as
// documented). NaN passed the clamp and made every wait zero.
func TestRetryMultiplierBelowOneIsOne(t *testing.T) {
	for _, multiplier := range []float64{0.25, math.NaN()} {
		t.Run(fmt.Sprint(multiplier), func(t *testing.T) {
			policy := sessions.RetryPolicy{MaxAttempts: 5, InitialBackoff: 4 * time.Millisecond, MaxBackoff: time.Second, Multiplier: multiplier}
			log := &retryLog{}
			s := dialRetrying(t, deadAddr(t), log, sessions.WithRetry(policy)).Object(objectKey(t)).Session("s")
			if _, _, err := s.GetMessage(testCtx(t), "m1"); sessions.Code(err) != codes.Unavailable {
				t.Fatalf("GetMessage: %v", err)
			}
			notices := log.seen()
			checkNotices(t, notices, "GetMessage", codes.Unavailable, "", "", "", "")
			for i, n := range notices {
				if n.Delay < 2*time.Millisecond || n.Delay > 4*time.Millisecond {
					t.Errorf("wait after attempt %d = %v, want within [2ms, 4ms] (multiplier taken as 1)", i+1, n.Delay)
				}
			}
		})
	}
}

// TestRetryDeadlineBoundsAttempts: the call's deadline covers every attempt and wait, for the
// client's call timeout and for a streaming read's context alike. The policy would wait about
// 7 s; the call must end around its 300 ms deadline, with the last attempt's error (or, should
// the last wait end just at the deadline, DEADLINE_EXCEEDED).
func TestRetryDeadlineBoundsAttempts(t *testing.T) {
	policy := sessions.RetryPolicy{MaxAttempts: 100, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Multiplier: 1}
	check := func(t *testing.T, log *retryLog, started time.Time, err error) {
		t.Helper()
		if code := sessions.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			t.Fatalf("error %v, want UNAVAILABLE", err)
		}
		if n := len(log.seen()); n == 0 || n >= policy.MaxAttempts-1 {
			t.Fatalf("%d retries within a 300 ms deadline", n)
		}
		if elapsed := time.Since(started); elapsed > 3*time.Second {
			t.Fatalf("the call took %v with a 300 ms deadline", elapsed)
		}
	}
	t.Run("call timeout", func(t *testing.T) {
		log := &retryLog{}
		s := dialRetrying(t, deadAddr(t), log, sessions.WithRetry(policy), sessions.WithCallTimeout(300*time.Millisecond)).Object(objectKey(t)).Session("s")
		started := time.Now()
		_, _, err := s.GetMessage(testCtx(t), "m1")
		check(t, log, started, err)
	})
	t.Run("stream context", func(t *testing.T) {
		log := &retryLog{}
		s := dialRetrying(t, deadAddr(t), log, sessions.WithRetry(policy)).Object(objectKey(t)).Session("s")
		ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
		defer cancel()
		started := time.Now()
		it := s.History(ctx)
		defer it.Close()
		for it.Next() {
		}
		check(t, log, started, it.Err())
	})
}

// TestRetryNoWaitPastDeadline: a wait that would end past the deadline is not started; the
// caller gets the failure at once, not DEADLINE_EXCEEDED later.
func TestRetryNoWaitPastDeadline(t *testing.T) {
	policy := sessions.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, MaxBackoff: time.Minute}
	log := &retryLog{}
	s := dialRetrying(t, deadAddr(t), log, sessions.WithRetry(policy)).Object(objectKey(t)).Session("s")
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	_, _, err := s.GetMessage(ctx, "m1")
	if sessions.Code(err) != codes.Unavailable {
		t.Fatalf("error %v, want the attempt's UNAVAILABLE", err)
	}
	if n := log.seen(); len(n) != 0 || log.attemptsOf("GetMessage") != 1 {
		t.Fatalf("%d attempts, notices %+v: a 30-60 s wait cannot fit in 10 s", log.attemptsOf("GetMessage"), n)
	}
}

// TestRetryCancelEndsWait: cancelling the context ends a wait at once.
func TestRetryCancelEndsWait(t *testing.T) {
	policy := sessions.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, MaxBackoff: time.Minute}
	ctx, cancel := context.WithCancel(t.Context()) // no deadline: the wait is 30-60 s
	defer cancel()
	log := &retryLog{onNotice: func(sessions.RetryNotice) { cancel() }}
	s := dialRetrying(t, deadAddr(t), log, sessions.WithRetry(policy)).Object(objectKey(t)).Session("s")
	started := time.Now()
	_, err := s.AppendMessage(ctx, textMessage("m1", "user", "hello"))
	if sessions.Code(err) != codes.Canceled {
		t.Fatalf("error %v, want CANCELLED", err)
	}
	if elapsed := time.Since(started); elapsed > 20*time.Second {
		t.Fatalf("the call ended %v after its context was cancelled during a wait", elapsed)
	}
	if n := log.seen(); len(n) != 1 {
		t.Fatalf("notices %+v, want one", n)
	}
}

// TestRetryCloseEndsWait: Client.Close ends a wait at once, and the call fails CANCELLED as one
// made after the close does (it slept out its wait first: the client audit saw 1-2 s).
func TestRetryCloseEndsWait(t *testing.T) {
	policy := sessions.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour, MaxBackoff: time.Hour}
	var client *sessions.Client
	closed := make(chan struct{})
	log := &retryLog{onNotice: func(sessions.RetryNotice) {
		go func() { _ = client.Close(); close(closed) }()
	}}
	client = dialRetrying(t, deadAddr(t), log, sessions.WithRetry(policy))
	// No deadline: one would end an hour's wait before it began (TestRetryNoWaitPastDeadline).
	_, _, err := client.Object(objectKey(t)).Session("s").GetMessage(t.Context(), "m1")
	<-closed
	if sessions.Code(err) != codes.Canceled {
		t.Fatalf("error %v, want CANCELLED", err)
	}
	if n := log.seen(); len(n) != 1 {
		t.Fatalf("notices %+v, want one", n)
	}
}

// cutAt is where a cutProxy cuts a call.
type cutAt int

const (
	// cutAtAnswer drops the connection when a response starts: a call that reached the server
	// and got no answer.
	cutAtAnswer cutAt = iota
	// cutAfterFirstMessage drops it once the call's first response message has been relayed.
	cutAfterFirstMessage
	// cutWithoutStatus relays the response's headers, then ends the call's stream with an empty
	// DATA frame without trailers, as HAProxy ends a call whose server connection failed under
	// it, and drops the connection.
	cutWithoutStatus
)

// cutProxy relays TCP connections to the server and cuts calls short (cutAt). It cuts the first
// `cuts` calls it sees; after that it only relays. It reads the HTTP/2 frames the server sends
// to know where a response starts.
type cutProxy struct {
	listener net.Listener
	target   string
	at       cutAt

	mu    sync.Mutex
	cuts  int
	conns []net.Conn
}

func newCutProxy(t *testing.T, cuts int, at cutAt) *cutProxy {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{listener: listener, target: server.Addr, cuts: cuts, at: at}
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) addr() string { return p.listener.Addr().String() }

func (p *cutProxy) accept() {
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		go p.relayRequests(client, server)
		go p.relayResponses(server, client.(*net.TCPConn))
	}
}

func (p *cutProxy) takeCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cuts == 0 {
		return false
	}
	p.cuts--
	return true
}

func (p *cutProxy) relayRequests(client, server net.Conn) {
	_, _ = io.Copy(server, client)
	// After a cut, read until the client hangs up: closing a socket with unread data would reset
	// the connection and could lose what was relayed to the client before the cut.
	_, _ = io.Copy(io.Discard, client)
	_ = client.Close()
	_ = server.Close()
}

// relayResponses copies the server's frames to the client until it cuts the connection: the
// server's side closed, the client's side half-closed, so the client reads every byte relayed
// and then the end of the connection.
func (p *cutProxy) relayResponses(server net.Conn, client *net.TCPConn) {
	defer func() {
		_ = server.Close()
		_ = client.CloseWrite()
	}()
	const frameData, frameHeaders, flagEndStream, flagPadded = 0x0, 0x1, 0x1, 0x8
	r := bufio.NewReader(server)
	var (
		watched  uint32 // the stream to cut after its first message (cutAfterFirstMessage)
		body     []byte // the watched stream's DATA so far, up to the first message's prefix
		received int    // bytes of the watched stream's DATA so far
	)
	for {
		frame := make([]byte, 9)
		if _, err := io.ReadFull(r, frame); err != nil {
			return
		}
		length := int(frame[0])<<16 | int(frame[1])<<8 | int(frame[2])
		kind, flags, stream := frame[3], frame[4], binary.BigEndian.Uint32(frame[5:9])&0x7fffffff
		frame = append(frame, make([]byte, length)...)
		if _, err := io.ReadFull(r, frame[9:]); err != nil {
			return
		}
		if kind == frameHeaders && stream != 0 && watched == 0 && p.takeCut() {
			switch p.at {
			case cutAtAnswer:
				return // the response's headers never reach the client
			case cutWithoutStatus:
				end := []byte{0, 0, 0, frameData, flagEndStream, 0, 0, 0, 0}
				binary.BigEndian.PutUint32(end[5:], stream)
				_, _ = client.Write(append(frame, end...))
				return
			}
			watched = stream
		}
		if _, err := client.Write(frame); err != nil {
			return
		}
		if kind != frameData || stream != watched {
			continue
		}
		data := frame[9:]
		if flags&flagPadded != 0 && len(data) > 0 {
			data = data[1 : len(data)-int(data[0])]
		}
		received += len(data)
		if len(body) < 5 {
			body = append(body, data[:min(len(data), 5-len(body))]...)
		}
		// A gRPC message is a 5-byte prefix (a flag and the length) and the message.
		if len(body) == 5 && received >= 5+int(binary.BigEndian.Uint32(body[1:5])) {
			return
		}
	}
}

func (p *cutProxy) close() {
	_ = p.listener.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, conn := range p.conns {
		_ = conn.Close()
	}
}

// lostAnswers are the ways a cutProxy loses a call's answer after the server took the call.
var lostAnswers = []struct {
	name string
	at   cutAt
}{
	{"connection dropped", cutAtAnswer},
	// HAProxy's end of a call whose shard stopped under it, which grpc-go reports as INTERNAL
	// ("server closed the stream without sending trailers"): the client took it for the
	// server's answer and tried nothing again.
	{"ended without a status", cutWithoutStatus},
}

// TestRetryStreamBeforeFirstResponse: a streaming read whose connection drops (or whose stream a
// proxy ends without a status) after the server took the request but before any response is
// read again, on a new connection, and returns the whole path once.
func TestRetryStreamBeforeFirstResponse(t *testing.T) {
	for _, lost := range lostAnswers {
		t.Run(lost.name, func(t *testing.T) {
			key := objectKey(t)
			want := []string{"a", "b", "c"}
			for _, id := range want {
				mustAppend(t, client.Object(key).Session("s"), textMessage(id, "user", id))
			}
			log := &retryLog{}
			s := dialRetrying(t, newCutProxy(t, 1, lost.at).addr(), log, sessions.WithRetry(fastRetry)).Object(key).Session("s")
			if got := collectHistory(t, s); !equalStrings(got, want) {
				t.Fatalf("history = %v, want %v", got, want)
			}
			checkNotices(t, log.seen(), "StreamHistory", codes.Unavailable, "")
			if n := log.attemptsOf("StreamHistory"); n != 2 {
				t.Fatalf("%d attempts, want 2", n)
			}
		})
	}
}

// TestRetryStreamNotAfterFirstResponse: once a response has arrived the caller has seen data,
// so a failure is the caller's: no retry (which would repeat the messages already returned).
func TestRetryStreamNotAfterFirstResponse(t *testing.T) {
	key := objectKey(t)
	msgs := make([]any, 450) // more than one response holds (400)
	for i := range msgs {
		msgs[i] = textMessage(fmt.Sprintf("m%03d", i), "user", "x")
	}
	if _, err := client.Object(key).Session("s").AppendMessages(testCtx(t), msgs); err != nil {
		t.Fatal(err)
	}
	log := &retryLog{}
	s := dialRetrying(t, newCutProxy(t, 1, cutAfterFirstMessage).addr(), log, sessions.WithRetry(fastRetry)).Object(key).Session("s")
	it := s.History(testCtx(t))
	defer it.Close()
	read := 0
	for it.Next() {
		read++
	}
	if sessions.Code(it.Err()) != codes.Unavailable {
		t.Fatalf("history read %d messages and ended with %v, want UNAVAILABLE", read, it.Err())
	}
	if read == 0 || read >= len(msgs) {
		t.Fatalf("read %d of %d messages before the cut, want some but not all", read, len(msgs))
	}
	if n := log.seen(); len(n) != 0 || log.attemptsOf("StreamHistory") != 1 {
		t.Fatalf("retried after a response: %d attempts, notices %+v", log.attemptsOf("StreamHistory"), n)
	}
}

// TestSubscribeResumesAfterAStreamEndedWithoutStatus: a subscription whose stream HAProxy ended
// without a status (its shard stopped under it) ended there, INTERNAL; it reconnects now, as
// after any failed connection, and misses nothing.
func TestSubscribeResumesAfterAStreamEndedWithoutStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
	defer cancel()
	key := objectKey(t)
	proxy := newCutProxy(t, 1, cutWithoutStatus)
	through := dialRetrying(t, proxy.addr(), &retryLog{})
	sub := liveSubscription(t, ctx, through.Object(key).Session("s").Subscribe) // the second stream
	mustAppend(t, client.Object(key).Session("s"), textMessage("m1", "user", "after the cut"))
	ev := nextEvent(t, sub)
	for ev.Type == sessions.ChangeProgress {
		ev = nextEvent(t, sub)
	}
	if ev.Type != sessions.ChangeAppend || ev.Message.Info.ID != "m1" {
		t.Fatalf("event = %v, want the append of m1", ev.Type)
	}
	if proxy.takeCut() {
		t.Fatal("the proxy cut no stream")
	}
}

// TestRetryAfterLostResponse: a call whose response was lost may have been carried out. An
// append is retried and finds its own message (Inserted=false, the documented caveat); a
// ClearMessages is not retried, though the server did clear, and fails UNAVAILABLE.
func TestRetryAfterLostResponse(t *testing.T) {
	ctx := testCtx(t)
	for _, lost := range lostAnswers {
		t.Run(lost.name+"/append", func(t *testing.T) {
			key := objectKey(t)
			log := &retryLog{}
			s := dialRetrying(t, newCutProxy(t, 1, lost.at).addr(), log, sessions.WithRetry(fastRetry)).Object(key).Session("s")
			res, err := s.AppendMessage(ctx, textMessage("m1", "user", "hello"))
			if err != nil {
				t.Fatalf("AppendMessage: %v", err)
			}
			checkNotices(t, log.seen(), "AppendMessage", codes.Unavailable, "")
			if res.Inserted || res.Message.Info.ID != "m1" {
				t.Fatalf("retried append: Inserted=%v id %q; want the message its first attempt stored (Inserted=false)", res.Inserted, res.Message.Info.ID)
			}
			if got := collectHistory(t, client.Object(key).Session("s")); !equalStrings(got, []string{"m1"}) {
				t.Fatalf("history = %v, want [m1]", got)
			}
		})
		t.Run(lost.name+"/clear", func(t *testing.T) {
			key := objectKey(t)
			mustAppend(t, client.Object(key).Session("s"), textMessage("m1", "user", "hello"))
			log := &retryLog{}
			s := dialRetrying(t, newCutProxy(t, 1, lost.at).addr(), log, sessions.WithRetry(fastRetry)).Object(key).Session("s")
			_, err := s.ClearMessages(ctx)
			if sessions.Code(err) != codes.Unavailable || sessions.Reason(err) != "" {
				t.Fatalf("ClearMessages with its response lost: %v, want UNAVAILABLE without a reason", err)
			}
			if lost.at == cutWithoutStatus && !strings.Contains(err.Error(), "without the server's status") {
				t.Errorf("error %q does not say the call ended without the server's status", err)
			}
			if n := log.seen(); len(n) != 0 || log.attemptsOf("ClearMessages") != 1 {
				t.Fatalf("ClearMessages was retried: %d attempts, notices %+v", log.attemptsOf("ClearMessages"), n)
			}
			if got := collectHistory(t, client.Object(key).Session("s")); len(got) != 0 {
				t.Fatalf("history = %v: the lost ClearMessages was carried out, expected empty", got)
			}
		})
	}
}

// cutFirstAttempts ends the first attempt of each method CANCELLED without sending it, as a
// stopping server's gRPC ends the calls that reached it; an interceptor below the retries, so
// the retries see it as they would the server's answer, with the real server behind.
func cutFirstAttempts() sessions.DialOption {
	var mu sync.Mutex
	cut := map[string]bool{}
	return sessions.WithGRPCOptions(grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			mu.Lock()
			first := !cut[method]
			cut[method] = true
			mu.Unlock()
			if first {
				return status.Error(codes.Canceled, "the server stopped")
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
}

// TestRetryCancelledByTheServer: a drain audit found a write that reached a stopping server
// ended CANCELLED, not stored and not tried again, so it was lost. A CANCELLED the caller did not
// make is a connection failure: a repeatable call is tried again, ClearMessages is not; the
// caller's own cancellation is never tried again.
func TestRetryCancelledByTheServer(t *testing.T) {
	ctx := testCtx(t)
	key := objectKey(t)
	log := &retryLog{}
	s := dialRetrying(t, server.Addr, log, sessions.WithRetry(fastRetry), cutFirstAttempts()).Object(key).Session("s")
	if res, err := s.AppendMessage(ctx, textMessage("m1", "user", "cut once")); err != nil || !res.Inserted {
		t.Fatalf("AppendMessage = %+v, %v; want inserted after a retry", res, err)
	}
	checkNotices(t, log.seen(), "AppendMessage", codes.Canceled, "")
	if _, err := s.ClearMessages(ctx); sessions.Code(err) != codes.Canceled {
		t.Fatalf("ClearMessages: %v, want CANCELLED (not tried again)", err)
	}
	if n := log.attemptsOf("ClearMessages"); n != 1 {
		t.Fatalf("ClearMessages made %d attempts, want 1", n)
	}
	if got := collectHistory(t, client.Object(key).Session("s")); !equalStrings(got, []string{"m1"}) {
		t.Fatalf("history = %v", got)
	}

	own := &retryLog{}
	mine := dialRetrying(t, server.Addr, own, sessions.WithRetry(fastRetry)).Object(key).Session("s")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := mine.AppendMessage(cancelled, textMessage("m2", "user", "never sent")); sessions.Code(err) != codes.Canceled {
		t.Fatalf("AppendMessage with a cancelled context: %v, want CANCELLED", err)
	}
	if len(own.seen()) != 0 {
		t.Fatalf("the caller's own cancellation was retried: %+v", own.seen())
	}
}
