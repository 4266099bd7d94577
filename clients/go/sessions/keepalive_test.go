package sessions_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// blackhole relays TCP connections to a target until vanish; from then on it moves no bytes
// either way but keeps every connection open: a server whose host or network went away.
type blackhole struct {
	listener net.Listener
	target   string
	vanished chan struct{}
	once     sync.Once
	mu       sync.Mutex
	conns    []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{listener: listener, target: target, vanished: make(chan struct{})}
	go b.accept()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.listener.Addr().String() }

func (b *blackhole) vanish() { b.once.Do(func() { close(b.vanished) }) }

func (b *blackhole) accept() {
	for {
		client, err := b.listener.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, client, server)
		b.mu.Unlock()
		go b.pump(client, server)
		go b.pump(server, client)
	}
}

func (b *blackhole) pump(source, sink net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := source.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-b.vanished:
			return // a vanished peer reads nothing more and answers nothing
		default:
		}
		if _, err := sink.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (b *blackhole) close() {
	_ = b.listener.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, conn := range b.conns {
		_ = conn.Close()
	}
}

// TestSubscriptionNoticesAVanishedServer cuts the network under a live subscription without
// closing its connection: the client's keepalive pings go unanswered and the subscription ends
// with UNAVAILABLE (which it would resume from, given reconnect attempts) instead of waiting
// forever for an event.
func TestSubscriptionNoticesAVanishedServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
	defer cancel()
	hole := newBlackhole(t, server.Addr)
	// 10 s is grpc-go's shortest keepalive time.
	c, err := sessions.Dial(ctx, hole.addr(), sessions.WithBlock(), sessions.WithKeepalive(10*time.Second, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub := c.Object(objectKey(t)).Subscribe(ctx, sessions.IncludeProgress(), sessions.WithReconnectAttempts(0))
	defer sub.Close()
	if ev := nextEvent(t, sub); ev.Type != sessions.ChangeProgress {
		t.Fatalf("first event = %v, want PROGRESS", ev.Type)
	}

	hole.vanish()
	ended := make(chan bool, 1)
	go func() { ended <- sub.Next() }()
	select {
	case more := <-ended:
		if more {
			t.Fatalf("an event came through a vanished connection: %v", sub.Event().Type)
		}
		if code := sessions.Code(sub.Err()); code != codes.Unavailable {
			t.Fatalf("the subscription ended with %v, want UNAVAILABLE", sub.Err())
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the subscription still waits for a server that vanished 40 s ago")
	}
}
