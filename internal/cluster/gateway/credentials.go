package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/credentials"
)

// Credentials in cluster mode. A value the caller gives goes to a Secret
// of the gateway's namespace (type forkbox.dev/credential, key "value"),
// named after its owner and the credential (credentialSecret) and owned
// by that object, so that the API server's garbage collector deletes it
// with the object; the Sandbox's spec.credentials names it, with how it
// is injected. The node reads it from there: at create, restore and fork,
// and when a running sandbox's spec changes (it applies the change before
// it reports the spec's generation observed). The gateway then sets the
// value on the node directly as well, so that a new value in an
// unchanged Secret reference takes effect at once and the caller gets the
// daemon's own answer. Values are never logged, never in an object's
// spec or status nor in Events: errors name credentials, not values.
//
// Forks and restores: children get their source's credentials (the
// controller merges the source's spec.credentials into each child's),
// but per-fork ones, whose values the call must give; those (and any
// other value given) go to Secrets owned by the Fork (whose children
// they are) or the restored Sandbox. Inherited Secrets the gateway made
// get the Fork or restored Sandbox as an extra owner, so that they stay
// while any sandbox naming them does.

// credentialType is the type of the Secrets the gateway makes.
const credentialType corev1.SecretType = "forkbox.dev/credential"

// credentialLabel marks the Secrets the gateway made (and may give owners
// or delete); its value is the credential's name hashed (names need not
// be label values).
const credentialLabel = "forkbox.dev/credential"

// credentialSecret is the name of the Secret holding credential cred of
// the object named owner: DNS-valid and at most 253 bytes for any owner
// name (a Kubernetes name) and any credential name, and another for each
// pair.
func credentialSecret(owner, cred string) string {
	sum := sha256.Sum256([]byte(owner + "\x00" + cred))
	prefix := owner
	if len(prefix) > 200 {
		prefix = strings.TrimRight(prefix[:200], "-.")
	}
	return prefix + "-cred-" + hex.EncodeToString(sum[:8])
}

func credentialHash(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:8])
}

// credentialSpec is the daemon's view of a CRD credential.
func credentialSpec(c fbv1.Credential) credentials.Spec {
	s := credentials.Spec{Name: c.Name, Env: c.Env, File: c.File, PerFork: c.PerFork}
	if s.Env == "" && s.File == "" {
		s.Env = c.Name
	}
	return s
}

// putSecret creates or updates the Secret name with value, owned by owner
// (nil: none yet).
func (g *Gateway) putSecret(ctx context.Context, name, cred, value string, owner *metav1.OwnerReference) error {
	data := map[string][]byte{"value": []byte(value)}
	var s corev1.Secret
	err := g.api.Get(ctx, types.NamespacedName{Namespace: g.o.Namespace, Name: name}, &s)
	if apierrors.IsNotFound(err) {
		s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: g.o.Namespace, Name: name,
			Labels: map[string]string{credentialLabel: credentialHash(cred)}}, Type: credentialType, Data: data}
		if owner != nil {
			s.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return kerr(g.c.Create(ctx, &s), "create the secret of credential "+cred)
	}
	if err != nil {
		return kerr(err, "read the secret of credential "+cred)
	}
	if s.Type != credentialType || s.Labels[credentialLabel] == "" {
		return fmt.Errorf("secret %s exists and is not a forkbox credential: %w", name, errdefs.ErrAlreadyExists)
	}
	s.Data = data
	if owner != nil && !slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == owner.UID }) {
		// An earlier object of the same name (deleted, its Secret not
		// collected yet) owns it no more.
		s.OwnerReferences = slices.DeleteFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool {
			return o.Kind == owner.Kind && o.Name == owner.Name
		})
		s.OwnerReferences = append(s.OwnerReferences, *owner)
	}
	return kerr(g.c.Update(ctx, &s), "update the secret of credential "+cred)
}

// addOwner makes obj an owner of the gateway's Secrets among creds, so
// that they outlive the object that made them while obj names them.
func (g *Gateway) addOwner(ctx context.Context, creds []fbv1.Credential, obj client.Object, kind string) {
	owner := ownerRef(obj, kind)
	g.editOwners(ctx, creds, "add an owner to", func(refs []metav1.OwnerReference) ([]metav1.OwnerReference, bool) {
		if slices.ContainsFunc(refs, func(o metav1.OwnerReference) bool { return o.UID == owner.UID }) {
			return refs, false // owned already
		}
		return append(refs, owner), true
	})
}

