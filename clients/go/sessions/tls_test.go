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
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/sessions-dev/sessions/clients/go/internal/testserver"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// selfSigned writes a certificate for 127.0.0.1 that no client trusts, and its key.
func selfSigned(t *testing.T) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "untrusted"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certPath, keyPath = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
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
