package sessions_test

// Packed reads: the client asks long reads for up to 400 messages per response
// (max_messages_per_response) and reassembles them from `frames`, including a message large
// enough to travel as pieces, and batch ends that the server marks at the end of a response. A
// recording stream interceptor checks what actually crossed the wire, so these tests fail if
// the client stops asking for packing as well as if it misreads packed responses.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

const packed = 400

type seenFrame struct {
	id    string // "" when the frame has no info (a later piece)
	bytes int
	more  bool
}

type seenResponse struct {
	single   bool // the single `frame` field was set
	frames   []seenFrame
	batchEnd bool
}

type seenCall struct {
	method         string
	maxPerResponse uint32
	responses      []seenResponse
}

// recorder keeps the shape of every server-streaming call made through its client.
type recorder struct {
	mu    sync.Mutex
	calls []*seenCall
}

type recordingStream struct {
	grpc.ClientStream
	rec  *recorder
	call *seenCall
}

func (s *recordingStream) SendMsg(m any) error {
	if req, ok := m.(interface{ GetMaxMessagesPerResponse() uint32 }); ok {
		s.rec.mu.Lock()
		s.call.maxPerResponse = req.GetMaxMessagesPerResponse()
		s.rec.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		return err
	}
	var r seenResponse
	if f, ok := m.(interface{ GetFrame() *pb.MessageFrame }); ok && f.GetFrame() != nil {
		r.single = true
		r.frames = append(r.frames, frameOf(f.GetFrame()))
	}
	if p, ok := m.(interface{ GetFrames() []*pb.MessageFrame }); ok {
		for _, f := range p.GetFrames() {
			r.frames = append(r.frames, frameOf(f))
		}
	}
	if b, ok := m.(interface{ GetBatchEnd() bool }); ok {
		r.batchEnd = b.GetBatchEnd()
	}
	s.rec.mu.Lock()
	s.call.responses = append(s.call.responses, r)
	s.rec.mu.Unlock()
	return nil
}

func frameOf(f *pb.MessageFrame) seenFrame {
	return seenFrame{id: f.GetInfo().GetId(), bytes: len(f.GetJson()), more: f.GetMorePieces()}
}

func (r *recorder) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || !desc.ServerStreams || desc.ClientStreams {
		return cs, err
	}
	call := &seenCall{method: path.Base(method)}
	r.mu.Lock()
	r.calls = append(r.calls, call)
	r.mu.Unlock()
	return &recordingStream{ClientStream: cs, rec: r, call: call}, nil
}

// only returns the one call of method made since the last take, and forgets every call.
func (r *recorder) only(t *testing.T, method string) *seenCall {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var found []*seenCall
	var names []string
	for _, c := range r.calls {
		names = append(names, c.method)
		if c.method == method {
			found = append(found, c)
		}
	}
	r.calls = nil
	if len(found) != 1 {
		t.Fatalf("want one %s call, saw %v", method, names)
	}
	return found[0]
}

// frameCounts returns how many frames each response of the one method call so far carried.
func (r *recorder) frameCounts(t *testing.T, method string) []int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var counts []int
	calls := 0
	for _, c := range r.calls {
		if c.method == method {
			calls++
			counts = counts[:0]
			for _, resp := range c.responses {
				counts = append(counts, len(resp.frames))
			}
		}
	}
	if calls != 1 {
		t.Fatalf("want one %s call, saw %d", method, calls)
	}
	return counts
}

func (r *recorder) reset() {
	r.mu.Lock()
	r.calls = nil
	r.mu.Unlock()
}