// disown drops owner uid from the gateway's Secrets among creds, before
// that owner's object goes while another takes them over (addOwner after
// it is made). A Secret left with no owner by a call that dies in between
// stays, as one the gateway made and never finished.
func (g *Gateway) disown(ctx context.Context, creds []fbv1.Credential, uid types.UID) {
	g.editOwners(ctx, creds, "hand over", func(refs []metav1.OwnerReference) ([]metav1.OwnerReference, bool) {
		if !slices.ContainsFunc(refs, func(o metav1.OwnerReference) bool { return o.UID == uid }) {
			return refs, false
		}
		return slices.DeleteFunc(refs, func(o metav1.OwnerReference) bool { return o.UID == uid }), true
	})
}

// editOwners applies edit to the owner references of the gateway's own
// Secrets among creds (never a user's Secret), writing those it changed.
func (g *Gateway) editOwners(ctx context.Context, creds []fbv1.Credential, what string, edit func([]metav1.OwnerReference) ([]metav1.OwnerReference, bool)) {
	for _, c := range creds {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var s corev1.Secret
			if err := g.api.Get(ctx, types.NamespacedName{Namespace: g.o.Namespace, Name: c.SecretRef.Name}, &s); err != nil {
				return client.IgnoreNotFound(err)
			}
			if s.Type != credentialType || s.Labels[credentialLabel] == "" {
				return nil // not ours (a user's Secret)
			}
			refs, changed := edit(s.OwnerReferences)
			if !changed {
				return nil
			}
			s.OwnerReferences = refs
			return g.c.Update(ctx, &s)
		})
		if err != nil {
			g.log.Warn("could not "+what+" a credential's secret", "secret", c.SecretRef.Name, "err", err)
		}
	}
}

func ownerRef(obj client.Object, kind string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: fbv1.GroupVersion.String(), Kind: kind, Name: obj.GetName(), UID: obj.GetUID()}
}

func (s *sandboxes) SetCredential(ctx context.Context, req *connect.Request[v1.SetCredentialRequest]) (*connect.Response[v1.SetCredentialResponse], error) {
	g, m := s.g, req.Msg
	c := m.Credential
	if c == nil {
		return nil, fmt.Errorf("a credential is required: %w", errdefs.ErrInvalidArgument)
	}
	spec := credentials.Spec{Name: c.Name, Env: c.Env, File: c.File, PerFork: c.PerFork}
	if err := credentials.Check(spec, m.Value); err != nil {
		return nil, err
	}
	sb, err := g.sandbox(ctx, m.Sandbox)
	if err != nil {
		return nil, err
	}
	r, err := g.routeTo(ctx, sb)
	if err != nil {
		return nil, err
	}
	if c.File != "" && sb.Status.Phase != fbv1.PhaseRunning {
		return nil, fmt.Errorf("sandbox %s is %s: a file credential needs it running: %w", sb.Name, sb.Status.Phase, errdefs.ErrFailedPrecondition)
	}
	name := credentialSecret(sb.Name, c.Name)
	entry := fbv1.Credential{Name: c.Name, Env: c.Env, File: c.File, PerFork: c.PerFork,
		SecretRef: fbv1.SecretKeyRef{Name: name, Key: "value"}}
	if err := g.putSecret(ctx, name, c.Name, m.Value, &metav1.OwnerReference{APIVersion: fbv1.GroupVersion.String(),
		Kind: "Sandbox", Name: sb.Name, UID: sb.UID}); err != nil {
		return nil, err
	}
	gen, err := g.editCredentials(ctx, sb, func(cs []fbv1.Credential) ([]fbv1.Credential, error) {
		i := slices.IndexFunc(cs, func(x fbv1.Credential) bool { return x.Name == c.Name })
		if i >= 0 {
			cs[i] = entry
			return cs, nil
		}
		if len(cs) >= credentials.MaxPerSandbox {
			return nil, fmt.Errorf("sandbox %s has %d credentials, the limit: %w", sb.Name, len(cs), errdefs.ErrResourceExhausted)
		}
		return append(cs, entry), nil
	})
	if err != nil {
		return nil, err
	}
	if err := g.awaitObserved(ctx, sb, gen); err != nil {
		return nil, err
	}
	resp, err := r.c.SetCredential(ctx, connect.NewRequest(&v1.SetCredentialRequest{Sandbox: r.id, Credential: c, Value: m.Value}))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp.Msg), nil
}

