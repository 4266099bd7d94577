package sessions

import (
	"testing"
	"time"
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
