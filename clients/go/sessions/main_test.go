package sessions_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sessions-dev/sessions/clients/go/internal/testserver"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// reservedKey is passed to the test server as --reserved-metadata-key.
const reservedKey = "internalNote"

var (
	server *testserver.Server
	client *sessions.Client
)

// TestMain starts one real sessions-server for the whole test binary and stops it after.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	server, err = testserver.Start("--reserved-metadata-key", reservedKey)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot start sessions-server:", err)
		return 1
	}
	defer func() {
		if err := server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping sessions-server:", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err = sessions.Dial(ctx, server.Addr, sessions.WithBlock())
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot connect to sessions-server:", err)
		return 1
	}
	defer client.Close()
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "--- sessions-server log (tail) ---\n%s\n", server.LogTail(8000))
	}
	return code
}

// objectKey returns an object key no other test uses.
func objectKey(t *testing.T) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "go-test/" + t.Name() + "/" + hex.EncodeToString(b[:])
}

func newSession(t *testing.T) *sessions.Session {
	t.Helper()
	return client.Object(objectKey(t)).Session("s")
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// textMessage is a minimal UIMessage as compact JSON text.
func textMessage(id, role, text string) json.RawMessage {
	type part struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type message struct {
		ID    string `json:"id"`
		Role  string `json:"role"`
		Parts []part `json:"parts"`
	}
	data, err := json.Marshal(message{ID: id, Role: role, Parts: []part{{Type: "text", Text: text}}})
	if err != nil {
		panic(err)
	}
	return data
}

func ids(msgs []sessions.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Info.ID
	}
	return out
}

func mustAppend(t *testing.T, s *sessions.Session, msg any, opts ...sessions.Option) sessions.AppendResult {
	t.Helper()
	res, err := s.AppendMessage(testCtx(t), msg, opts...)
	if err != nil {
		t.Fatalf("AppendMessage: %v", err)
	}
	return res
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00") && len(a) == len(b)
}

func collectHistory(t *testing.T, s *sessions.Session, opts ...sessions.ReadOption) []string {
	t.Helper()
	msgs, err := s.GetHistory(testCtx(t), opts...)
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	return ids(msgs)
}

// restartable is a server of the test's own, on an address and data directory that a restart
// (testserver.StartAt(addr, dataDir, args...)) keeps, with a client connected to it.
type restartable struct {
	addr, dataDir string
	args          []string
	first         *testserver.Server
	client        *sessions.Client
}

func startRestartable(t *testing.T, ctx context.Context, args ...string) restartable {
	t.Helper()
	addr, err := testserver.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	first, err := testserver.StartAt(addr, dataDir, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Stop() })
	c, err := sessions.Dial(ctx, addr, sessions.WithBlock())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return restartable{addr: addr, dataDir: dataDir, args: args, first: first, client: c}
}

// restart starts the server again on the same address and data (after first.Stop()).
func (r restartable) restart(t *testing.T) {
	t.Helper()
	second, err := testserver.StartAt(r.addr, r.dataDir, r.args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Stop() })
}