func (s *sandboxes) DeleteCredential(ctx context.Context, req *connect.Request[v1.DeleteCredentialRequest]) (*connect.Response[v1.DeleteCredentialResponse], error) {
	g, m := s.g, req.Msg
	sb, err := g.sandbox(ctx, m.Sandbox)
	if err != nil {
		return nil, err
	}
	r, err := g.routeTo(ctx, sb)
	if err != nil {
		return nil, err
	}
	i, err := g.specCredential(ctx, sb, m.Name)
	if err != nil {
		return nil, err
	}
	if i >= 0 {
		old := sb.Spec.Credentials[i]
		if old.File != "" && sb.Status.Phase != fbv1.PhaseRunning {
			return nil, fmt.Errorf("sandbox %s is %s: removing a file credential needs it running: %w", sb.Name, sb.Status.Phase, errdefs.ErrFailedPrecondition)
		}
		gen, err := g.editCredentials(ctx, sb, func(cs []fbv1.Credential) ([]fbv1.Credential, error) {
			return slices.DeleteFunc(cs, func(x fbv1.Credential) bool { return x.Name == m.Name }), nil
		})
		if err != nil {
			return nil, err
		}
		if err := g.awaitObserved(ctx, sb, gen); err != nil {
			return nil, err
		}
		if own := credentialSecret(sb.Name, m.Name); old.SecretRef.Name == own {
			// Only this sandbox's own Secret: an inherited one is its source's.
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: g.o.Namespace, Name: own}}
			if err := g.c.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
				return nil, kerr(err, "delete the secret of credential "+m.Name)
			}
		}
	}
	_, err = r.c.DeleteCredential(ctx, connect.NewRequest(&v1.DeleteCredentialRequest{Sandbox: r.id, Name: m.Name}))
	if err != nil && !(i >= 0 && connect.CodeOf(err) == connect.CodeNotFound) {
		return nil, err
	}
	return connect.NewResponse(&v1.DeleteCredentialResponse{}), nil
}

// specCredential returns the index of credential name in sb's spec (-1:
// none), with sb read again from the API server: a credential set just
// before may not be in the cache yet, and one left in the spec when the
// node forgets it would come back.
func (g *Gateway) specCredential(ctx context.Context, sb *fbv1.Sandbox, name string) (int, error) {
	if err := g.reread(ctx, sb); err != nil {
		return -1, err
	}
	return slices.IndexFunc(sb.Spec.Credentials, func(x fbv1.Credential) bool { return x.Name == name }), nil
}

// editCredentials changes sb's spec.credentials with edit, against the
// API server's copy (retried on a conflict: two calls must not undo each
// other), and returns the generation that holds the change.
func (g *Gateway) editCredentials(ctx context.Context, sb *fbv1.Sandbox, edit func([]fbv1.Credential) ([]fbv1.Credential, error)) (int64, error) {
	err := g.editSpec(ctx, sb, func(sb *fbv1.Sandbox) error {
		cs, err := edit(slices.Clone(sb.Spec.Credentials))
		if err != nil {
			return err
		}
		sb.Spec.Credentials = cs
		return nil
	})
	if err != nil {
		if errdefs.Class(err) != errdefs.ErrUnknown {
			return 0, err
		}
		return 0, kerr(err, "update the credentials of sandbox "+sb.Name)
	}
	return sb.Generation, nil
}

// awaitObserved waits until sb's node has reconciled generation gen.
func (g *Gateway) awaitObserved(ctx context.Context, sb *fbv1.Sandbox, gen int64) error {
	return g.await(ctx, "the node of sandbox "+sb.Name+" to apply its credentials", func() (bool, string, error) {
		gone, err := g.getFresh(ctx, sb)
		if err != nil {
			return false, "", err
		}
		if gone {
			return false, "", fmt.Errorf("sandbox %s was deleted: %w", sb.Name, errdefs.ErrNotFound)
		}
		return sb.Status.ObservedGeneration >= gen, fmt.Sprintf("observed generation %d of %d", sb.Status.ObservedGeneration, gen), nil
	})
}

