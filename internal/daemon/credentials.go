package daemon

import (
	"context"
	"fmt"
	"path"
	"slices"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/credentials"
	"github.com/forkbox/forkbox/internal/store"
)

// Credentials' rules (validation, sealing, inheritance) are in package
// credentials; this file stores them and delivers them to sandboxes: as env
// variables of each exec (added by the daemon, not recorded) or as files on
// a tmpfs at /run/secrets, which is outside the writable layer and so never
// in a snapshot: a per-fork credential cannot leak into a fork through its
// files.

const secretsDir = credentials.SecretsDir

// sealer seals credentials and the replay data of the ledger.
type sealer = credentials.Sealer

// openSealer loads (or creates) the daemon's sealing key.
func openSealer(stateDir string) (*sealer, error) { return credentials.OpenSealer(stateDir) }

// CredentialSpec is how a credential is injected.
type CredentialSpec = credentials.Spec

// SetCredential attaches (or replaces) a credential on a live sandbox.
func (d *Daemon) SetCredential(ctx context.Context, idOrName string, c CredentialSpec, value string) (*store.Credential, error) {
	if err := credentials.Check(c, value); err != nil {
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
	i := slices.IndexFunc(existing, func(e *store.Credential) bool { return e.Name == c.Name })
	if i < 0 && len(existing) >= credentials.MaxPerSandbox {
		return nil, fmt.Errorf("sandbox %s has %d credentials, the limit: %w", sb.ID, len(existing), errdefs.ErrResourceExhausted)
	}
	if i >= 0 && existing[i].File != "" && existing[i].File != c.File {
		// The replaced credential's file goes before its record, as a
		// deleted one's does.
		if err := d.removeSecretFile(ctx, sb, existing[i].File); err != nil {
			return nil, err
		}
	}
	cred := &store.Credential{SandboxID: sb.ID, Name: c.Name, Env: c.Env, File: c.File, PerFork: c.PerFork,
		Sealed: d.sealer.Seal(c.Name, []byte(value))}
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
		if err := d.removeSecretFile(ctx, sb, c.File); err != nil {
			return err
		}
	}
	return d.store.DeleteCredential(ctx, sb.ID, name)
}

// removeSecretFile removes /run/secrets/<file> from running sandbox sb
// (through its agent: the image needs no rm). The caller holds sb's lock.
func (d *Daemon) removeSecretFile(ctx context.Context, sb *store.Sandbox, file string) error {
	if sb.State != store.StateRunning {
		return fmt.Errorf("sandbox %s is %s: removing a file credential needs it running: %w", sb.ID, sb.State, errdefs.ErrFailedPrecondition)
	}
	// Bounded: the sandbox's lock is held.
	ctx, cancel := context.WithTimeout(ctx, credentialWriteTimeout)
	defer cancel()
	if err := d.agent(sb).Remove(ctx, secretsDir+"/"+file); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove credential file: %w", err)
	}
	return nil
}

// credentialEnv returns the env variables the sandbox's credentials add to
// every exec.
func (d *Daemon) credentialEnv(ctx context.Context, sb *store.Sandbox) (map[string]string, error) {
	creds, err := d.store.Credentials(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	return credentials.Env(d.sealer, creds)
}

// injectCredentialFiles writes the sandbox's file credentials to its
// /run/secrets tmpfs. Restored from a memory image, the tmpfs holds the
// source's files as they were at its capture, credentials since changed,
// removed or not inherited among them: those go first, so that it holds
// sb's file credentials and nothing else.
func (d *Daemon) injectCredentialFiles(ctx context.Context, sb *store.Sandbox, restored bool) error {
	// Bounded: a pool's refill calls this with a context that never ends,
	// and an agent that takes a write and never answers must not hold it.
	ctx, cancel := context.WithTimeout(ctx, credentialWriteTimeout)
	defer cancel()
	creds, err := d.store.Credentials(ctx, sb.ID)
	if err != nil {
		return err
	}
	if restored {
		if err := d.clearSecrets(ctx, sb); err != nil {
			return fmt.Errorf("clear the restored %s: %w", secretsDir, err)
		}
	}
	for _, c := range creds {
		if c.File == "" {
			continue
		}
		v, err := d.sealer.Open(c.Name, c.Sealed)
		if err != nil {
			return fmt.Errorf("credential %w", err)
		}
		if err := d.agent(sb).WriteFile(ctx, secretsDir+"/"+c.File, v, 0o400); err != nil {
			return fmt.Errorf("credential %s: %w", c.Name, err)
		}
	}
	return nil
}

// clearSecrets removes everything in sb's /run/secrets.
func (d *Daemon) clearSecrets(ctx context.Context, sb *store.Sandbox) error {
	c := d.agent(sb)
	ents, err := c.Walk(ctx, secretsDir, 1)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if path.Clean(e.Path) == secretsDir {
			continue
		}
		if err := c.Remove(ctx, e.Path); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// credentialWriteTimeout bounds writing a sandbox's credential files at
// its start (a few small files).
var credentialWriteTimeout = readyTimeout

// inheritedCredentials returns what children of the source get (see
// credentials.Inherit).
func (d *Daemon) inheritedCredentials(ctx context.Context, sourceID string, given map[string]string) ([]*store.Credential, error) {
	creds, err := d.store.Credentials(ctx, sourceID)
	if err != nil {
		return nil, err
	}
	return credentials.Inherit(d.sealer, creds, given)
}