// recordedSession is a session on a fresh object, through a client whose streams are recorded.
func recordedSession(t *testing.T, id string) (*sessions.Session, *recorder) {
	t.Helper()
	rec := &recorder{}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := sessions.Dial(ctx, server.Addr, sessions.WithBlock(),
		sessions.WithGRPCOptions(grpc.WithStreamInterceptor(rec.intercept)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.Object(objectKey(t)).Session(id), rec
}

// assertPacked checks that a call asked for packing and was answered packed: only `frames`, at
// most `packed` a response, one frame with info per message, and fewer responses than messages.
func assertPacked(t *testing.T, call *seenCall, messages int) {
	t.Helper()
	if call.maxPerResponse != packed {
		t.Fatalf("%s asked for max_messages_per_response %d, want %d", call.method, call.maxPerResponse, packed)
	}
	data, heads, most := 0, 0, 0
	for i, r := range call.responses {
		if r.single {
			t.Fatalf("%s response %d uses the single frame field", call.method, i)
		}
		if len(r.frames) == 0 {
			continue
		}
		data++
		most = max(most, len(r.frames))
		for _, f := range r.frames {
			if f.id != "" {
				heads++
			}
		}
	}
	if most > packed {
		t.Fatalf("%s: a response carried %d frames", call.method, most)
	}
	if heads != messages {
		t.Fatalf("%s: %d frames with info, want one per message (%d)", call.method, heads, messages)
	}
	if messages > 1 && (data >= messages || most < 2) {
		t.Fatalf("%s: %d messages came in %d responses (at most %d in one): not packed", call.method, messages, data, most)
	}
}

// smallMessages are distinct small messages (multi-byte text included), alternating roles.
func smallMessages(prefix string, n int) []json.RawMessage {
	out := make([]json.RawMessage, n)
	for i := range out {
		out[i] = textMessage(fmt.Sprintf("%s%d", prefix, i), []string{"user", "assistant"}[i%2],
			fmt.Sprintf("%s #%d %s", prefix, i, strings.Repeat("é😀中", i%5)))
	}
	return out
}

func anys(msgs []json.RawMessage) []any {
	out := make([]any, len(msgs))
	for i, m := range msgs {
		out[i] = m
	}
	return out
}

func reversed[T any](in []T) []T {
	out := make([]T, len(in))
	for i, v := range in {
		out[len(in)-1-i] = v
	}
	return out
}

// assertMessages checks ids and exact JSON, in order.
func assertMessages(t *testing.T, what string, got []sessions.Message, want []json.RawMessage) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d messages, want %d", what, len(got), len(want))
	}
	for i := range want {
		var head struct{ ID string }
		_ = json.Unmarshal(want[i], &head)
		if got[i].Info.ID != head.ID || !bytes.Equal(got[i].JSON, want[i]) {
			t.Fatalf("%s: message %d is %s (%d bytes), want %s (%d bytes)", what, i, got[i].Info.ID, len(got[i].JSON), head.ID, len(want[i]))
		}
	}
}

func batchesOf(t *testing.T, s *sessions.Session, opts ...sessions.ReadOption) [][]sessions.Message {
	t.Helper()
	var out [][]sessions.Message
	for batch, err := range s.HistoryBatches(testCtx(t), opts...).All() {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, batch)
	}
	return out
}

func batchSizes(batches [][]sessions.Message) []int {
	out := make([]int, len(batches))
	for i, b := range batches {
		out[i] = len(b)
	}
	return out
}

func flatten(batches [][]sessions.Message) []sessions.Message {
	var out []sessions.Message
	for _, b := range batches {
		out = append(out, b...)
	}
	return out
}

func batchEnds(call *seenCall) int {
	n := 0
	for _, r := range call.responses {
		if r.batchEnd {
			n++
		}
	}
	return n
}

// upstreamBatches gives batch sizes by upstream's historyBatches rules: close before a message
// that would overflow the bytes, and after one that fills the batch.
func upstreamBatches(sizes []int, batchSize, maxBytes int) []int {
	var out []int
	count, used := 0, 0
	for _, size := range sizes {
		if count > 0 && used+size > maxBytes {
			out = append(out, count)
			count, used = 0, 0
		}
		count++
		used += size
		if count >= batchSize || used >= maxBytes {
			out = append(out, count)
			count, used = 0, 0
		}
	}
	if count > 0 {
		out = append(out, count)
	}
	return out
}

