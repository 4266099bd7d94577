package sessions_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// nextEvent waits for the subscription's next event.
func nextEvent(t *testing.T, sub *sessions.Subscription) sessions.Event {
	t.Helper()
	if !sub.Next() {
		t.Fatalf("subscription ended: %v", sub.Err())
	}
	return sub.Event()
}

// liveSubscription subscribes and waits for the server's first PROGRESS event, which says where
// the live feed starts, so writes made after it are sure to be seen.
func liveSubscription(t *testing.T, ctx context.Context, subscribe func(context.Context, ...sessions.ReadOption) *sessions.Subscription) *sessions.Subscription {
	t.Helper()
	sub := subscribe(ctx, sessions.IncludeProgress())
	t.Cleanup(func() { _ = sub.Close() })
	if ev := nextEvent(t, sub); ev.Type != sessions.ChangeProgress {
		t.Fatalf("first event = %v, want PROGRESS", ev.Type)
	}
	return sub
}

func TestSubscribeChangeFeed(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
	defer cancel()
	s := newSession(t)
	other := s.Object().Session("other")
	sub := liveSubscription(t, ctx, s.Subscribe)
	objectSub := liveSubscription(t, ctx, s.Object().Subscribe)

	mustAppend(t, s, textMessage("a", "user", "hello"))
	mustAppend(t, other, textMessage("o", "user", "not in this session"))
	mustAppend(t, s, textMessage("a", "user", "duplicate"))
	mustAppend(t, s, textMessage("b", "assistant", "answer"), sessions.WithParent("a"))
	if _, err := s.UpdateMessage(ctx, textMessage("b", "assistant", "better answer")); err != nil {
		t.Fatal(err)
	}
	big := bigMessage("big", 5*1024*1024) // its event arrives in pieces
	mustAppend(t, s, big)
	if _, err := s.ImportMessages(ctx, []sessions.ImportItem{{Message: textMessage("i", "user", "imported"), ParentID: "a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteMessages(ctx, "i", "nope"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClearMessages(ctx); err != nil {
		t.Fatal(err)
	}

	type want struct {
		typ      sessions.ChangeType
		id       string
		inserted bool
	}
	wants := []want{
		{sessions.ChangeAppend, "a", true},
		{sessions.ChangeAppend, "a", false},
		{sessions.ChangeAppend, "b", true},
		{sessions.ChangeUpdate, "b", false},
		{sessions.ChangeAppend, "big", true},
		{sessions.ChangeImport, "i", false},
		{sessions.ChangeDelete, "", false},
		{sessions.ChangeClear, "", false},
	}
	var revisions []uint64
	for i, w := range wants {
		ev := nextEvent(t, sub)
		for ev.Type == sessions.ChangeProgress {
			ev = nextEvent(t, sub)
		}
		if ev.Type != w.typ || ev.SessionID != "s" {
			t.Fatalf("event %d = %v in %q, want %v", i, ev.Type, ev.SessionID, w.typ)
		}
		if w.id != "" && (ev.Message == nil || ev.Message.Info.ID != w.id) {
			t.Fatalf("event %d (%v) carries message %+v, want %s", i, ev.Type, ev.Message, w.id)
		}
		if ev.Type == sessions.ChangeAppend && ev.Inserted != w.inserted {
			t.Fatalf("event %d: inserted = %v, want %v", i, ev.Inserted, w.inserted)
		}
		if len(revisions) > 0 && ev.Revision <= revisions[len(revisions)-1] {
			t.Fatalf("revision went from %d to %d", revisions[len(revisions)-1], ev.Revision)
		}
		revisions = append(revisions, ev.Revision)
		switch w.id {
		case "a":
			if w.inserted && (ev.ParentMode != sessions.ParentAuto || !bytes.Equal(ev.Message.JSON, textMessage("a", "user", "hello"))) {
				t.Fatalf("append event = %+v %s", ev, ev.Message.JSON)
			}
		case "b":
			if ev.Type == sessions.ChangeAppend && (ev.ParentMode != sessions.ParentByID || ev.ParentID != "a") {
				t.Fatalf("append with parent: mode %v id %q", ev.ParentMode, ev.ParentID)
			}
			if ev.Type == sessions.ChangeUpdate && !bytes.Equal(ev.Message.JSON, textMessage("b", "assistant", "better answer")) {
				t.Fatalf("update event carries %s", ev.Message.JSON)
			}
		case "big":
			if !bytes.Equal(ev.Message.JSON, big) {
				t.Fatalf("large message event reassembled to %d bytes, want %d", len(ev.Message.JSON), len(big))
			}
		case "i":
			if ev.ParentID != "a" {
				t.Fatalf("import event parent = %q", ev.ParentID)
			}
		}
		if ev.Type == sessions.ChangeDelete && (len(ev.MessageIDs) != 2 || ev.MessageIDs[0] != "i" || ev.MessageIDs[1] != "nope") {
			t.Fatalf("delete event ids = %v", ev.MessageIDs)
		}
	}

	// The object-wide feed also sees the other session's append, in commit order.
	var sessionsSeen []string
	for range len(wants) + 1 {
		ev := nextEvent(t, objectSub)
		for ev.Type == sessions.ChangeProgress {
			ev = nextEvent(t, objectSub)
		}
		sessionsSeen = append(sessionsSeen, ev.SessionID)
	}
	if !equalStrings(sessionsSeen, []string{"s", "other", "s", "s", "s", "s", "s", "s", "s"}) {
		t.Fatalf("object feed sessions = %v", sessionsSeen)
	}

	// Resuming after a revision replays what followed it (PROGRESS dropped by default).
	resumeCtx, cancelResume := context.WithTimeout(ctx, 30*time.Second)
	defer cancelResume()
	resumed := s.Subscribe(resumeCtx, sessions.ResumeAfter(revisions[3]))
	defer resumed.Close()
	for i := 4; i < len(wants); i++ {
		ev := nextEvent(t, resumed)
		if ev.Type == sessions.ChangeReset {
			t.Fatalf("resume after a recent revision answered RESET: %s", ev.Error)
		}
		if ev.Revision != revisions[i] || ev.Type != wants[i].typ {
			t.Fatalf("resumed event %d = rev %d %v, want rev %d %v", i, ev.Revision, ev.Type, revisions[i], wants[i].typ)
		}
	}
	if resumed.Revision() != revisions[len(revisions)-1] {
		t.Fatalf("Revision() = %d", resumed.Revision())
	}

	// Closing ends the iteration without an error.
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if sub.Next() || sub.Err() != nil {
		t.Fatalf("after Close: %v", sub.Err())
	}
}

func TestSubscribeEndsWithContext(t *testing.T) {
	s := newSession(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	sub := liveSubscription(t, ctx, s.Subscribe)
	if _, err := s.AppendMessage(testCtx(t), textMessage("a", "user", "a")); err != nil {
		t.Fatal(err)
	}
	appends := 0
	var ended error
	for ev, err := range sub.All() {
		if err != nil {
			ended = err
			break
		}
		if ev.Type == sessions.ChangeAppend {
			appends++
			cancel() // the next read waits on a stream with nothing more to send
		}
	}
	// Err() is nil only after a clean end or Close(): a cancelled context is neither.
	if ended == nil || sessions.Code(ended) != codes.Canceled {
		t.Fatalf("subscription ended with %v, want a CANCELED error", ended)
	}
	if appends != 1 {
		t.Fatalf("got %d appends before the cancel, want the one", appends)
	}
}

// TestSubscribeReconnectsAfterRestart restarts a server (same address, same data) under a live
// subscription: the subscription reconnects by itself, resuming after the last revision it saw.
func TestSubscribeReconnectsAfterRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
	defer cancel()
	server := startRestartable(t, ctx, "--drain-seconds", "0.5")
	s := server.client.Object(objectKey(t)).Session("")

	sub := liveSubscription(t, ctx, s.Subscribe)
	mustAppend(t, s, textMessage("before", "user", "before the restart"))
	ev := nextEvent(t, sub)
	for ev.Type == sessions.ChangeProgress {
		ev = nextEvent(t, sub)
	}
	if ev.Type != sessions.ChangeAppend || ev.Message.Info.ID != "before" {
		t.Fatalf("event before restart = %v", ev.Type)
	}

	if err := server.first.Stop(); err != nil {
		t.Fatal(err)
	}
	server.restart(t)

	// The subscription reconnects by itself and resumes after the last revision it saw. That
	// revision is from before the restart, so the server answers RESET (re-read state).
	ev = nextEvent(t, sub)
	for ev.Type == sessions.ChangeProgress {
		ev = nextEvent(t, sub)
	}
	if ev.Type != sessions.ChangeReset || ev.Error == "" {
		t.Fatalf("first event after the restart = %v %q, want RESET with a reason", ev.Type, ev.Error)
	}

	// The client's connection comes back by itself too; the first calls may see UNAVAILABLE.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := s.AppendMessage(ctx, textMessage("after", "user", "after the restart"))
		if err == nil {
			break
		}
		if sessions.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("append after restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ev = nextEvent(t, sub)
	for ev.Type == sessions.ChangeProgress {
		ev = nextEvent(t, sub)
	}
	if ev.Type != sessions.ChangeAppend || ev.Message.Info.ID != "after" {
		t.Fatalf("event after the reset = %v", ev.Type)
	}
	if history, err := s.GetHistory(ctx); err != nil || !equalStrings(ids(history), []string{"before", "after"}) {
		t.Fatalf("history after restart = %v, %v", ids(history), err)
	}
}

// TestCloseEndsASubscription closes the client under a live subscription: it ends at once, not
// after reconnecting to the closed connection (CANCELLED, as a server going away) 20 times over
// some 33 s. The interceptor counts the Subscribe streams opened.
func TestCloseEndsASubscription(t *testing.T) {
	var opened atomic.Int32
	count := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == pb.SessionService_Subscribe_FullMethodName {
			opened.Add(1)
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	ctx := testCtx(t)
	c, err := sessions.Dial(ctx, server.Addr, sessions.WithBlock(), sessions.WithGRPCOptions(grpc.WithStreamInterceptor(count)))
	if err != nil {
		t.Fatal(err)
	}
	sub := liveSubscription(t, ctx, c.Object(objectKey(t)).Subscribe)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if sub.Next() {
		t.Fatalf("an event after Close: %+v", sub.Event())
	}
	if sessions.Code(sub.Err()) != codes.Canceled {
		t.Fatalf("ended with %v, want CANCELLED", sub.Err())
	}
	if n := opened.Load(); n != 1 {
		t.Fatalf("%d Subscribe streams opened, want 1 (no reconnect to a closed client)", n)
	}
}

// TestANilMessageIsRefused: a nil *Message panicked (a nil *json.RawMessage was refused).
func TestANilMessageIsRefused(t *testing.T) {
	s := newSession(t)
	var nothing *sessions.Message
	_, err := s.AppendMessage(testCtx(t), nothing)
	if sessions.Code(err) != codes.InvalidArgument || sessions.Reason(err) != sessions.ReasonInvalidJSON {
		t.Fatalf("append of a nil *Message: %v", err)
	}
	if _, err := s.ImportMessages(testCtx(t), sessions.ImportChain(nothing)); sessions.Code(err) != codes.InvalidArgument {
		t.Fatalf("import of a nil *Message: %v", err)
	}
}
