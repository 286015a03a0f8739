package ports

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"path/filepath"

	"github.com/forkbox/forkbox/internal/credentials"
)

// SecretFile is the name of the port-token secret in the state dir.
const SecretFile = "port-token.key"

// Keys derive and check port tokens.
type Keys struct{ secret []byte }

// OpenKeys reads the secret in stateDir, creating it (0600, 32 random
// bytes) on first use. It is written to a temp file, synced and linked into
// place, so two first starts agree on one secret and a crash leaves none or
// a whole one.
func OpenKeys(stateDir string) (*Keys, error) {
	path := filepath.Join(stateDir, SecretFile)
	secret, err := credentials.LoadKey(stateDir, SecretFile)
	if err != nil {
		return nil, fmt.Errorf("port token secret %s: %w", path, err)
	}
	if len(secret) != 32 {
		return nil, fmt.Errorf("port token secret %s is %d bytes, want 32 (delete it to make a new one; every preview link changes)", path, len(secret))
	}
	return &Keys{secret: secret}, nil
}

// NewKeys returns keys over a given secret (tests).
func NewKeys(secret []byte) *Keys { return &Keys{secret: secret} }

// Token returns the port token of sandbox id (43 URL-safe characters).
func (k *Keys) Token(id string) string {
	m := hmac.New(sha256.New, k.secret)
	m.Write([]byte("forkbox port token v1\x00"))
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Check reports whether token is sandbox id's, in constant time.
func (k *Keys) Check(id, token string) bool { return equal(token, k.Token(id)) }

// equal compares two secrets in time independent of where they differ.
func equal(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