func TestPackedLongHistory(t *testing.T) {
	ctx := testCtx(t)
	s, rec := recordedSession(t, "long")
	const n = 300
	all := smallMessages("m", n)
	if _, err := s.AppendMessages(ctx, anys(all)); err != nil {
		t.Fatal(err)
	}
	rec.reset()

	t.Run("History", func(t *testing.T) {
		var got []sessions.Message
		for m, err := range s.History(ctx).All() {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, m)
		}
		assertMessages(t, "history", got, all)
		call := rec.only(t, "StreamHistory")
		assertPacked(t, call, n)
		if batchEnds(call) != 0 {
			t.Fatal("batch ends on an unbatched read")
		}

		newest, err := s.GetHistory(ctx, sessions.NewestFirst())
		if err != nil {
			t.Fatal(err)
		}
		assertMessages(t, "newest first", newest, reversed(all))
		assertPacked(t, rec.only(t, "StreamHistory"), n)

		part, err := s.GetHistory(ctx, sessions.WithLeaf("m199"))
		if err != nil {
			t.Fatal(err)
		}
		assertMessages(t, "path to m199", part, all[:200])
		assertPacked(t, rec.only(t, "StreamHistory"), 200)
	})

	t.Run("GetMessages", func(t *testing.T) {
		var wanted []string
		for i := n - 1; i >= 0; i-- {
			wanted = append(wanted, fmt.Sprintf("m%d", i))
			if i == 150 {
				wanted = append(wanted, "missing")
			}
		}
		got, err := s.GetMessages(ctx, wanted)
		if err != nil {
			t.Fatal(err)
		}
		assertMessages(t, "GetMessages", got, reversed(all))
		assertPacked(t, rec.only(t, "GetMessages"), n)
	})

	t.Run("GetRecentHistory", func(t *testing.T) {
		whole, err := s.GetRecentHistory(ctx, 100<<20)
		if err != nil {
			t.Fatal(err)
		}
		if whole.Truncated {
			t.Fatal("whole path reported truncated")
		}
		assertMessages(t, "recent (all)", whole.Messages, all)
		assertPacked(t, rec.only(t, "GetRecentHistory"), n)

		stats, err := s.GetHistoryRowStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var budget int64
		for _, st := range stats[n-170:] {
			budget += st.Bytes
		}
		rec.reset()
		recent, err := s.GetRecentHistory(ctx, budget)
		if err != nil {
			t.Fatal(err)
		}
		if !recent.Truncated {
			t.Fatal("suffix not reported truncated")
		}
		assertMessages(t, "recent (suffix)", recent.Messages, all[n-170:])
		assertPacked(t, rec.only(t, "GetRecentHistory"), 170)
	})

	t.Run("HistoryBatches", func(t *testing.T) {
		sevens := batchesOf(t, s, sessions.WithBatchSize(7))
		want := make([]int, 0, 43)
		for range 42 {
			want = append(want, 7)
		}
		want = append(want, 6)
		if got := batchSizes(sevens); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("batches of 7: %v", got)
		}
		assertMessages(t, "batches of 7", flatten(sevens), all)
		call := rec.only(t, "StreamHistory")
		assertPacked(t, call, n)
		if ends := batchEnds(call); ends != 43 {
			t.Fatalf("%d responses mark a batch end, want 43", ends)
		}

		// A batch larger than a packed response spans several responses: 900 messages in
		// batches of 500, so the first batch needs at least two responses of 400 and the second
		// one more.
		longer, lrec := recordedSession(t, "longer")
		many := smallMessages("n", 900)
		if _, err := longer.AppendMessages(ctx, anys(many)); err != nil {
			t.Fatal(err)
		}
		lrec.reset()
		large := batchesOf(t, longer, sessions.WithBatchSize(500))
		if got := batchSizes(large); fmt.Sprint(got) != "[500 400]" {
			t.Fatalf("batches of 500: %v", got)
		}
		assertMessages(t, "batches of 500", flatten(large), many)
		call = lrec.only(t, "StreamHistory")
		assertPacked(t, call, len(many))
		firstEnd := -1
		for i, r := range call.responses {
			if r.batchEnd {
				firstEnd = i
				break
			}
		}
		if firstEnd < 1 || len(call.responses) < 3 || batchEnds(call) != 2 {
			t.Fatalf("batches of 500 came in %d responses with %d batch ends, the first in response %d",
				len(call.responses), batchEnds(call), firstEnd)
		}

		// By bytes, newest first.
		const limit = 2000
		sizes := make([]int, n)
		for i, m := range reversed(all) {
			sizes[i] = len(m)
		}
		byBytes := batchesOf(t, s, sessions.WithBatchSize(1000), sessions.WithMaxBatchBytes(limit), sessions.NewestFirst())
		if got, want := batchSizes(byBytes), upstreamBatches(sizes, 1000, limit); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("batches by bytes: %v, want %v", got, want)
		}
		assertMessages(t, "batches by bytes", flatten(byBytes), reversed(all))
		assertPacked(t, rec.only(t, "StreamHistory"), n)
	})

	t.Run("GetBranches", func(t *testing.T) {
		children := smallMessages("c", n)
		p, prec := recordedSession(t, "children")
		mustAppend(t, p, textMessage("root", "user", "root"))
		items := make([]sessions.ImportItem, n)
		for i, c := range children {
			items[i] = sessions.ImportItem{Message: c, ParentID: "root", CreatedAt: time.UnixMilli(int64(1000 + i))}
		}
		if res, err := p.ImportMessages(ctx, items); err != nil || res.Imported != n {
			t.Fatalf("import: %+v %v", res, err)
		}
		prec.reset()
		got, err := p.GetBranches(ctx, "root")
		if err != nil {
			t.Fatal(err)
		}
		assertMessages(t, "branches", got, children)
		assertPacked(t, prec.only(t, "GetBranches"), n)
	})
}

