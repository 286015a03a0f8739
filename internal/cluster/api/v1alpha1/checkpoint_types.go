package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CheckpointSpec names the sandbox to capture.
// +kubebuilder:validation:XValidation:rule="self == oldSelf || (!has(oldSelf.nodeName) && self.sandbox == oldSelf.sandbox && (!has(oldSelf.parent) || (has(self.parent) && self.parent == oldSelf.parent)) && has(self.tag) == has(oldSelf.tag) && (!has(self.tag) || self.tag == oldSelf.tag) && has(self.memory) == has(oldSelf.memory) && (!has(self.memory) || self.memory == oldSelf.memory))",message="a checkpoint's spec is immutable (nodeName and parent are set once)"
type CheckpointSpec struct {
	// Sandbox names the Sandbox (same namespace) to capture.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Sandbox string `json:"sandbox"`
	// Tag is the checkpoint's name in the sandbox's ledger.
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`
	// +optional
	Tag string `json:"tag,omitempty"`
	// Memory asks for a memory checkpoint (gvisor) besides the filesystem.
	// +optional
	Memory bool `json:"memory,omitempty"`
	// Parent names the Checkpoint (same namespace) the sandbox started
	// from, if any, recorded by whoever creates the Checkpoint (the
	// gateway or the controller) from the Sandbox's spec.source, or by
	// the controller with nodeName for one created without either: the
	// ancestry that grants and placement trust, which no node agent may
	// write (deploy/policy/node-identity.yaml keeps a node's
	// status.parent equal to it).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Parent string `json:"parent,omitempty"`
	// NodeName is the node that captures it: the sandbox's, filled in by
	// the controller.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// CheckpointPhase is where a checkpoint is in its life.
// +kubebuilder:validation:Enum=Pending;Ready;Failed
type CheckpointPhase string

// Checkpoint phases.
const (
	CheckpointPending CheckpointPhase = "Pending"
	CheckpointReady   CheckpointPhase = "Ready"
	CheckpointFailed  CheckpointPhase = "Failed"
)

// Replica is one node's copy of a checkpoint.
type Replica struct {
	// Node is the ForkboxNode holding the copy.
	Node string `json:"node"`
	// LocalID is the checkpoint's ID in that node's ledger (ck-...).
	// +optional
	LocalID string `json:"localID,omitempty"`
	// +optional
	Ready bool `json:"ready,omitempty"`
}

// CheckpointStatus is written by the capturing node's agent.
type CheckpointStatus struct {
	// +optional
	Phase CheckpointPhase `json:"phase,omitempty"`
	// Kind is what was captured: "filesystem" or "filesystem+memory".
	// +optional
	Kind string `json:"kind,omitempty"`
	// OriginNode captured it.
	// +optional
	OriginNode string `json:"originNode,omitempty"`
	// Parent names the Checkpoint the sandbox itself started from, if
	// any: the ancestor an incremental transfer can start from.
	// +optional
	Parent string `json:"parent,omitempty"`
	// SizeBytes is the size of what was captured.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Size is SizeBytes as a quantity, for people.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// CaptureMicros is how long the capture froze the sandbox (freeze,
	// snapshot, thaw), and FlushMicros the writeback of its dirty data
	// before, in microseconds, as its node measured them.
	// +optional
	CaptureMicros int64 `json:"captureMicros,omitempty"`
	// +optional
	FlushMicros int64 `json:"flushMicros,omitempty"`
	// CapturedAt is when the capturing node took it, by that node's
	// clock: it orders a sandbox's checkpoints (all captured on the
	// sandbox's node), which the object's creation time, in whole
	// seconds, cannot.
	// +optional
	CapturedAt *metav1.MicroTime `json:"capturedAt,omitempty"`
	// Image the checkpoint's sandbox runs, and its runtime: children
	// inherit both.
	// +optional
	Image string `json:"image,omitempty"`
	// +optional
	Runtime Runtime `json:"runtime,omitempty"`
	// SubvolumeUUID identifies the captured snapshot (the btrfs UUID it
	// has on its origin node, the received UUID of every copy): a
	// transfer of another one is refused.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	SubvolumeUUID string `json:"subvolumeUUID,omitempty"`
	// Replicas are the nodes holding a copy.
	// +listType=map
	// +listMapKey=node
	// +optional
	Replicas []Replica `json:"replicas,omitempty"`
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Message string `json:"message,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Checkpoint is a named, immutable capture of a sandbox's state.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=fbck
// +kubebuilder:subresource:status
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandbox`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.status.kind`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.originNode`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Checkpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec CheckpointSpec `json:"spec"`
	// +optional
	Status CheckpointStatus `json:"status,omitzero"`
}

// CheckpointList is a list of Checkpoints.
// +kubebuilder:object:root=true
type CheckpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Checkpoint `json:"items"`
}

// ReadyOn reports whether node holds a ready copy.
func (c *Checkpoint) ReadyOn(node string) bool {
	for _, r := range c.Status.Replicas {
		if r.Node == node && r.Ready {
			return true
		}
	}
	return false
}

func init() { SchemeBuilder.Register(&Checkpoint{}, &CheckpointList{}) }
