package credentials

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"path/filepath"

	"github.com/forkbox/forkbox/errdefs"
)

// KeyFile is the name of the sealing key in the state directory.
const KeyFile = "credentials.key"

// Sealer seals values with AES-256-GCM. What a value is bound to (a
// credential's name, a ledger entry's identity) is passed as additional
// data: a sealed value moved to another binding does not open.
type Sealer struct{ aead cipher.AEAD }

// NewSealer returns a sealer for a 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("sealing key is %d bytes, want 32: %w", len(key), errdefs.ErrFailedPrecondition)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("sealing key: %v: %w", err, errdefs.ErrInternal)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("sealing key: %v: %w", err, errdefs.ErrInternal)
	}
	return &Sealer{aead: aead}, nil
}

// OpenSealer loads the key in stateDir, creating it on first use. A new key
// is written to a temp file, synced, linked into place (so a concurrent
// first start cannot replace a key already in use) and the directory
// synced, so a crash never leaves a key that sealed values but is lost.
func OpenSealer(stateDir string) (*Sealer, error) {
	path := filepath.Join(stateDir, KeyFile)
	key, err := LoadKey(stateDir, KeyFile)
	if err != nil {
		return nil, fmt.Errorf("credentials key %s: %w", path, err)
	}
	s, err := NewSealer(key)
	if err != nil {
		return nil, fmt.Errorf("credentials key %s: %w", path, err)
	}
	return s, nil
}

// Seal encrypts value bound to name.
func (s *Sealer) Seal(name string, value []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize())
	rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, value, []byte(name))
}

// Open decrypts a value sealed bound to name. A value sealed under another
// key or name, or altered, is an Internal error.
func (s *Sealer) Open(name string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return nil, fmt.Errorf("%s: sealed value too short: %w", name, errdefs.ErrInternal)
	}
	v, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(name))
	if err != nil {
		return nil, fmt.Errorf("%s: cannot unseal (wrong key?): %w", name, errdefs.ErrInternal)
	}
	return v, nil
}
