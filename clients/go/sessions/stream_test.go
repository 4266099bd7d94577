package sessions_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"

	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// bigMessage returns a message of about size bytes whose text mixes emoji (4-byte UTF-8), CJK
// (3-byte), accented letters (2-byte), ASCII and characters JSON must escape, so piece cuts fall
// inside multi-byte characters unless the code cuts on boundaries.
func bigMessage(id string, size int) json.RawMessage {
	const pattern = "😀中文テキスト한국어 é ascii \"q\" \\ \n\t 🎉🧪 終わり"
	head := fmt.Sprintf(`{"id":%q,"role":"user","parts":[{"type":"text","text":"`, id)
	tail := `"}]}`
	var b strings.Builder
	b.Grow(size + len(pattern)*2)
	b.WriteString(head)
	for b.Len() < size-len(tail) {
		quoted, _ := json.Marshal(pattern)
		b.Write(quoted[1 : len(quoted)-1])
	}
	b.WriteString(tail)
	return json.RawMessage(b.String())
}

func TestTwentyMegabyteMessageRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	big := bigMessage("big", 20*1024*1024)
	if !json.Valid(big) || !utf8.Valid(big) || len(big) < 20*1024*1024 {
		t.Fatalf("test message is not what it should be (%d bytes)", len(big))
	}
	mustAppend(t, s, textMessage("before", "user", "small"))

	res := mustAppend(t, s, big) // over 3 MiB: goes through UploadMessage
	if !res.Inserted || res.Message.Info.ID != "big" || res.Message.Info.ParentID != "before" {
		t.Fatalf("append = inserted %v info %+v", res.Inserted, res.Message.Info)
	}
	if !bytes.Equal(res.Message.JSON, big) {
		t.Fatalf("append returned %d bytes, want the %d sent", len(res.Message.JSON), len(big))
	}
	mustAppend(t, s, textMessage("after", "assistant", "small"))

	got, found, err := s.GetMessage(ctx, "big")
	if err != nil || !found || !bytes.Equal(got.JSON, big) {
		t.Fatalf("GetMessage: found %v err %v, %d bytes, equal %v", found, err, len(got.JSON), bytes.Equal(got.JSON, big))
	}
	if got.Info.ID != "big" || got.Info.Role != "user" || got.Info.ParentID != "before" {
		t.Fatalf("info of a large message = %+v", got.Info)
	}
	several, err := s.GetMessages(ctx, []string{"after", "big", "before"})
	if err != nil || !equalStrings(ids(several), []string{"after", "big", "before"}) || !bytes.Equal(several[1].JSON, big) {
		t.Fatalf("GetMessages with a large message: %v %v", ids(several), err)
	}
	branches, err := s.GetBranches(ctx, "before")
	if err != nil || len(branches) != 1 || !bytes.Equal(branches[0].JSON, big) {
		t.Fatalf("GetBranches with a large message: %v", err)
	}

	it := s.History(ctx)
	var seen []string
	for it.Next() {
		m := it.Message()
		seen = append(seen, m.Info.ID)
		if m.Info.ID == "big" && !bytes.Equal(m.JSON, big) {
			t.Fatalf("history returned the large message as %d bytes", len(m.JSON))
		}
		if it.Held() != 1 {
			t.Fatalf("Held() = %d", it.Held())
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if !equalStrings(seen, []string{"before", "big", "after"}) {
		t.Fatalf("history = %v", seen)
	}
	if it.Frames() <= 3 {
		t.Fatalf("a 20 MB message should arrive in several frames, got %d frames in all", it.Frames())
	}

	recent, err := s.GetRecentHistory(ctx, 100*1024*1024)
	if err != nil || len(recent.Messages) != 3 || !bytes.Equal(recent.Messages[1].JSON, big) {
		t.Fatalf("recent history with a large message: %v", err)
	}
	var batched [][]string
	for batch, err := range s.HistoryBatches(ctx, sessions.WithMaxBatchBytes(1024)).All() {
		if err != nil {
			t.Fatal(err)
		}
		batched = append(batched, ids(batch))
		for _, m := range batch {
			if m.Info.ID == "big" && !bytes.Equal(m.JSON, big) {
				t.Fatal("batched history returned a different large message")
			}
		}
	}
	if len(batched) != 3 {
		t.Fatalf("batches = %v, want each message alone", batched)
	}

	// Large updates and upserts take the streaming path too.
	big2 := bytes.Replace(big, []byte("😀"), []byte("🙂"), 1) // same size, new content
	upd, err := s.UpdateMessage(ctx, big2)
	if err != nil || !upd.Found || !upd.Changed || !bytes.Equal(upd.Message.JSON, big2) {
		t.Fatalf("large update: %v found %v changed %v", err, upd.Found, upd.Changed)
	}
	missing, err := s.UpdateMessage(ctx, bigMessage("nope", 4*1024*1024))
	if err != nil || missing.Found {
		t.Fatalf("large update of a missing id: %+v %v", missing.Found, err)
	}
	ups, err := s.UpsertMessage(ctx, bigMessage("big-upsert", 4*1024*1024), sessions.WithParent("before"))
	if err != nil || !ups.Inserted || ups.Message.Info.ParentID != "before" {
		t.Fatalf("large upsert: %v %+v", err, ups.Message.Info)
	}
	dup := mustAppend(t, s, big2)
	if dup.Inserted || !bytes.Equal(dup.Message.JSON, big2) {
		t.Fatalf("duplicate large append: inserted %v", dup.Inserted)
	}
	// Invalid large JSON fails with the server's reason over the streaming path too.
	bad := append(bytes.Clone(big[:4*1024*1024]), '"')
	if _, err := s.AppendMessage(ctx, json.RawMessage(bad)); sessions.Reason(err) != sessions.ReasonInvalidJSON {
		t.Fatalf("large invalid JSON: %v", err)
	}
}

// methodLog records the name of every RPC a client starts, unary and streaming.
type methodLog struct {
	mu       sync.Mutex
	names    []string
	requests []any // unary requests, in order
	streamed []any // the first request each stream sends, in order
}

func (l *methodLog) add(method string) {
	l.mu.Lock()
	l.names = append(l.names, path.Base(method))
	l.mu.Unlock()
}

// take returns the methods called since the last take, and forgets them.
func (l *methodLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := l.names
	l.names = nil
	return names
}

func (l *methodLog) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	l.add(method)
	l.mu.Lock()
	l.requests = append(l.requests, req)
	l.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (l *methodLog) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	l.add(method)
	stream, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &loggedStream{ClientStream: stream, log: l}, nil
}