// inherit is what a child of the source sandbox src (nil: gone) gets
// with the values in given, as the daemon's credentials.Inherit rules
// it (a per-fork one not given: FailedPrecondition; a value for a
// credential the source lacks: InvalidArgument): the source's entries
// it keeps, and those given (their Secrets not named yet: putGiven).
// Nothing is written.
func inherit(src *fbv1.Sandbox, given map[string]string) (kept, withValue []fbv1.Credential, err error) {
	var have []fbv1.Credential
	if src != nil {
		have = src.Spec.Credentials
	}
	known := map[string]bool{}
	for _, c := range have {
		known[c.Name] = true
		v, ok := given[c.Name]
		switch {
		case ok:
			if err := credentials.Check(credentialSpec(c), v); err != nil {
				return nil, nil, err
			}
			withValue = append(withValue, c)
		case c.PerFork:
			return nil, nil, fmt.Errorf("credential %s is per-fork: the fork must supply its value: %w", c.Name, errdefs.ErrFailedPrecondition)
		default:
			kept = append(kept, c)
		}
	}
	for name := range given {
		if !known[name] {
			return nil, nil, fmt.Errorf("credential %s: the source has no such credential: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return kept, withValue, nil
}

// putGiven writes the given values of creds to new Secrets named after
// owner (which does not exist yet, so does not own them yet) and returns
// the entries naming them. Each name is this call's own (a random
// suffix): owner's name may be another object's still, or another call's,
// and a Secret of theirs is never overwritten, nor deleted by dropGiven.
func (g *Gateway) putGiven(ctx context.Context, owner string, creds []fbv1.Credential, given map[string]string) ([]fbv1.Credential, error) {
	var out []fbv1.Credential
	for _, c := range creds {
		var nonce [4]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			return nil, fmt.Errorf("credential %s: %v: %w", c.Name, err, errdefs.ErrInternal)
		}
		c.SecretRef = fbv1.SecretKeyRef{Name: credentialSecret(owner, c.Name) + "-" + hex.EncodeToString(nonce[:]), Key: "value"}
		if err := g.createSecret(ctx, c.SecretRef.Name, c.Name, given[c.Name]); err != nil {
			g.dropGiven(ctx, out)
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// createSecret creates the Secret name with value, owned by no one yet;
// one that exists is an error, never overwritten.
func (g *Gateway) createSecret(ctx context.Context, name, cred, value string) error {
	s := corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: g.o.Namespace, Name: name,
		Labels: map[string]string{credentialLabel: credentialHash(cred)}}, Type: credentialType, Data: map[string][]byte{"value": []byte(value)}}
	return kerr(g.c.Create(ctx, &s), "create the secret of credential "+cred)
}

// dropGiven deletes the Secrets putGiven wrote for a call that failed.
func (g *Gateway) dropGiven(ctx context.Context, creds []fbv1.Credential) {
	for _, c := range creds {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: g.o.Namespace, Name: c.SecretRef.Name}}
		if err := g.c.Delete(context.WithoutCancel(ctx), s); err != nil && !apierrors.IsNotFound(err) {
			g.log.Warn("could not delete the secret of a failed call", "secret", c.SecretRef.Name, "err", err)
		}
	}
}

// sourceSandbox is the Sandbox object a checkpoint was taken of, or nil
// once it is gone (a sandbox of its name made after the checkpoint is
// another one).
func (g *Gateway) sourceSandbox(ctx context.Context, ck *fbv1.Checkpoint) (*fbv1.Sandbox, error) {
	if ck.Spec.Sandbox == "" {
		return nil, nil
	}
	var sb fbv1.Sandbox
	// From the API server: the credentials a child gets must not be a
	// cache's, a write behind a change.
	err := g.api.Get(ctx, types.NamespacedName{Namespace: g.o.Namespace, Name: ck.Spec.Sandbox}, &sb)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, kerr(err, "sandbox "+ck.Spec.Sandbox)
	}
	if sb.CreationTimestamp.After(ck.CreationTimestamp.Time) {
		// A later sandbox of that name (names are free again once closed):
		// not the one the checkpoint captured, whose credentials are gone.
		return nil, nil
	}
	return &sb, nil
}
