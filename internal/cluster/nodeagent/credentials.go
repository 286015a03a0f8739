package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/credentials"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// A Sandbox's spec.credentials name Secrets; the node reads their values
// (uncached, never logged, never in status or Events: errors name the
// credential and the Secret, not the value) and hands them to the daemon,
// which seals them. A running sandbox follows its spec: a credential
// added, changed or removed there is applied at the next reconcile, before
// the node reports the generation observed (the gateway waits for that);
// a new value written into the same Secret is applied within a resync
// period (the gateway's SetCredential also sets it on the node at once).

// credential is a credential of a Sandbox with its value from its Secret.
type credential struct {
	spec    daemon.CredentialSpec
	value   string
	version string // credVersion
}

// credVersion names the value of c at a resourceVersion of its Secret.
func credVersion(c fbv1.Credential, resourceVersion string) string {
	return c.SecretRef.Name + "/" + c.SecretRef.Key + "/" + resourceVersion
}

// maxCredentialBytes bounds one credential's value read from a Secret
// (the daemon's cap).
const maxCredentialBytes = credentials.MaxBytes

// specOf is how the daemon injects c: Env, File, or with neither, the
// variable named like the credential.
func specOf(c fbv1.Credential) daemon.CredentialSpec {
	spec := daemon.CredentialSpec{Name: c.Name, Env: c.Env, File: c.File, PerFork: c.PerFork}
	if spec.Env == "" && spec.File == "" {
		spec.Env = c.Name
	}
	return spec
}

func (r *sandboxes) credential(ctx context.Context, ns string, c fbv1.Credential) (credential, error) {
	var s corev1.Secret
	if err := r.api.Get(ctx, types.NamespacedName{Namespace: ns, Name: c.SecretRef.Name}, &s); err != nil {
		return credential{}, fmt.Errorf("credential %s: secret %s: %v: %w", c.Name, c.SecretRef.Name, err, errdefs.ErrFailedPrecondition)
	}
	v, ok := s.Data[c.SecretRef.Key]
	if !ok {
		return credential{}, fmt.Errorf("credential %s: secret %s has no key %s: %w", c.Name, c.SecretRef.Name, c.SecretRef.Key, errdefs.ErrFailedPrecondition)
	}
	if len(v) > maxCredentialBytes {
		return credential{}, fmt.Errorf("credential %s: %d bytes, limit %d: %w", c.Name, len(v), maxCredentialBytes, errdefs.ErrInvalidArgument)
	}
	return credential{spec: specOf(c), value: string(v), version: credVersion(c, s.ResourceVersion)}, nil
}

func (r *sandboxes) credentials(ctx context.Context, sb *fbv1.Sandbox) ([]credential, error) {
	var out []credential
	for _, c := range sb.Spec.Credentials {
		cr, err := r.credential(ctx, sb.Namespace, c)
		if err != nil {
			return nil, err
		}
		out = append(out, cr)
	}
	return out, nil
}

// applied is what a sandbox's credentials were last set from: each one's
// Secret resourceVersion, and when the versions were last compared with
// the Secrets'.
type applied struct {
	versions map[string]string
	checked  time.Time
}

// noteApplied records the Secret versions a sandbox now holds.
func (r *sandboxes) noteApplied(sb *fbv1.Sandbox, creds []credential) {
	a := applied{versions: map[string]string{}, checked: time.Now()}
	for _, c := range creds {
		a.versions[c.spec.Name] = c.version
	}
	r.credsApplied.Store(sb.UID, a)
}

// syncCredentials makes a running sandbox's credentials those of its
// spec: missing or changed ones set, others removed. A Secret that
// cannot be read leaves the credential as it is (an error, retried).
func (r *sandboxes) syncCredentials(ctx context.Context, sb *fbv1.Sandbox, local *store.Sandbox) error {
	if local.State != store.StateRunning {
		return nil // file credentials need it running; applied once it runs
	}
	have, err := r.d.ListCredentials(ctx, local.ID)
	if err != nil {
		return err
	}
	byName := map[string]*store.Credential{}
	for _, c := range have {
		byName[c.Name] = c
	}
	a := applied{versions: map[string]string{}}
	if v, ok := r.credsApplied.Load(sb.UID); ok {
		a = v.(applied)
		a.versions = maps.Clone(a.versions)
	}
	// A Secret's value changed in place (not through the gateway, which
	// sets it on the node itself) is looked for once a resync period, not
	// at every reconcile: that would be a read per credential each time.
	recheck := time.Since(a.checked) >= r.o.Resync
	if recheck {
		a.checked = time.Now()
	}
	applied := a.versions
	var errs []error
	want := map[string]bool{}
	for _, c := range sb.Spec.Credentials {
		want[c.Name] = true
		spec := specOf(c)
		l := byName[c.Name]
		same := l != nil && l.Env == spec.Env && l.File == spec.File && l.PerFork == spec.PerFork
		same = same && strings.HasPrefix(applied[c.Name], credVersion(c, ""))
		if same && (!recheck || applied[c.Name] == credVersion(c, r.secretVersion(ctx, sb.Namespace, c.SecretRef.Name))) {
			continue
		}
		cr, err := r.credential(ctx, sb.Namespace, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if l != nil && l.File != "" && l.File != spec.File {
			// The old file must not stay readable under its old name.
			if err := r.d.DeleteCredential(ctx, local.ID, c.Name); err != nil {
				errs = append(errs, fmt.Errorf("credential %s: %w", c.Name, err))
				continue
			}
		}
		if _, err := r.d.SetCredential(ctx, local.ID, cr.spec, cr.value); err != nil {
			errs = append(errs, fmt.Errorf("credential %s: %w", c.Name, err))
			continue
		}
		applied[c.Name] = cr.version
	}
	for _, l := range have {
		if want[l.Name] {
			continue
		}
		if err := r.d.DeleteCredential(ctx, local.ID, l.Name); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("credential %s: %w", l.Name, err))
			continue
		}
		delete(applied, l.Name)
	}
	a.versions = applied
	r.credsApplied.Store(sb.UID, a)
	return errors.Join(errs...)
}

// secretVersion is the resourceVersion of a Secret ("" if unreadable),
// read from its metadata only.
func (r *sandboxes) secretVersion(ctx context.Context, ns, name string) string {
	var s corev1.Secret
	if err := r.api.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
		return ""
	}
	return s.ResourceVersion
}