// assertPieces checks the large message's pieces: consecutive, each alone in its response, info
// on the first only, more_pieces on all but the last, and no other message cut. It returns the
// indexes of the responses carrying the first and the last piece.
func assertPieces(t *testing.T, call *seenCall, id string, size int) (first, last int) {
	t.Helper()
	type placed struct {
		seenFrame
		response int
		alone    bool
	}
	var flat []placed
	for i, r := range call.responses {
		for _, f := range r.frames {
			flat = append(flat, placed{f, i, len(r.frames) == 1})
		}
	}
	start := -1
	for i, f := range flat {
		if f.id == id {
			start = i
			break
		}
	}
	if start < 0 {
		t.Fatalf("%s: %s not read", call.method, id)
	}
	end := start
	for end < len(flat) && flat[end].more {
		end++
	}
	if end == len(flat) {
		t.Fatalf("%s: the stream ended inside %s", call.method, id)
	}
	pieces := flat[start : end+1]
	if len(pieces) < 3 {
		t.Fatalf("%s: %s came in %d piece(s)", call.method, id, len(pieces))
	}
	total, cut := 0, 0
	for i, p := range pieces {
		if i > 0 && p.id != "" {
			t.Fatalf("%s: piece %d carries info", call.method, i)
		}
		if !p.alone || p.response != pieces[0].response+i {
			t.Fatalf("%s: piece %d is not alone in the next response", call.method, i)
		}
		if p.bytes > 3<<20 {
			t.Fatalf("%s: piece %d has %d bytes", call.method, i, p.bytes)
		}
		total += p.bytes
	}
	for _, f := range flat {
		if f.more {
			cut++
		}
	}
	if total != size || cut != len(pieces)-1 {
		t.Fatalf("%s: pieces hold %d bytes (want %d); %d frames say more pieces follow (want %d)",
			call.method, total, size, cut, len(pieces)-1)
	}
	return pieces[0].response, pieces[len(pieces)-1].response
}

func TestPackedHistoryWithLargeMessage(t *testing.T) {
	ctx := testCtx(t)
	s, rec := recordedSession(t, "big")
	before, after := smallMessages("s", 40), smallMessages("t", 40)
	big := bigMessage("big", 7<<20)
	if _, err := s.AppendMessages(ctx, anys(before)); err != nil {
		t.Fatal(err)
	}
	sib := textMessage("sib", "user", "a sibling of big")
	mustAppend(t, s, sib, sessions.WithParent("s39"))
	mustAppend(t, s, big, sessions.WithParent("s39"))
	if _, err := s.AppendMessages(ctx, anys(after)); err != nil { // auto parent: chains after big
		t.Fatal(err)
	}
	line := append(append(append([]json.RawMessage{}, before...), big), after...)
	rec.reset()

	got, err := s.GetHistory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	assertMessages(t, "history", got, line)
	call := rec.only(t, "StreamHistory")
	assertPacked(t, call, len(line))
	assertPieces(t, call, "big", len(big))

	newest, err := s.GetHistory(ctx, sessions.NewestFirst())
	if err != nil {
		t.Fatal(err)
	}
	assertMessages(t, "newest first", newest, reversed(line))
	assertPieces(t, rec.only(t, "StreamHistory"), "big", len(big))

	several, err := s.GetMessages(ctx, []string{"t39", "s0", "big", "missing", "t0"})
	if err != nil {
		t.Fatal(err)
	}
	assertMessages(t, "GetMessages", several, []json.RawMessage{after[39], before[0], big, after[0]})
	assertPieces(t, rec.only(t, "GetMessages"), "big", len(big))

	children, err := s.GetBranches(ctx, "s39")
	if err != nil {
		t.Fatal(err)
	}
	assertMessages(t, "GetBranches", children, []json.RawMessage{sib, big})
	assertPieces(t, rec.only(t, "GetBranches"), "big", len(big))

	recent, err := s.GetRecentHistory(ctx, 100<<20)
	if err != nil || recent.Truncated {
		t.Fatalf("recent: truncated %v, %v", recent.Truncated, err)
	}
	assertMessages(t, "recent", recent.Messages, line)
	call = rec.only(t, "GetRecentHistory")
	assertPacked(t, call, len(line))
	assertPieces(t, call, "big", len(big))

	// Batches: the large message (over the default 4 MiB) forms a batch alone.
	batches := batchesOf(t, s, sessions.WithBatchSize(16))
	if got := batchSizes(batches); fmt.Sprint(got) != "[16 16 8 1 16 16 8]" {
		t.Fatalf("batches: %v", got)
	}
	assertMessages(t, "batches", flatten(batches), line)
	call = rec.only(t, "StreamHistory")
	assertPacked(t, call, len(line))
	first, last := assertPieces(t, call, "big", len(big))
	if !call.responses[first-1].batchEnd || !call.responses[last].batchEnd {
		t.Fatal("the large message's batch should end just before its first piece and on its last")
	}
	for i := first; i < last; i++ {
		if call.responses[i].batchEnd {
			t.Fatalf("batch end inside the large message (response %d)", i)
		}
	}
	if ends := batchEnds(call); ends != 7 {
		t.Fatalf("%d batch ends, want 7", ends)
	}
}
