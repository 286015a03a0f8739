// Package credentials owns the rules for a sandbox's named secrets: what a
// valid credential is, how its value is sealed at rest (AES-256-GCM under
// a key kept in the state directory, mode 0600), and what a child sandbox
// inherits from its source. It is pure logic over store records: the
// daemon stores the sealed values and delivers them (env of each exec,
// files on the sandbox's /run/secrets tmpfs); the database, the ledger and
// the logs never see a clear value.
package credentials

import (
	"fmt"
	"regexp"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

const (
	// SecretsDir is where file credentials appear in a sandbox: a tmpfs
	// outside the writable layer, so never in a snapshot.
	SecretsDir = "/run/secrets"
	// MaxPerSandbox bounds a sandbox's credentials.
	MaxPerSandbox = 64
	// MaxBytes bounds one credential's value.
	MaxBytes = 64 << 10
)

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Spec is how a credential is injected: as the env variable Env of every
// exec, as the file SecretsDir/File, or both. A PerFork credential is not
// copied to forks: each fork must be given its own value.
type Spec struct {
	Name    string
	Env     string
	File    string
	PerFork bool
}

// Check validates a credential and its value.
func Check(c Spec, value string) error {
	if !nameRE.MatchString(c.Name) {
		return fmt.Errorf("credential name %q: use letters, digits, '_', '.', '-': %w", c.Name, errdefs.ErrInvalidArgument)
	}
	if c.Env == "" && c.File == "" {
		return fmt.Errorf("credential %s: say how to inject it (env, file or both): %w", c.Name, errdefs.ErrInvalidArgument)
	}
	if c.Env != "" && !envKeyRE.MatchString(c.Env) {
		return fmt.Errorf("credential %s: env %q is not a variable name: %w", c.Name, c.Env, errdefs.ErrInvalidArgument)
	}
	if c.File != "" && !nameRE.MatchString(c.File) {
		return fmt.Errorf("credential %s: file %q must be a plain file name (it goes under %s): %w", c.Name, c.File, SecretsDir, errdefs.ErrInvalidArgument)
	}
	if len(value) > MaxBytes {
		return fmt.Errorf("credential %s is %d bytes, more than %d: %w", c.Name, len(value), MaxBytes, errdefs.ErrResourceExhausted)
	}
	return nil
}

// Inherit returns what a child of a source with creds gets: the source's
// credentials, with those named in given resealed with the given values. A
// per-fork credential without a given value is a FailedPrecondition error;
// a value for a credential the source does not have is an InvalidArgument
// error. creds is not modified.
func Inherit(s *Sealer, creds []*store.Credential, given map[string]string) ([]*store.Credential, error) {
	known := map[string]bool{}
	var out []*store.Credential
	for _, c := range creds {
		known[c.Name] = true
		cc := *c
		if v, ok := given[c.Name]; ok {
			if err := Check(Spec{Name: c.Name, Env: c.Env, File: c.File}, v); err != nil {
				return nil, err
			}
			cc.Sealed = s.Seal(c.Name, []byte(v))
		} else if c.PerFork {
			return nil, fmt.Errorf("credential %s is per-fork: the fork must supply its value: %w", c.Name, errdefs.ErrFailedPrecondition)
		}
		out = append(out, &cc)
	}
	for name := range given {
		if !known[name] {
			return nil, fmt.Errorf("credential %s: the source has no such credential: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return out, nil
}

// Env returns the env variables that creds add to every exec (nil when
// none do).
func Env(s *Sealer, creds []*store.Credential) (map[string]string, error) {
	var env map[string]string
	for _, c := range creds {
		if c.Env == "" {
			continue
		}
		v, err := s.Open(c.Name, c.Sealed)
		if err != nil {
			return nil, fmt.Errorf("credential %w", err)
		}
		if env == nil {
			env = map[string]string{}
		}
		env[c.Env] = string(v)
	}
	return env, nil
}
