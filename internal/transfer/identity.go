package transfer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// MaxCertificateBytes bounds a published certificate (PEM).
const MaxCertificateBytes = 4096

// Identity is a node's transfer key pair and self-signed certificate.
type Identity struct {
	Node string
	// CertPEM is the certificate to publish.
	CertPEM []byte
	cert    tls.Certificate
}

// LoadOrCreateIdentity reads the identity kept in dir (transfer-key.pem,
// transfer-cert.pem), making it the first time. It is kept across
// restarts, so the certificate peers pinned stays valid.
func LoadOrCreateIdentity(dir, node string) (*Identity, error) {
	keyPath, certPath := filepath.Join(dir, "transfer-key.pem"), filepath.Join(dir, "transfer-cert.pem")
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil {
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("transfer identity in %s: %v: %w", dir, err, errdefs.ErrInternal)
		}
		return &Identity{Node: node, CertPEM: certPEM, cert: c}, nil
	}
	if !errors.Is(cerr, fs.ErrNotExist) && cerr != nil {
		return nil, fmt.Errorf("transfer identity: %v: %w", cerr, errdefs.ErrInternal)
	}
	id, keyPEM, err := NewIdentity(node)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("transfer identity: %v: %w", err, errdefs.ErrInternal)
	}
	// The key first: a certificate without its key is never left behind.
	if err := writeFileSync(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileSync(certPath, id.CertPEM, 0o644); err != nil {
		return nil, err
	}
	return id, nil
}

// NewIdentity makes a fresh key pair (ECDSA P-256) and a self-signed
// certificate naming node; it returns the key too (PEM).
func NewIdentity(node string) (*Identity, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("transfer key: %v: %w", err, errdefs.ErrInternal)
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "forkbox-node:" + node},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(20, 0, 0), // pinned: its expiry protects nothing
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("transfer certificate: %v: %w", err, errdefs.ErrInternal)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("transfer key: %v: %w", err, errdefs.ErrInternal)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("transfer identity: %v: %w", err, errdefs.ErrInternal)
	}
	return &Identity{Node: node, CertPEM: certPEM, cert: c}, keyPEM, nil
}

func writeFileSync(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err == nil {
		_, err = f.Write(b)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	return nil
}

// CertDER decodes a published certificate (PEM, bounded) to DER.
func CertDER(certPEM []byte) ([]byte, error) {
	if len(certPEM) == 0 {
		return nil, fmt.Errorf("no transfer certificate: %w", errdefs.ErrFailedPrecondition)
	}
	if len(certPEM) > MaxCertificateBytes {
		return nil, fmt.Errorf("transfer certificate is %d bytes, limit %d: %w", len(certPEM), MaxCertificateBytes, errdefs.ErrInvalidArgument)
	}
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("transfer certificate is not a PEM certificate: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := x509.ParseCertificate(b.Bytes); err != nil {
		return nil, fmt.Errorf("transfer certificate: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return b.Bytes, nil
}

// Fingerprint is the SHA-256 of a certificate's DER, in hex.
func Fingerprint(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:])
}

// Trust tells a server which node a client certificate belongs to.
type Trust interface {
	// NodeOf returns the node that published the certificate der, or an
	// error (PermissionDenied) when no node did.
	NodeOf(ctx context.Context, der []byte) (string, error)
}

// StaticTrust trusts a fixed set of certificates: node → certificate PEM.
type StaticTrust map[string][]byte

// NodeOf implements Trust. A certificate that more than one node
// publishes is none's: a node may publish another's (it is public), and
// its holder would be taken for either.
func (t StaticTrust) NodeOf(_ context.Context, der []byte) (string, error) {
	var nodes []string
	for node, p := range t {
		if d, err := CertDER(p); err == nil && bytes.Equal(d, der) {
			nodes = append(nodes, node)
		}
	}
	switch len(nodes) {
	case 0:
		return "", fmt.Errorf("client certificate %s is no node's: %w", Fingerprint(der), errdefs.ErrPermissionDenied)
	case 1:
		return nodes[0], nil
	}
	slices.Sort(nodes)
	return "", fmt.Errorf("client certificate %s is published by nodes %s: it is taken for none: %w", Fingerprint(der), strings.Join(nodes, ", "), errdefs.ErrPermissionDenied)
}

// trustTimeout bounds one Trust lookup during a handshake.
const trustTimeout = 10 * time.Second

// serverTLS accepts clients whose certificate trust names.
func serverTLS(id *Identity, trust Trust) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		ClientAuth:   tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) != 1 {
				return fmt.Errorf("want exactly one client certificate, got %d", len(raw))
			}
			ctx, cancel := context.WithTimeout(context.Background(), trustTimeout)
			defer cancel()
			_, err := trust.NodeOf(ctx, raw[0])
			return err
		},
	}
}

// clientTLS presents id and accepts only the server certificate pinned.
func clientTLS(id *Identity, pinned []byte) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		// The chain is not verified against a CA: the one certificate the
		// peer published is the only one accepted (below).
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) != 1 || !bytes.Equal(raw[0], pinned) {
				return fmt.Errorf("the peer's certificate is not the one it published (pinned %s)", Fingerprint(pinned))
			}
			return nil
		},
	}
}
