package sessions_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/sessions-dev/sessions/clients/go/internal/testserver"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// TestBearerToken runs against a second server that checks bearer tokens: WithToken must reach
// unary calls, client streams and server streams alike.
func TestBearerToken(t *testing.T) {
	ctx := testCtx(t)
	digest := func(token string) string {
		sum := sha256.Sum256([]byte(token))
		return hex.EncodeToString(sum[:])
	}
	doc, _ := json.Marshal(map[string]any{"tokens": []map[string]any{
		{"name": "writer", "sha256": digest("w-secret"), "prefixes": []string{"tenant-a/"}, "access": "write"},
		{"name": "reader", "sha256": digest("r-secret"), "prefixes": []string{"tenant-a/"}, "access": "read"},
	}})
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(tokens, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := testserver.Start("--tokens-file", tokens)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()

	dial := func(opts ...sessions.DialOption) *sessions.Client {
		c, err := sessions.Dial(ctx, srv.Addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	const key = "tenant-a/agent"
	msg := textMessage("m", "user", "hi")

	if _, err := dial().Object(key).Session("").AppendMessage(ctx, msg); sessions.Code(err) != codes.Unauthenticated || sessions.Reason(err) != sessions.ReasonUnauthenticated {
		t.Fatalf("no token: %v", err)
	}
	writer := dial(sessions.WithToken("w-secret")).Object(key).Session("")
	if _, err := writer.AppendMessage(ctx, msg); err != nil {
		t.Fatalf("write token: %v", err)
	}
	if _, err := writer.ImportMessages(ctx, sessions.ImportChain(textMessage("i", "user", "x"))); err != nil {
		t.Fatalf("write token, client stream: %v", err)
	}
	if _, err := writer.AppendMessage(ctx, bigMessage("big", 4*1024*1024)); err != nil {
		t.Fatalf("write token, upload stream: %v", err)
	}
	reader := dial(sessions.WithToken("r-secret")).Object(key).Session("")
	if _, err := reader.AppendMessage(ctx, textMessage("n", "user", "x")); sessions.Code(err) != codes.PermissionDenied {
		t.Fatalf("read token writing: %v", err)
	}
	if got := collectHistory(t, reader); !equalStrings(got, []string{"i", "big"}) { // the import started a new root
		t.Fatalf("read token, history = %v", got)
	}
	other := dial(sessions.WithToken("w-secret")).Object("tenant-b/x").Session("")
	if _, _, err := other.GetMessage(ctx, "m"); sessions.Code(err) != codes.PermissionDenied {
		t.Fatalf("token outside its prefix: %v", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := reader.Subscribe(sctx, sessions.IncludeProgress())
	defer sub.Close()
	if !sub.Next() || sub.Event().Type != sessions.ChangeProgress {
		t.Fatalf("read token, subscribe: %v", sub.Err())
	}
}
