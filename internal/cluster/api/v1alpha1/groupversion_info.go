// Package v1alpha1 holds the forkbox.dev/v1alpha1 API: the Kubernetes
// objects of cluster mode (ForkboxNode, Sandbox, Checkpoint, Fork,
// Environment). The Go types are the API: controller-gen turns their
// markers into the CRDs in deploy/crd/ and the deepcopy code beside them
// (`make manifests generate`).
//
// Objects are the cluster's truth; each node's SQLite ledger stays the
// truth about its own host. Spec is written by users and, for
// spec.nodeName, once by the placer; status only through the status
// subresource, by the object's owner (the node agent for the node's
// Sandboxes and Checkpoints, the controller for Forks and node readiness).
//
// +kubebuilder:object:generate=true
// +groupName=forkbox.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is forkbox.dev/v1alpha1.
	GroupVersion = schema.GroupVersion{Group: "forkbox.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this group version.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Finalizers and labels the cluster components set.
const (
	// SandboxFinalizer is held by the node agent while a local sandbox
	// exists for the object; it is removed once the local one is closed.
	SandboxFinalizer = "forkbox.dev/local-sandbox"
	// CheckpointFinalizer is held while any node keeps a copy of the
	// checkpoint; each holder deletes its copy before it is removed.
	CheckpointFinalizer = "forkbox.dev/replicas"
	// ForkLabel names, on a Fork's Checkpoint and children, their Fork.
	ForkLabel = "forkbox.dev/fork"
	// EnvironmentLabel names, on an Environment's builder Sandbox and its
	// Checkpoints, their Environment.
	EnvironmentLabel = "forkbox.dev/environment"
	// PoolLabel names, on a Sandbox of an Environment's warm pool, that
	// Environment (which controls it). A handover takes the Sandbox out
	// of the pool by removing the label and the controller reference in
	// one write, under an optimistic lock: two callers never get the
	// same one. The Sandbox then belongs to its caller alone.
	PoolLabel = "forkbox.dev/pool"
	// HandedOverAnnotation is, on a Sandbox taken from a warm pool, when
	// it was handed over (RFC 3339).
	HandedOverAnnotation = "forkbox.dev/handed-over"
	// BuildHashAnnotation is, on a builder Sandbox, the hash of the
	// Environment spec it builds (EnvironmentSpec.Hash).
	BuildHashAnnotation = "forkbox.dev/build-hash"
	// RetryAnnotation is, on an Environment, a count: raising it asks for
	// a failed build of the current spec to be tried again (a build that
	// failed is otherwise not tried again until the spec changes or
	// maxAge passes). It is part of the build's name (see BuildName).
	RetryAnnotation = "forkbox.dev/retry"
	// LeaseAnnotation is, on the builder Sandbox of a client-run setup
	// (EnvironmentSpec.SetupHash), the lease of the client it was handed
	// to: one client at a time runs a build's setup.
	LeaseAnnotation = "forkbox.dev/lease"
	// SetupResultAnnotation is, on the builder Sandbox of a client-run
	// setup, how it went, as its client says: "ok", or "failed: <why>".
	SetupResultAnnotation = "forkbox.dev/setup-result"
	// NodeNameField is the field the node agents select their objects by.
	NodeNameField = "spec.nodeName"
)

// Condition types.
const (
	// ConditionReady: a ForkboxNode whose Lease is current, a Sandbox that
	// is running, a Checkpoint that can be forked from.
	ConditionReady = "Ready"
	// ConditionScheduled: a Sandbox bound to a node (spec.nodeName set).
	ConditionScheduled = "Scheduled"
	// ConditionTransferring: a checkpoint being shipped to the node.
	ConditionTransferring = "Transferring"
	// ConditionSetupComplete: a builder Sandbox whose node agent ran its
	// Environment's setup (False: a step failed, or was interrupted).
	ConditionSetupComplete = "SetupComplete"
	// ConditionBuilt: an Environment whose last build succeeded (False:
	// it failed; an older checkpoint may still serve, see Ready).
	ConditionBuilt = "Built"
)
