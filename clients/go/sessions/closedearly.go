package sessions

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc/credentials"
)

// tlsRefusedWords are in the message of every failure of a connection closed after its TLS
// handshake, before the server spoke HTTP/2; plaintextClosedWords in that of a plaintext
// connection closed before it (closedBeforeHTTP2).
const (
	tlsRefusedWords      = "it may have refused the TLS handshake"
	plaintextClosedWords = "it may speak TLS alone"
)

// closedBeforeHTTP2 is a connection the server closed before sending anything, even HTTP/2's
// SETTINGS, which every HTTP/2 server sends first. grpc-go reports it as the transport's error
// alone ("error reading server preface: EOF", or a write's "broken pipe"), which reads like a
// network fault. Over TLS it is what a server that refused the handshake does (with TLS 1.3 the
// client's side of the handshake ends before the server has checked the client's certificate);
// over plaintext, what a server speaking TLS alone does with the plaintext HTTP/2 it reads. A
// proxy in front of a server it cannot reach (one restarting) does the same, so it is tried
// again as any connection failure; the error says what it may be, for when the tries run out,
// in the Python and TypeScript clients' words.
type closedBeforeHTTP2 struct {
	cause error
	tls   bool
}

func (e *closedBeforeHTTP2) Error() string {
	if !e.tls {
		return "the server closed the connection before it spoke HTTP/2 (" + e.cause.Error() + "): " +
			plaintextClosedWords + " (a server run with --tls-cert does: dial WithTransportCredentials " +
			"with credentials.NewTLS), or a proxy in front of it could not reach it"
	}
	return "the server closed the TLS connection before it spoke HTTP/2 (" + e.cause.Error() + "): " +
		tlsRefusedWords + ", most likely for want of a client certificate it trusts (a server run with " +
		"--tls-client-ca requires one: give WithTransportCredentials a tls.Config with Certificates), or a " +
		"proxy that ends TLS in front of it could not reach it"
}

func (e *closedBeforeHTTP2) Unwrap() error { return e.cause }

// refusalAware wraps TLS or plaintext transport credentials so that the connections they make
// tell a server that closed them before HTTP/2 from a network fault (closedBeforeHTTP2).
// Everything else is the wrapped credentials'.
type refusalAware struct {
	credentials.TransportCredentials
}

// noticingRefusal wraps creds when they speak TLS or plaintext (not other protocols, whose
// handshakes may end otherwise).
func noticingRefusal(creds credentials.TransportCredentials) credentials.TransportCredentials {
	if protocol := creds.Info().SecurityProtocol; protocol != "tls" && protocol != "insecure" {
		return creds
	}
	return refusalAware{creds}
}

func (c refusalAware) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return conn, info, err
	}
	heard := &heardConn{Conn: conn, tls: c.Info().SecurityProtocol == "tls"}
	if sys, ok := conn.(syscall.Conn); ok {
		// gRPC's TLS connection lends the TCP socket's SyscallConn, as the socket itself does
		// (channelz reads its options).
		return heardSyscallConn{heard, sys}, info, nil
	}
	return heard, info, nil
}

func (c refusalAware) Clone() credentials.TransportCredentials {
	return refusalAware{c.TransportCredentials.Clone()}
}

// heardConn is a connection that knows whether the server has sent anything on it yet. A read or
// a write that fails before is the server closing it before it spoke HTTP/2 (closedBeforeHTTP2),
// unless this side closed it (gRPC at the connect deadline, or the client's Close).
type heardConn struct {
	net.Conn
	tls    bool // whether it speaks TLS, for the words of closedBeforeHTTP2
	heard  atomic.Bool
	closed atomic.Bool
}

func (c *heardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.heard.Store(true)
	}
	return n, c.refusal(err)
}

func (c *heardConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	return n, c.refusal(err)
}

func (c *heardConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

func (c *heardConn) refusal(err error) error {
	if err == nil || c.heard.Load() || c.closed.Load() || errors.Is(err, net.ErrClosed) {
		return err
	}
	var timeout interface{ Timeout() bool }
	if errors.As(err, &timeout) && timeout.Timeout() {
		return err // a deadline of this side's, not the server's doing
	}
	return &closedBeforeHTTP2{cause: err, tls: c.tls}
}

type heardSyscallConn struct {
	*heardConn
	sys syscall.Conn
}

func (c heardSyscallConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }
