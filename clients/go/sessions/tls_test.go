package sessions_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/sessions-dev/sessions/clients/go/internal/testserver"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// selfSigned writes a certificate for 127.0.0.1 that no client trusts (its CA is the test's
// alone), and its key.
func selfSigned(t *testing.T) (certPath, keyPath string) {
	t.Helper()
	cert, key := newIssuer(t, "untrusted CA").issue(t, "untrusted", x509.ExtKeyUsageServerAuth)
	dir := t.TempDir()
	return writeFile(t, dir, "server.pem", cert), writeFile(t, dir, "server.key", key)
}

// TestAFailedTLSHandshakeIsNotRetried: the next attempt meets the same certificates, so the call
// fails at its first (it was tried 9 times more, about 8 s), and a subscription does not
// reconnect after it; as the Python and TypeScript clients do.
func TestAFailedTLSHandshakeIsNotRetried(t *testing.T) {
	ctx := testCtx(t)
	cert, key := selfSigned(t)
	srv, err := testserver.Start("--tls-cert", cert, "--tls-key", key)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	var log retryLog
	untrusting := credentials.NewTLS(&tls.Config{RootCAs: x509.NewCertPool()})
	client, err := sessions.Dial(ctx, srv.Addr, append(log.options(), sessions.WithTransportCredentials(untrusting))...)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	session := client.Object("tls").Session("")
	if _, err := session.GetHistoryRowStats(ctx); sessions.Code(err) != codes.Unavailable {
		t.Fatalf("a call over an untrusted certificate: %v, want UNAVAILABLE", err)
	}
	if notices := log.seen(); len(notices) != 0 {
		t.Fatalf("tried again %d times after a failed handshake: %v", len(notices), notices[0].Err)
	}
	events := client.Object("tls").Subscribe(ctx)
	defer events.Close()
	if events.Next() || sessions.Code(events.Err()) != codes.Unavailable {
		t.Fatalf("a subscription over an untrusted certificate: %v, want UNAVAILABLE", events.Err())
	}
	if attempts := log.attemptsOf("Subscribe"); attempts != 1 {
		t.Fatalf("the subscription was opened %d times, want 1", attempts)
	}
}

// issuer is a CA of the tests' own.
type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial atomic.Int64

// signed makes a key and a certificate of template (a day long, from an hour ago), signed by
// parent, or by its own key when parent is nil.
func signed(t *testing.T, template *x509.Certificate, parent *issuer) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template.SerialNumber = big.NewInt(serial.Add(1))
	template.NotBefore, template.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	signer, signerKey := template, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, template, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func newIssuer(t *testing.T, name string) *issuer {
	t.Helper()
	der, key := signed(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}, nil)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &issuer{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate for 127.0.0.1 signed by the issuer, for a server or a client, and
// its key, in PEM.
func (ca *issuer) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	der, key := signed(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}, ca)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// keyPair is a client certificate from ca, and its key.
func keyPair(t *testing.T, ca *issuer, name string) tls.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(ca.issue(t, name, x509.ExtKeyUsageClientAuth))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// TestARefusedClientCertificateIsRetriedThenNamed: a server run with --tls-client-ca refuses a
// client without a certificate, or with one of another CA. With TLS 1.3 the client's side of the
// handshake ends before the server has checked the certificate, and the server then closes the
// connection before it speaks HTTP/2, as a proxy ending TLS in front of a server it cannot reach
// does: grpc-go says only "error reading server preface: EOF" (or a broken pipe). Tried again as
// a connection failure, the call's failure names the likely cause, a client certificate, instead
// of reading like a network fault; so does a subscription's once its reconnections run out.
func TestARefusedClientCertificateIsRetriedThenNamed(t *testing.T) {
	ca := newIssuer(t, "sessions test CA")
	dir := t.TempDir()
	serverCert, serverKey := ca.issue(t, "server", x509.ExtKeyUsageServerAuth)
	srv, err := testserver.Start(
		"--tls-cert", writeFile(t, dir, "server.pem", serverCert),
		"--tls-key", writeFile(t, dir, "server.key", serverKey),
		"--tls-client-ca", writeFile(t, dir, "ca.pem", ca.pem),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	trusted := keyPair(t, ca, "client")
	foreign := keyPair(t, newIssuer(t, "another CA"), "stranger")
	dial := func(t *testing.T, log *retryLog, certificates ...tls.Certificate) *sessions.Client {
		creds := credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certificates})
		return dialRetrying(t, srv.Addr, log, sessions.WithTransportCredentials(creds), sessions.WithRetry(fastRetry))
	}
	for name, certificates := range map[string][]tls.Certificate{"none": nil, "another CA's": {foreign}} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			var log retryLog
			object := dial(t, &log, certificates...).Object("mtls")
			_, err := object.Session("").AppendMessage(ctx, textMessage("m1", "user", "hi"))
			checkRefused(t, "AppendMessage", err)
			events := object.Subscribe(ctx, sessions.WithReconnectAttempts(2))
			defer events.Close()
			if events.Next() {
				t.Fatalf("a subscription without a trusted certificate delivered %+v", events.Event())
			}
			if appends, subscribes := log.attemptsOf("AppendMessage"), log.attemptsOf("Subscribe"); appends != 3 || subscribes != 3 {
				t.Fatalf("%d appends and %d subscriptions opened, want 3 of each: %v", appends, subscribes, events.Err())
			}
			checkRefused(t, "Subscribe", events.Err())
		})
	}
	t.Run("plaintext", func(t *testing.T) {
		// A TLS server reads plaintext HTTP/2 as a broken handshake and closes the connection
		// without a byte: tried again as a network fault, then named as a server speaking TLS.
		var log retryLog
		object := dialRetrying(t, srv.Addr, &log, sessions.WithRetry(fastRetry)).Object("mtls")
		_, err := object.Session("").AppendMessage(testCtx(t), textMessage("m1", "user", "hi"))
		if sessions.Code(err) != codes.Unavailable || sessions.Reason(err) != "" || log.attemptsOf("AppendMessage") != 3 {
			t.Fatalf("a plaintext call to a TLS server: %v after %d attempts, want UNAVAILABLE after 3", err, log.attemptsOf("AppendMessage"))
		}
		for _, words := range []string{
			"the server closed the connection before it spoke HTTP/2 (",
			"): it may speak TLS alone (a server run with --tls-cert does: dial WithTransportCredentials",
			"or a proxy in front of it could not reach it",
		} {
			if !strings.Contains(err.Error(), words) {
				t.Fatalf("a plaintext call to a TLS server: %v, want it to say %q", err, words)
			}
		}
	})
	t.Run("trusted", func(t *testing.T) {
		ctx := testCtx(t)
		object := dial(t, &retryLog{}, trusted).Object("mtls-trusted")
		if _, err := object.Session("").AppendMessage(ctx, textMessage("m1", "user", "hi")); err != nil {
			t.Fatalf("AppendMessage with a trusted certificate: %v", err)
		}
		events := object.Subscribe(ctx, sessions.IncludeProgress())
		defer events.Close()
		if !events.Next() || events.Event().Type != sessions.ChangeProgress {
			t.Fatalf("subscription with a trusted certificate: %+v, %v; want its PROGRESS", events.Event(), events.Err())
		}
	})
}

func checkRefused(t *testing.T, call string, err error) {
	t.Helper()
	if sessions.Code(err) != codes.Unavailable || sessions.Reason(err) != "" {
		t.Fatalf("%s without a certificate the server trusts: %v, want UNAVAILABLE without a reason", call, err)
	}
	for _, words := range []string{
		"the server closed the TLS connection before it spoke HTTP/2 (",
		"): it may have refused the TLS handshake, most likely for want of a client certificate it trusts",
		"(a server run with --tls-client-ca requires one: give WithTransportCredentials a tls.Config with Certificates)",
		"or a proxy that ends TLS in front of it could not reach it",
	} {
		if !strings.Contains(err.Error(), words) {
			t.Fatalf("%s: %v, want it to say %q", call, err, words)
		}
	}
}

// TestAConnectionClosedBeforeHTTP2IsRetried: a server that hangs up before it speaks HTTP/2 over
// plaintext ("error reading server preface: EOF"), or in the middle of a TLS handshake
// ("authentication handshake failed: EOF": a server stopping, a load balancer whose backend went
// away), is a network fault: the call is tried again and a subscription reconnects.
func TestAConnectionClosedBeforeHTTP2IsRetried(t *testing.T) {
	for _, c := range []struct {
		name  string
		creds []sessions.DialOption
	}{
		{"plaintext", nil},
		{"TLS cut mid-handshake", []sessions.DialOption{
			sessions.WithTransportCredentials(credentials.NewTLS(&tls.Config{ServerName: "127.0.0.1"})),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			listener, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer listener.Close()
			go func() {
				for {
					conn, err := listener.Accept()
					if err != nil {
						return
					}
					_, _ = conn.Read(make([]byte, 65536))
					_ = conn.Close()
				}
			}()
			var log retryLog
			opts := append([]sessions.DialOption{sessions.WithRetry(fastRetry)}, c.creds...)
			object := dialRetrying(t, listener.Addr().String(), &log, opts...).Object("hangs-up")
			_, err = object.Session("").GetHistoryRowStats(ctx)
			if sessions.Code(err) != codes.Unavailable || strings.Contains(err.Error(), "refused the TLS") {
				t.Fatalf("a call to a server that hangs up: %v, want UNAVAILABLE of the connection", err)
			}
			// A plaintext connection closed before HTTP/2 is also what a server speaking TLS alone does.
			if named := strings.Contains(err.Error(), "it may speak TLS alone"); named != (c.name == "plaintext") {
				t.Fatalf("a call to a server that hangs up (%s): %v, named as a TLS server's: %v", c.name, err, named)
			}
			events := object.Subscribe(ctx, sessions.WithReconnectAttempts(2))
			defer events.Close()
			if events.Next() || sessions.Code(events.Err()) != codes.Unavailable {
				t.Fatalf("a subscription to a server that hangs up: %v, want UNAVAILABLE", events.Err())
			}
			if calls, subscribes := log.attemptsOf("GetHistoryRowStats"), log.attemptsOf("Subscribe"); calls != 3 || subscribes != 3 {
				t.Fatalf("%d calls and %d subscriptions opened, want 3 of each (last error %v)", calls, subscribes, err)
			}
		})
	}
}
