package daemon

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// Credentials are stored sealed with AES-256-GCM under a key kept in the
// state directory (mode 0600); the database, the ledger and the logs never
// see a clear value. They reach a sandbox as env variables of each exec
// (added by the daemon, not recorded) or as files on a tmpfs at
// /run/secrets, which is outside the writable layer and so never in a
// snapshot: a per-fork credential cannot leak into a fork through its files.

const (
	secretsDir     = "/run/secrets"
	maxCredentials = 64
	maxCredBytes   = 64 << 10
)

var credNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

type sealer struct{ aead cipher.AEAD }

// openSealer loads (or creates) the credentials key.
func openSealer(stateDir string) (*sealer, error) {
	path := filepath.Join(stateDir, "credentials.key")
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, key, 0o600); err != nil {
			return nil, fmt.Errorf("credentials key: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, fmt.Errorf("credentials key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("credentials key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("credentials key %s is %d bytes, want 32: %w", path, len(key), errdefs.ErrFailedPrecondition)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

// seal encrypts value; the credential's name is bound as additional data.
func (s *sealer) seal(name string, value []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize())
	rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, value, []byte(name))
}

func (s *sealer) open(name string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, fmt.Errorf("credential %s: sealed value too short: %w", name, errdefs.ErrInternal)
	}
	v, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(name))
	if err != nil {
		return nil, fmt.Errorf("credential %s: cannot unseal (wrong key?): %w", name, errdefs.ErrInternal)
	}
	return v, nil
}

// CredentialSpec is how a credential is injected.
type CredentialSpec struct {
	Name    string
	Env     string
	File    string
	PerFork bool
}

func checkCredential(c CredentialSpec, value string) error {
	if !credNameRE.MatchString(c.Name) {
		return fmt.Errorf("credential name %q: use letters, digits, '_', '.', '-': %w", c.Name, errdefs.ErrInvalidArgument)
	}
	if c.Env == "" && c.File == "" {
		return fmt.Errorf("credential %s: say how to inject it (env, file or both): %w", c.Name, errdefs.ErrInvalidArgument)
	}
	if c.Env != "" && !envKeyRE.MatchString(c.Env) {
		return fmt.Errorf("credential %s: env %q is not a variable name: %w", c.Name, c.Env, errdefs.ErrInvalidArgument)
	}
	if c.File != "" && !credNameRE.MatchString(c.File) {
		return fmt.Errorf("credential %s: file %q must be a plain file name (it goes under %s): %w", c.Name, c.File, secretsDir, errdefs.ErrInvalidArgument)
	}
	if len(value) > maxCredBytes {
		return fmt.Errorf("credential %s is %d bytes, more than %d: %w", c.Name, len(value), maxCredBytes, errdefs.ErrResourceExhausted)
	}
	return nil
}

