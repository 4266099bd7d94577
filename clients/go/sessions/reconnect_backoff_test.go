package sessions_test

// gRPC's wait between attempts to reconnect grows while a server is away (to 120 s uncapped):
// after a 70 s outage, calls failed for 36 s more once the server was back, past any retry
// policy. The client caps the wait (MaxReconnectBackoff), so a call made as the server returns
// gets through within its default retries.

import (
	"context"
	"testing"
	"time"

	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// By then gRPC's uncapped wait between attempts has grown past 16 s (1 s, then x1.6 each, ±20%).
const outage = 45 * time.Second

func TestACallMadeAsTheServerReturnsFromALongOutageSucceedsWithinItsRetries(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), 3*time.Minute)
	defer cancel()
	server := startRestartable(t, ctx)
	s := server.client.Object(objectKey(t)).Session("")
	mustAppend(t, s, textMessage("before", "user", "before the outage"))
	if err := server.first.Stop(); err != nil {
		t.Fatal(err)
	}

	// An application goes on calling while the server is away, on the same connection; each
	// failure is another failed connection attempt for gRPC.
	probe, err := sessions.Dial(ctx, server.addr, sessions.WithConn(server.client.Conn()), sessions.WithRetry(sessions.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for end := time.Now().Add(outage); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
		if _, _, err := probe.Object(objectKey(t)).Session("").GetLatestLeaf(callCtx); err != nil {
			failed++
		}
		callCancel()
	}
	if failed == 0 {
		t.Fatal("no call failed while the server was away")
	}

	server.restart(t)
	if _, found, err := s.GetMessage(ctx, "before"); err != nil || !found {
		t.Fatalf("GetMessage as the server returned: found %v, err %v", found, err)
	}
}

func TestTheReconnectCapIsWithinTheDefaultRetryWindow(t *testing.T) {
	p := sessions.DefaultRetryPolicy
	shortest := time.Duration(0) // the waits between its attempts, each at its shortest jitter
	wait := p.InitialBackoff
	for n := 1; n < p.MaxAttempts; n++ {
		shortest += min(wait, p.MaxBackoff) / 2
		wait = time.Duration(float64(wait) * p.Multiplier)
	}
	if limit := sessions.MaxReconnectBackoff * 12 / 10; shortest <= limit { // gRPC jitters by 20%
		t.Fatalf("the default retries span %v at their shortest, not past the reconnect wait %v", shortest, limit)
	}
}
