package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ForkSource is what a Fork forks: a running Sandbox (captured first) or
// an existing Checkpoint.
// +kubebuilder:validation:XValidation:rule="[has(self.sandbox), has(self.checkpoint)].filter(x, x).size() == 1",message="give exactly one of sandbox or checkpoint"
type ForkSource struct {
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Sandbox string `json:"sandbox,omitempty"`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Checkpoint string `json:"checkpoint,omitempty"`
}

// ForkOverrides replace what children inherit from the source.
type ForkOverrides struct {
	// +optional
	Resources Resources `json:"resources,omitzero"`
	// Env is merged over the inherited environment.
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`
	// Credentials replace inherited ones of the same name (per-fork
	// credentials must be given here).
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	// +optional
	Credentials []Credential `json:"credentials,omitempty"`
	// +optional
	Egress *Egress `json:"egress,omitempty"`
}

// ForkSpec asks for Count children of a source.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a fork's spec is immutable"
type ForkSpec struct {
	Source ForkSource `json:"source"`
	// Count is the number of children.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Count int32 `json:"count"`
	// Memory asks for a memory checkpoint of a sandbox source (gvisor).
	// +optional
	Memory bool `json:"memory,omitempty"`
	// +optional
	Overrides ForkOverrides `json:"overrides,omitzero"`
}

// ForkChild is one child's outcome.
type ForkChild struct {
	// Name of the child Sandbox.
	Name string `json:"name"`
	// +optional
	Node string `json:"node,omitempty"`
	// +optional
	Phase SandboxPhase `json:"phase,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// ForkPhase is where a fork is.
// +kubebuilder:validation:Enum=Pending;Checkpointing;Forking;Complete;Failed
type ForkPhase string

// Fork phases.
const (
	ForkPending       ForkPhase = "Pending"
	ForkCheckpointing ForkPhase = "Checkpointing"
	ForkForking       ForkPhase = "Forking" // children created, not all settled
	ForkComplete      ForkPhase = "Complete"
	ForkFailed        ForkPhase = "Failed" // no child could be made (the source could not be captured)
)

// ForkStatus is written by the controller.
type ForkStatus struct {
	// +optional
	Phase ForkPhase `json:"phase,omitempty"`
	// Checkpoint names the Checkpoint the children start from.
	// +optional
	Checkpoint string `json:"checkpoint,omitempty"`
	// +listType=map
	// +listMapKey=name
	// +optional
	Children []ForkChild `json:"children,omitempty"`
	// Ready counts the children that are Running.
	// +optional
	Ready int32 `json:"ready,omitempty"`
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Message string `json:"message,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Fork is a checkpoint of a source plus Count new sandboxes started from
// it. The source keeps running; children are independent. Children are
// placed on the checkpoint's node first and spill to others when it is
// full. Deleting a Fork deletes its children (owner references).
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=fbfork
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Count",type=integer,JSONPath=`.spec.count`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Checkpoint",type=string,JSONPath=`.status.checkpoint`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Fork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ForkSpec `json:"spec"`
	// +optional
	Status ForkStatus `json:"status,omitzero"`
}

// ForkList is a list of Forks.
// +kubebuilder:object:root=true
type ForkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Fork `json:"items"`
}

func init() { SchemeBuilder.Register(&Fork{}, &ForkList{}) }