// loggedStream records the first message a stream sends: a server stream's request.
type loggedStream struct {
	grpc.ClientStream
	log  *methodLog
	sent bool
}

func (s *loggedStream) SendMsg(m any) error {
	if !s.sent {
		s.sent = true
		s.log.mu.Lock()
		s.log.streamed = append(s.log.streamed, m)
		s.log.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

// dialLogged connects a client whose calls are recorded in the returned log.
func dialLogged(t *testing.T, ctx context.Context) (*sessions.Client, *methodLog) {
	t.Helper()
	log := &methodLog{}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := sessions.Dial(dctx, server.Addr, sessions.WithBlock(), sessions.WithGRPCOptions(
		grpc.WithUnaryInterceptor(log.unary), grpc.WithStreamInterceptor(log.stream)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, log
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// A write whose JSON is too large for the response (json_omitted) takes the JSON it sent when
// the server stored exactly that (json_as_sent), and reads the message back only otherwise.
func TestLargeWrittenMessageIsReadBackOnlyWhenChanged(t *testing.T) {
	ctx := testCtx(t)
	c, log := dialLogged(t, ctx)
	s := c.Object(objectKey(t)).Session("s")

	kept := textMessage("kept", "user", strings.Repeat("k", 5_000_000))
	res := mustAppend(t, s, kept)
	if !bytes.Equal(res.Message.JSON, kept) || res.Message.Info.ID != "kept" {
		t.Fatalf("append returned %d bytes (id %q), want the %d sent", len(res.Message.JSON), res.Message.Info.ID, len(kept))
	}
	if calls := log.take(); !equalStrings(calls, []string{"UploadMessage"}) {
		t.Fatalf("a message stored as sent: calls %v, want no GetMessage", calls)
	}

	// The server strips OpenAI's ephemeral item id: the stored form has no providerMetadata.
	text := strings.Repeat("c", 5_000_000)
	stored := textMessage("changed", "user", text)
	sent := bytes.Replace(stored, []byte(`"}]}`), []byte(`","providerMetadata":{"openai":{"itemId":"item_1"}}}]}`), 1)
	res = mustAppend(t, s, json.RawMessage(sent))
	if !sameJSON(t, res.Message.JSON, stored) || res.Message.Info.ID != "changed" {
		t.Fatalf("append of a changed message returned %d bytes (id %q), want the stored form", len(res.Message.JSON), res.Message.Info.ID)
	}
	if calls := log.take(); !equalStrings(calls, []string{"UploadMessage", "GetMessage"}) {
		t.Fatalf("a message the server changed: calls %v, want one GetMessage after the upload", calls)
	}

	// AppendMessages takes each item's JSON by position: the second is omitted from the response.
	a := textMessage("a", "user", strings.Repeat("a", 3_000_000))
	b := textMessage("b", "user", strings.Repeat("b", 3_000_000))
	results, err := s.AppendMessages(ctx, []any{a, b})
	if err != nil || len(results) != 2 || !bytes.Equal(results[0].Message.JSON, a) || !bytes.Equal(results[1].Message.JSON, b) {
		t.Fatalf("AppendMessages: %v, %d results", err, len(results))
	}
	if calls := log.take(); !equalStrings(calls, []string{"AppendMessages"}) {
		t.Fatalf("AppendMessages of messages stored as sent: calls %v", calls)
	}
}

// A batch whose changed JSON passes the answer's room gets the rest back in one GetMessages,
// not a GetMessage per message.
func TestBatchJSONWithoutRoomIsReadBackInOneCall(t *testing.T) {
	ctx := testCtx(t)
	c, log := dialLogged(t, ctx)
	s := c.Object(objectKey(t)).Session("s")

	var msgs []any
	var stored []json.RawMessage
	for i := 0; i < 1500; i++ {
		want := textMessage(fmt.Sprintf("s%04d", i), "assistant", strings.Repeat("x", 2500))
		sent := bytes.Replace(want, []byte(`"}]}`), []byte(`","providerMetadata":{"openai":{"itemId":"item_1"}}}]}`), 1)
		msgs = append(msgs, json.RawMessage(sent))
		stored = append(stored, want)
	}
	results, err := s.AppendMessages(ctx, msgs)
	if err != nil || len(results) != len(msgs) {
		t.Fatalf("AppendMessages: %v, %d results", err, len(results))
	}
	for i, r := range results {
		if !sameJSON(t, r.Message.JSON, stored[i]) || r.Message.Info.ID != fmt.Sprintf("s%04d", i) || !r.Inserted {
			t.Fatalf("result %d: %s (id %q), want the stored form", i, r.Message.JSON, r.Message.Info.ID)
		}
	}
	if calls := log.take(); !equalStrings(calls, []string{"AppendMessages", "GetMessages"}) {
		t.Fatalf("calls %v, want one GetMessages after the batch (about 3.9 MB of changed JSON)", calls)
	}
}

// Writes ask the server to leave out JSON it stored as sent (the client holds it), and take a
// message the server changed from the response, whole, without reading it back.
func TestWritesAskForJSONAsSentToBeLeftOut(t *testing.T) {
	ctx := testCtx(t)
	c, log := dialLogged(t, ctx)
	s := c.Object(objectKey(t)).Session("s")

	a := textMessage("a", "user", "hi")
	if res := mustAppend(t, s, a); !bytes.Equal(res.Message.JSON, a) || res.Message.Info.ID != "a" {
		t.Fatalf("append returned %s (id %q), want %s", res.Message.JSON, res.Message.Info.ID, a)
	}
	stored := textMessage("s", "assistant", "reply")
	sent := bytes.Replace(stored, []byte(`"}]}`), []byte(`","providerMetadata":{"openai":{"itemId":"item_1"}}}]}`), 1)
	if res := mustAppend(t, s, json.RawMessage(sent)); !sameJSON(t, res.Message.JSON, stored) {
		t.Fatalf("append of a changed message returned %s, want the stored form %s", res.Message.JSON, stored)
	}
	b, d := textMessage("b", "user", "b"), textMessage("d", "user", "d")
	results, err := s.AppendMessages(ctx, []any{b})
	if err != nil || len(results) != 1 || !bytes.Equal(results[0].Message.JSON, b) {
		t.Fatalf("AppendMessages: %v, %v", err, results)
	}
	updated := textMessage("a", "user", "new")
	if res, err := s.UpdateMessage(ctx, updated); err != nil || !res.Found || !bytes.Equal(res.Message.JSON, updated) {
		t.Fatalf("UpdateMessage: %v, %+v", err, res)
	}
	if res, err := s.UpsertMessage(ctx, d); err != nil || !res.Inserted || !bytes.Equal(res.Message.JSON, d) {
		t.Fatalf("UpsertMessage: %v, %+v", err, res)
	}

	writes := []string{"AppendMessage", "AppendMessage", "AppendMessages", "UpdateMessage", "UpsertMessage"}
	if calls := log.take(); !equalStrings(calls, writes) {
		t.Fatalf("calls %v, want %v (no GetMessage)", calls, writes)
	}
	type omitting interface{ GetOmitJsonAsSent() bool }
	for i, req := range log.requests {
		if r, ok := req.(omitting); !ok || !r.GetOmitJsonAsSent() {
			t.Errorf("%s request %T does not ask to omit JSON as sent", writes[i], req)
		}
	}
}

// TestHistoryStreamsOneMessageAtATime reads a 900-message history and checks, through the
// iterator's own API and against the responses recorded on the wire, that it holds at most one
// decoded message, that the messages come packed (far fewer responses than messages, at most
// 400 in one, and a full server read of 400 rows in one), and that it never reads ahead: the
// current message is always in the newest response received, and Frames() counts exactly the
// responses received.
func TestHistoryStreamsOneMessageAtATime(t *testing.T) {
	ctx := testCtx(t)
	s, rec := recordedSession(t, "s")
	const n = 900
	msgs := make([]any, n)
	want := make([]json.RawMessage, n)
	for i := range msgs {
		want[i] = textMessage(fmt.Sprintf("m%03d", i), []string{"user", "assistant"}[i%2], strings.Repeat("x", 1000))
		msgs[i] = want[i]
	}
	if _, err := s.AppendMessages(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	rec.reset()

	it := s.History(ctx)
	defer it.Close()
	if it.Held() != 0 || it.Frames() != 0 {
		t.Fatalf("before Next: held %d, frames %d", it.Held(), it.Frames())
	}
	count := 0
	for it.Next() {
		if held := it.Held(); held != 1 {
			t.Fatalf("message %d: iterator holds %d messages", count, held)
		}
		received := rec.frameCounts(t, "StreamHistory")
		if it.Frames() != int64(len(received)) {
			t.Fatalf("message %d: Frames() = %d, %d responses received", count, it.Frames(), len(received))
		}
		before := 0 // messages in every response received but the newest
		for _, k := range received[:len(received)-1] {
			before += k
		}
		if count < before || count >= before+received[len(received)-1] {
			t.Fatalf("message %d is not in the newest response (responses %v): the iterator reads ahead", count, received)
		}
		m := it.Message()
		if wantID := fmt.Sprintf("m%03d", count); m.Info.ID != wantID || !bytes.Equal(m.JSON, want[count]) {
			t.Fatalf("message %d is %s (%d bytes), want %s", count, m.Info.ID, len(m.JSON), wantID)
		}
		count++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if count != n || it.Held() != 0 {
		t.Fatalf("read %d messages, held %d after the end", count, it.Held())
	}
	// 900 messages need at least three responses of 400; one response per message means no
	// packing. The server reads at most 400 rows at a time, and a read that large (these
	// messages are about 1 KB, far under the 1 MiB a response may carry) arrives whole.
	received := rec.frameCounts(t, "StreamHistory")
	if len(received) < 3 || len(received) >= n/2 || it.Frames() != int64(len(received)) {
		t.Fatalf("%d messages came in %d responses %v (Frames() = %d)", n, len(received), received, it.Frames())
	}
	most := 0
	for _, k := range received {
		if k < 1 || k > packed {
			t.Fatalf("a response carried %d messages: %v", k, received)
		}
		most = max(most, k)
	}
	if most != packed {
		t.Fatalf("no response carried a full read of %d messages: %v", packed, received)
	}
	rec.reset()

	// Newest first, through range-over-func.
	count = 0
	for m, err := range s.History(ctx, sessions.NewestFirst()).All() {
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("m%03d", n-1-count); m.Info.ID != want {
			t.Fatalf("newest-first message %d is %s, want %s", count, m.Info.ID, want)
		}
		count++
	}
	if count != n {
		t.Fatalf("newest first read %d", count)
	}
}

func TestHistoryEarlyBreak(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	msgs := make([]any, 300)
	for i := range msgs {
		msgs[i] = textMessage(fmt.Sprintf("m%03d", i), "user", strings.Repeat("y", 2000))
	}
	if _, err := s.AppendMessages(ctx, msgs); err != nil {
		t.Fatal(err)
	}

	// Break out of a range loop: the stream is cancelled, no error surfaces.
	for round := range 20 {
		count := 0
		for m, err := range s.History(ctx, sessions.NewestFirst()).All() {
			if err != nil {
				t.Fatal(err)
			}
			if m.Info.ID != "m299" && count == 0 {
				t.Fatalf("round %d: first newest-first message is %s", round, m.Info.ID)
			}
			count++
			if count == 3 {
				break
			}
		}
		if count != 3 {
			t.Fatalf("round %d: read %d", round, count)
		}
	}

	// Close mid-stream with the explicit API.
	it := s.History(ctx)
	for range 5 {
		if !it.Next() {
			t.Fatalf("stream ended early: %v", it.Err())
		}
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	if it.Next() || it.Err() != nil || it.Held() != 0 {
		t.Fatalf("after Close: err %v held %d", it.Err(), it.Held())
	}
	_ = it.Close() // twice is fine

	// Breaking out of batches too.
	batches := 0
	for batch, err := range s.HistoryBatches(ctx, sessions.WithBatchSize(10)).All() {
		if err != nil || len(batch) != 10 {
			t.Fatalf("batch: %d %v", len(batch), err)
		}
		batches++
		break
	}
	if batches != 1 {
		t.Fatal("no batch")
	}

	// The server is unharmed: a full read still works.
	if got := collectHistory(t, s); len(got) != 300 || got[299] != "m299" {
		t.Fatalf("full history after early breaks has %d messages", len(got))
	}
}

// TestDroppedHistoryIteratorsAreCancelled: an iterator stepped and dropped without Close held
// its call and gRPC's goroutine for as long as its context lived (a client audit: 300 such,
// 300 goroutines more). Once collected, its call is cancelled: the goroutines go. So for a
// Subscription (a later audit: one dropped held its server stream, and a subscriber slot of
// its object, until the client closed).
func TestDroppedHistoryIteratorsAreCancelled(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	if _, err := s.AppendMessages(ctx, []any{textMessage("a", "user", "x"), textMessage("b", "user", "y")}); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	const dropped = 50
	held := make([]interface{ Next() bool }, dropped) // kept until the check below: none collected before it
	for i := range held {
		switch i % 3 {
		case 0:
			held[i] = s.History(ctx, sessions.NewestFirst())
		case 1:
			held[i] = s.HistoryBatches(ctx, sessions.WithBatchSize(1))
		default:
			held[i] = s.Subscribe(ctx, sessions.IncludeProgress()) // its first event: PROGRESS
		}
		if !held[i].Next() {
			t.Fatal("the stream ended before its first message")
		}
	}
	if grown := runtime.NumGoroutine() - before; grown < dropped {
		t.Fatalf("%d goroutines more for %d calls held open: the test no longer sees what it checks", grown, dropped)
	}
	runtime.KeepAlive(held) // and dropped from here on
	deadline := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > before+dropped/10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before the dropped iterators: their calls were not cancelled", runtime.NumGoroutine(), before)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // a poll of the condition above, with its deadline
	}
}
