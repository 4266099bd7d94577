package sessions

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// scriptedConn answers each Read with the next of reads, and each Write with writeErr.
type scriptedConn struct {
	net.Conn
	reads    []scriptedRead
	writeErr error
}

type scriptedRead struct {
	n   int
	err error
}

func (c *scriptedConn) Read([]byte) (int, error) {
	r := c.reads[0]
	c.reads = c.reads[1:]
	return r.n, r.err
}

func (c *scriptedConn) Write(p []byte) (int, error) {
	if c.writeErr != nil {
		return 0, c.writeErr
	}
	return len(p), nil
}

func (c *scriptedConn) Close() error { return nil }

// TestHeardConnTellsARefusalFromAFault: a read or write that fails before the server sent
// anything is the server closing the connection before HTTP/2, named as a refused TLS handshake
// over TLS and as a server speaking TLS alone over plaintext; after it sent something, or once
// this side closed the connection or its deadline passed, the error is the connection's own.
func TestHeardConnTellsARefusalFromAFault(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	pipe := &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}
	refused := func(err error) bool {
		var r *closedBeforeHTTP2
		// Named so, and still a connection failure: tried again (a proxy ending TLS does the same).
		return errors.As(err, &r) && strings.Contains(err.Error(), tlsRefusedWords) &&
			!strings.Contains(err.Error(), plaintextClosedWords) &&
			!tlsFailed(&Error{Code: codeUnavailable, Message: "error reading server preface: " + err.Error()})
	}
	for _, cause := range []error{io.EOF, reset} {
		_, err := (&heardConn{Conn: &scriptedConn{reads: []scriptedRead{{0, cause}}}, tls: true}).Read(nil)
		if !refused(err) || !errors.Is(err, cause) {
			t.Errorf("a read failing with %v before the server spoke: %v, want a refusal wrapping it", cause, err)
		}
		_, err = (&heardConn{Conn: &scriptedConn{reads: []scriptedRead{{0, cause}}}}).Read(nil)
		var closed *closedBeforeHTTP2
		if !errors.As(err, &closed) || !errors.Is(err, cause) || !strings.Contains(err.Error(), plaintextClosedWords) ||
			strings.Contains(err.Error(), tlsRefusedWords) {
			t.Errorf("a plaintext read failing with %v before the server spoke: %v, want it named as a TLS server's", cause, err)
		}
	}
	if _, err := (&heardConn{Conn: &scriptedConn{writeErr: pipe}, tls: true}).Write([]byte("PRI")); !refused(err) {
		t.Errorf("a write failing before the server spoke: %v, want a refusal", err)
	}

	heard := &heardConn{Conn: &scriptedConn{reads: []scriptedRead{{9, nil}, {0, io.EOF}}, writeErr: pipe}}
	if _, err := heard.Read(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := heard.Read(nil); err != io.EOF {
		t.Errorf("a read failing after the server spoke: %v, want io.EOF as it is", err)
	}
	if _, err := heard.Write(nil); err != pipe {
		t.Errorf("a write failing after the server spoke: %v, want it as it is", err)
	}

	closed := &heardConn{Conn: &scriptedConn{reads: []scriptedRead{{0, io.EOF}}}}
	_ = closed.Close()
	if _, err := closed.Read(nil); err != io.EOF {
		t.Errorf("a read failing after this side's Close: %v, want io.EOF as it is", err)
	}
	for _, local := range []error{
		&net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}, // gRPC closed the TCP socket (connect deadline)
		&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded},
	} {
		if _, err := (&heardConn{Conn: &scriptedConn{reads: []scriptedRead{{0, local}}}}).Read(nil); err != local {
			t.Errorf("a read failing with %v before the server spoke: %v, want it as it is", local, err)
		}
	}
}

// TestRefusalAwareCredentials: TLS and plaintext credentials are wrapped, others not; the
// wrapper keeps their Info, its Clone is wrapped too, and a connection keeps the socket's
// syscall.Conn (channelz reads the socket's options through it).
func TestRefusalAwareCredentials(t *testing.T) {
	if plain := noticingRefusal(insecure.NewCredentials()); plain.Info().SecurityProtocol != "insecure" {
		t.Fatalf("plaintext credentials: %T %+v, want refusalAware with the plaintext Info", plain, plain.Info())
	} else if _, ok := plain.(refusalAware); !ok {
		t.Fatalf("plaintext credentials are %T, want refusalAware", plain)
	}
	if other := (otherProtocol{}); noticingRefusal(other) != other {
		t.Fatal("credentials of another protocol were wrapped")
	}
	creds := noticingRefusal(credentials.NewTLS(nil))
	if _, ok := creds.(refusalAware); !ok || creds.Info().SecurityProtocol != "tls" {
		t.Fatalf("TLS credentials: %T %+v, want refusalAware with the TLS Info", creds, creds.Info())
	}
	if _, ok := creds.Clone().(refusalAware); !ok {
		t.Fatalf("a clone is %T, want refusalAware", creds.Clone())
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	raw, err := net.Dial("tcp", listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	conn, _, err := refusalAware{handshakeless{}}.ClientHandshake(context.Background(), "", raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := conn.(syscall.Conn); !ok {
		t.Fatalf("a connection over TCP is %T, want it to keep syscall.Conn", conn)
	}
	conn, _, _ = refusalAware{handshakeless{}}.ClientHandshake(context.Background(), "", &scriptedConn{})
	if _, ok := conn.(syscall.Conn); ok {
		t.Fatalf("a connection over a conn without syscall.Conn is %T, want none", conn)
	}
}

// handshakeless is TLS credentials whose handshake returns the connection as it is.
type handshakeless struct {
	credentials.TransportCredentials
}

func (handshakeless) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (handshakeless) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, nil, nil
}

// otherProtocol is transport credentials of a protocol neither TLS nor plaintext.
type otherProtocol struct {
	credentials.TransportCredentials
}

func (otherProtocol) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "alts"}
}
