package credentials

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
)

// KeySize is the size of every key file the daemon keeps.
const KeySize = 32

// LoadKey reads the key file name in dir, creating it (KeySize random
// bytes, mode 0600) on first use. A new key is written to a temp file,
// synced, linked into place (so a concurrent first start cannot replace a
// key already in use: the loser reads the winner's) and the directory
// synced, so a crash never leaves a key that was used but is lost. The
// caller checks the size of a key it read.
func LoadKey(dir, name string) ([]byte, error) {
	path := filepath.Join(dir, name)
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return createKey(dir, name, path)
	}
	return key, err
}

func createKey(dir, name, path string) ([]byte, error) {
	key := make([]byte, KeySize)
	rand.Read(key) // never fails (crypto/rand panics instead)
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.Write(key)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if err := os.Link(tmp, path); errors.Is(err, os.ErrExist) {
		// Another process made it first: use theirs.
		return os.ReadFile(path)
	} else if err != nil {
		return nil, err
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return nil, err
	}
	return key, nil
}
