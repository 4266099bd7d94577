package sessions

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// The subscribers of a server that went away do not all come back at the same instant: each
// reconnection waits longer, up to 2 s, jittered below that.
func TestResubscribeDelayGrowsWithJitter(t *testing.T) {
	for _, c := range []struct {
		attempt int
		ceiling time.Duration
	}{{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {4, 800 * time.Millisecond}, {5, 1600 * time.Millisecond}, {6, 2 * time.Second}, {20, 2 * time.Second}, {40, 2 * time.Second}, {100, 2 * time.Second}} {
		lowest, highest := c.ceiling, time.Duration(0)
		for range 200 {
			d := resubscribeDelay(c.attempt)
			if d < c.ceiling/2 || d > c.ceiling {
				t.Fatalf("attempt %d: %v, want within [%v, %v]", c.attempt, d, c.ceiling/2, c.ceiling)
			}
			lowest, highest = min(lowest, d), max(highest, d)
		}
		if highest-lowest <= c.ceiling/10 {
			t.Errorf("attempt %d: every wait within %v of the others: not jittered", c.attempt, highest-lowest)
		}
	}
}

// Close ends a subscription's wait to reconnect at once, with CANCELLED, as it ends a retried
// call's wait: it used to sleep the wait out (up to 2 s) before finding the client closed.
func TestCloseEndsResubscribeWait(t *testing.T) {
	waiting := make(chan struct{})
	resubscribeWait = func(int) time.Duration {
		close(waiting)
		return time.Hour
	}
	t.Cleanup(func() { resubscribeWait = resubscribeDelay })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil { // nothing listens there: every connection is refused
		t.Fatal(err)
	}
	client, err := Dial(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		<-waiting
		_ = client.Close()
	}()
	sub := client.Object("k").Subscribe(t.Context())
	if sub.Next() {
		t.Fatal("an event from a server that is not there")
	}
	if err := sub.Err(); Code(err) != codes.Canceled {
		t.Fatalf("error %v, want CANCELLED", err)
	}
}