// SetCredential attaches (or replaces) a credential on a live sandbox.
func (d *Daemon) SetCredential(ctx context.Context, idOrName string, c CredentialSpec, value string) (*store.Credential, error) {
	if err := checkCredential(c, value); err != nil {
		return nil, err
	}
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	unlock := d.lock(sb.ID)
	defer unlock()
	if sb, err = d.live(ctx, sb.ID); err != nil {
		return nil, err
	}
	if c.File != "" && sb.State != store.StateRunning {
		// The file goes to the sandbox's tmpfs through its agent (a
		// hibernated one would wake with the old tmpfs).
		return nil, fmt.Errorf("sandbox %s is %s: a file credential needs it running: %w", sb.ID, sb.State, errdefs.ErrFailedPrecondition)
	}
	existing, err := d.store.Credentials(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	if len(existing) >= maxCredentials {
		return nil, fmt.Errorf("sandbox %s has %d credentials, the limit: %w", sb.ID, len(existing), errdefs.ErrResourceExhausted)
	}
	cred := &store.Credential{SandboxID: sb.ID, Name: c.Name, Env: c.Env, File: c.File, PerFork: c.PerFork,
		Sealed: d.sealer.seal(c.Name, []byte(value))}
	if err := d.store.PutCredential(ctx, cred); err != nil {
		return nil, err
	}
	if c.File != "" && sb.State == store.StateRunning {
		if err := d.agent(sb).WriteFile(ctx, secretsDir+"/"+c.File, []byte(value), 0o400); err != nil {
			return nil, fmt.Errorf("write credential file: %w", err)
		}
	}
	return cred, nil
}

// ListCredentials lists a sandbox's credentials (never their values).
func (d *Daemon) ListCredentials(ctx context.Context, idOrName string) ([]*store.Credential, error) {
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	return d.store.Credentials(ctx, sb.ID)
}

// DeleteCredential removes a credential (and its file, if the sandbox runs).
func (d *Daemon) DeleteCredential(ctx context.Context, idOrName, name string) error {
	sb, unlock, err := d.locked(ctx, idOrName)
	if err != nil {
		return err
	}
	defer unlock()
	creds, err := d.store.Credentials(ctx, sb.ID)
	if err != nil {
		return err
	}
	for _, c := range creds {
		if c.Name != name || c.File == "" || sb.State == store.StateClosed {
			continue
		}
		// The file must go before the record: a credential the daemon
		// forgot must not stay readable in the sandbox.
		if sb.State != store.StateRunning {
			return fmt.Errorf("sandbox %s is %s: removing a file credential needs it running: %w", sb.ID, sb.State, errdefs.ErrFailedPrecondition)
		}
		res, err := d.agent(sb).Exec(ctx, agent.ExecRequest{Argv: []string{"rm", "-f", secretsDir + "/" + c.File}}, io.Discard, io.Discard)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("rm exited %d: %w", res.ExitCode, errdefs.ErrInternal)
		}
		if err != nil {
			return fmt.Errorf("remove credential file: %w", err)
		}
	}
	return d.store.DeleteCredential(ctx, sb.ID, name)
}

// credentialEnv returns the env variables the sandbox's credentials add to
// every exec.
func (d *Daemon) credentialEnv(ctx context.Context, sb *store.Sandbox) (map[string]string, error) {
	creds, err := d.store.Credentials(ctx, sb.ID)
	if err != nil || len(creds) == 0 {
		return nil, err
	}
	env := map[string]string{}
	for _, c := range creds {
		if c.Env == "" {
			continue
		}
		v, err := d.sealer.open(c.Name, c.Sealed)
		if err != nil {
			return nil, err
		}
		env[c.Env] = string(v)
	}
	return env, nil
}

// injectCredentialFiles writes the sandbox's file credentials to its
// /run/secrets tmpfs.
func (d *Daemon) injectCredentialFiles(ctx context.Context, sb *store.Sandbox) error {
	creds, err := d.store.Credentials(ctx, sb.ID)
	if err != nil {
		return err
	}
	for _, c := range creds {
		if c.File == "" {
			continue
		}
		v, err := d.sealer.open(c.Name, c.Sealed)
		if err != nil {
			return err
		}
		if err := d.agent(sb).WriteFile(ctx, secretsDir+"/"+c.File, v, 0o400); err != nil {
			return fmt.Errorf("credential %s: %w", c.Name, err)
		}
	}
	return nil
}

// inheritedCredentials returns what children of sb get: its credentials,
// with per-fork ones replaced by the values the caller gave. A per-fork
// credential without a value is a FailedPrecondition error; a value for a
// credential the source does not have is an InvalidArgument error.
func (d *Daemon) inheritedCredentials(ctx context.Context, sourceID string, given map[string]string) ([]*store.Credential, error) {
	creds, err := d.store.Credentials(ctx, sourceID)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	var out []*store.Credential
	for _, c := range creds {
		known[c.Name] = true
		cc := *c
		if v, ok := given[c.Name]; ok {
			if err := checkCredential(CredentialSpec{Name: c.Name, Env: c.Env, File: c.File}, v); err != nil {
				return nil, err
			}
			cc.Sealed = d.sealer.seal(c.Name, []byte(v))
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
