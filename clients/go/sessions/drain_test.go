package sessions_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// A history stream that the server's stop cuts at the end of its drain, a message half received,
// failed INTERNAL "unexpected EOF" (grpc-go's own word for it), where the Python and TypeScript
// clients report the cancellation, UNAVAILABLE, which callers and retries take as a lost
// connection (a clients audit, session 48).
func TestAStreamCutInTheMiddleOfAResponseByAStopIsUnavailable(t *testing.T) {
	ctx := testCtx(t)
	server := startRestartable(t, ctx, "--drain-seconds", "0.3")
	s := server.client.Object(objectKey(t)).Session("")
	for i := 0; i < 6; i++ {
		mustAppend(t, s, textMessage(fmt.Sprint("m", i), "user", strings.Repeat("x", 3_000_000)))
	}
	it := s.History(ctx)
	if !it.Next() {
		t.Fatalf("first message: %v", it.Err())
	}
	// Not read further: the server's stream waits on flow control, its response half sent,
	// until the drain ends and the stop cancels it.
	if err := server.first.Stop(); err != nil {
		t.Fatal(err)
	}
	for it.Next() {
	}
	var failure *sessions.Error
	if !errors.As(it.Err(), &failure) || failure.Code != codes.Unavailable {
		t.Fatalf("history cut by the stop: %v, want UNAVAILABLE", it.Err())
	}
}
