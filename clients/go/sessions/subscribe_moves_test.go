package sessions_test

// A subscription follows its object to a new shard (a sharding audit): a move ends the feed
// (UNAVAILABLE, OBJECT_MOVING) and the old owner then refuses the key (FAILED_PRECONDITION,
// OBJECT_NOT_OWNED) until the proxy routes it to the new owner. Subscribe took that refusal for an
// error of the subscription's own and ended it, so events written after a re-shard never came.
// Through nginx, a shard restarting under writes ended subscriptions UNKNOWN without the
// server's status ("Stream removed"), which ended them too. Both now reconnect, within the
// subscription's reconnect attempts. Real servers, no waits on time: streams are counted where
// they are opened.

import (
	"context"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
	"github.com/sessions-dev/sessions/clients/go/internal/testserver"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// moveObject moves key from one server to another with the server's CLI (sessions-server
// move-object), as an operator re-sharding does: the source then refuses the key
// (OBJECT_NOT_OWNED).
func moveObject(t *testing.T, ctx context.Context, key, from, to string) {
	t.Helper()
	command, err := testserver.Command()
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, command[1:]...), "move-object", "--object-key", key, "--from", from, "--to", to)
	if out, err := exec.CommandContext(ctx, command[0], args...).CombinedOutput(); err != nil {
		t.Fatalf("move-object: %v\n%s", err, out)
	}
}

// TestSubscribeToTheOldOwnerOfAMovedObjectReconnects: subscribing to the shard an object left
// (no proxy to route it to the new owner), the refusal comes back on every stream: the
// subscription reconnects as after a server that went away, and returns OBJECT_NOT_OWNED once
// its reconnect attempts are spent (attempts + 1 streams). It ended at the first one.
func TestSubscribeToTheOldOwnerOfAMovedObjectReconnects(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
	defer cancel()
	key := objectKey(t)
	mustAppend(t, client.Object(key).Session("s"), textMessage("m0", "user", "written on the first shard"))
	second, err := testserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Stop() })
	moveObject(t, ctx, key, server.Addr, second.Addr)

	moved, err := sessions.Dial(ctx, second.Addr, sessions.WithBlock())
	if err != nil {
		t.Fatal(err)
	}
	defer moved.Close()
	if got := collectHistory(t, moved.Object(key).Session("s")); !equalStrings(got, []string{"m0"}) {
		t.Fatalf("history on the new owner: %v, want [m0]", got)
	}

	var opened atomic.Int32 // Subscribe streams the client opened
	count := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == pb.SessionService_Subscribe_FullMethodName {
			opened.Add(1)
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	c, err := sessions.Dial(ctx, server.Addr, sessions.WithBlock(),
		sessions.WithGRPCOptions(grpc.WithStreamInterceptor(count)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub := c.Object(key).Subscribe(ctx, sessions.IncludeProgress(), sessions.WithReconnectAttempts(2))
	defer sub.Close()
	if sub.Next() {
		t.Fatalf("an event from the shard the object left: %+v", sub.Event())
	}
	err = sub.Err()
	if sessions.Code(err) != codes.FailedPrecondition || sessions.Reason(err) != sessions.ReasonObjectNotOwned {
		t.Fatalf("ended with %v, want FAILED_PRECONDITION [OBJECT_NOT_OWNED]", err)
	}
	if n := opened.Load(); n != 3 {
		t.Fatalf("%d Subscribe streams, want 3 (the first and 2 reconnections)", n)
	}
}

// TestSubscribeResumesAfterAStreamAProxyEndedUnknown: the first stream ends UNKNOWN without a
// reason after its opening PROGRESS; the subscription resumes on a second stream (no RESET: the
// resume repeats and misses nothing) and delivers the append made in between. It ended with
// UNKNOWN.
func TestSubscribeResumesAfterAStreamAProxyEndedUnknown(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
	defer cancel()
	key := objectKey(t)
	s := client.Object(key).Session("s")
	mustAppend(t, s, textMessage("m0", "user", "before the subscription"))
	// The first stream ends after its first response as nginx ends one when the shard's
	// connection closes under it: UNKNOWN "Stream removed", no ErrorInfo (no trailers came).
	front := startRelay(t, server.Addr, afterOne, 1, 10)
	front.failure = status.Error(codes.Unknown, "Stream removed")
	c, err := sessions.Dial(ctx, front.addr, sessions.WithBlock())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub := c.Object(key).Subscribe(ctx, sessions.IncludeProgress())
	defer sub.Close()
	if !sub.Next() || sub.Event().Type != sessions.ChangeProgress {
		t.Fatalf("first event %+v (%v), want the opening PROGRESS", sub.Event(), sub.Err())
	}
	mustAppend(t, s, textMessage("m1", "user", "after the cut"))
	for {
		if !sub.Next() {
			t.Fatalf("the subscription ended: %v", sub.Err())
		}
		ev := sub.Event()
		if ev.Type == sessions.ChangeReset {
			t.Fatalf("a RESET after the cut: the resume should have missed nothing")
		}
		if ev.Type == sessions.ChangeAppend {
			if ev.Message == nil || ev.Message.Info.ID != "m1" {
				t.Fatalf("append %+v, want m1", ev)
			}
			break
		}
	}
	if n := len(front.recorded()); n != 2 {
		t.Fatalf("%d Subscribe streams through the front, want 2", n)
	}
}
