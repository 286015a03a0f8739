package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DesiredState is the state a Sandbox's owner asks for.
// +kubebuilder:validation:Enum=Running;Paused;Hibernated;Closed
type DesiredState string

// Desired states. Closed is final: its node closes the local sandbox
// (whose ledger keeps the record) and the object stays, phase Closed, as
// a closed sandbox stays listed on one host, until the controller's
// retention deletes it.
const (
	StateRunning    DesiredState = "Running"
	StatePaused     DesiredState = "Paused"
	StateHibernated DesiredState = "Hibernated"
	StateClosed     DesiredState = "Closed"
)

// SandboxSource is what a sandbox starts from instead of a bare image.
// +kubebuilder:validation:XValidation:rule="[has(self.checkpoint), has(self.environment)].filter(x, x).size() == 1",message="give exactly one of checkpoint or environment"
// +kubebuilder:validation:XValidation:rule="!has(self.resume) || !self.resume || has(self.checkpoint)",message="resume needs a checkpoint"
type SandboxSource struct {
	// Checkpoint names a Checkpoint in the same namespace.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Checkpoint string `json:"checkpoint,omitempty"`
	// Environment names an Environment in the same namespace; the
	// sandbox starts from its warm checkpoint.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Environment string `json:"environment,omitempty"`
	// Resume the session (the sandbox) that Checkpoint captured, as one
	// daemon resumes one: start from the session's last checkpoint (the
	// status says which), then replay what its ledger recorded after it
	// (execs and file writes, in order; background and non-replayable ones
	// are skipped). That ledger lives on the node that captured
	// Checkpoint, so the sandbox runs there or nowhere.
	// +optional
	Resume bool `json:"resume,omitempty"`
}

// Resumed is what a resume replayed, as its node reports it once.
type Resumed struct {
	// Checkpoint is the local ID (ck-...) it started from.
	// +kubebuilder:validation:MaxLength=64
	Checkpoint string `json:"checkpoint"`
	// Replayed are the execs replayed, in order (at most MaxReplayed).
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	// +optional
	Replayed []ReplayedExec `json:"replayed,omitempty"`
	// Omitted counts the replayed execs beyond MaxReplayed.
	// +optional
	Omitted int32 `json:"omitted,omitempty"`
}

// MaxReplayed bounds Resumed.Replayed.
const MaxReplayed = 256

// ReplayedExec is the outcome of one replayed exec.
type ReplayedExec struct {
	// +kubebuilder:validation:MaxLength=64
	ExecID string `json:"execID"`
	// Argv or Shell is the command (truncated to 1 KiB).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=1024
	// +listType=atomic
	// +optional
	Argv []string `json:"argv,omitempty"`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Shell string `json:"shell,omitempty"`
	// +optional
	Skipped bool `json:"skipped,omitempty"`
	// +kubebuilder:validation:MaxLength=256
	// +optional
	SkipReason string `json:"skipReason,omitempty"`
	// +optional
	ExitCode int32 `json:"exitCode,omitempty"`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Error string `json:"error,omitempty"`
}

// SandboxSpec is the sandbox a user asks for.
// +kubebuilder:validation:XValidation:rule="has(self.image) || has(self.source)",message="image or source is required"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.nodeName) || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",message="nodeName is set once"
// +kubebuilder:validation:XValidation:rule="has(self.source) == has(oldSelf.source) && (!has(self.source) || self.source == oldSelf.source)",message="source is immutable"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.state) || oldSelf.state != 'Closed' || (has(self.state) && self.state == 'Closed')",message="a closed sandbox stays closed"
type SandboxSpec struct {
	// Image is an image reference cached on (or pullable by) the nodes.
	// A sandbox with a source inherits its source's image.
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="image is immutable"
	// +optional
	Image string `json:"image,omitempty"`
	// Runtime: gvisor (untrusted code) or crun (trusted code). Empty: the
	// source's, else the node's default.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="runtime is immutable"
	// +optional
	Runtime Runtime `json:"runtime,omitempty"`
	// +optional
	Resources Resources `json:"resources,omitzero"`
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// WorkingDir is the directory execs start in.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	// +optional
	Credentials []Credential `json:"credentials,omitempty"`
	// +optional
	Egress *Egress `json:"egress,omitempty"`
	// +optional
	Source *SandboxSource `json:"source,omitempty"`
	// State is the state asked for (default Running).
	// +kubebuilder:default=Running
	// +optional
	State DesiredState `json:"state,omitempty"`
	// NodeName is the ForkboxNode the sandbox runs on, set once by the
	// placer (or by whoever creates the Sandbox, to pin it).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// SandboxPhase is where a sandbox is in its life.
// +kubebuilder:validation:Enum=Pending;Creating;Running;Paused;Hibernated;Failed;Lost;Terminating;Closed
type SandboxPhase string

// Sandbox phases.
const (
	PhasePending     SandboxPhase = "Pending"  // not yet on a node
	PhaseCreating    SandboxPhase = "Creating" // the node is starting it
	PhaseRunning     SandboxPhase = "Running"
	PhasePaused      SandboxPhase = "Paused"
	PhaseHibernated  SandboxPhase = "Hibernated"
	PhaseFailed      SandboxPhase = "Failed"
	PhaseLost        SandboxPhase = "Lost" // its node stopped renewing its Lease
	PhaseTerminating SandboxPhase = "Terminating"
	PhaseClosed      SandboxPhase = "Closed" // closed on its node, which holds its ledger
)

// SandboxStatus is written by the node agent (and the controller, for
// Scheduled and Lost).
type SandboxStatus struct {
	// +optional
	Phase SandboxPhase `json:"phase,omitempty"`
	// IP is the sandbox's address on its node.
	// +optional
	IP string `json:"ip,omitempty"`
	// Endpoint is the API endpoint of the node that runs it.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// LocalID is the sandbox's ID in its node's ledger (sb-...).
	// +optional
	LocalID string `json:"localID,omitempty"`
	// Message says why the sandbox is in its phase, when not Running.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Message string `json:"message,omitempty"`
	// ClosedAt is when its node closed it (phase Closed): the retention
	// counts from it.
	// +optional
	ClosedAt *metav1.Time `json:"closedAt,omitempty"`
	// ObservedGeneration is the spec generation the node acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Resumed is what a resume (spec.source.resume) replayed.
	// +optional
	Resumed *Resumed `json:"resumed,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Sandbox is an isolated Linux environment on one forkbox node.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=fbsb
// +kubebuilder:subresource:status
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.status.ip`
// +kubebuilder:printcolumn:name="Local ID",type=string,JSONPath=`.status.localID`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SandboxSpec `json:"spec"`
	// +optional
	Status SandboxStatus `json:"status,omitzero"`
}

// SandboxList is a list of Sandboxes.
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

func init() { SchemeBuilder.Register(&Sandbox{}, &SandboxList{}) }

// Closed reports whether sb is closed on its node: phase Closed. Such a
// sandbox holds no slot, runs nothing and takes no call but reads of its
// record and ledger.
func (sb *Sandbox) Closed() bool { return sb.Status.Phase == PhaseClosed }

// HoldsSlot says whether sb, once bound, counts against its node's slots
// as the node's daemon counts its sandboxes (every record not closed):
// all but a closed one and one that failed with no record on its node (a
// create that failed, a record gone from the node's ledger). One whose
// local sandbox failed or is degraded keeps its record, and so its slot,
// until it is closed; its node reports it Failed with the Ready
// condition's reason Failed.
func (sb *Sandbox) HoldsSlot() bool {
	if sb.Closed() {
		return false
	}
	if sb.Status.Phase != PhaseFailed {
		return true
	}
	if sb.Status.LocalID == "" {
		return false
	}
	for _, c := range sb.Status.Conditions {
		if c.Type == ConditionReady {
			return c.Reason == string(PhaseFailed)
		}
	}
	return false
}

// SourceCheckpoint is the Checkpoint a sandbox of spec starts from by
// name ("" when it starts from an image or an Environment): what a
// Checkpoint of that sandbox records as its spec.parent.
func (s *SandboxSpec) SourceCheckpoint() string {
	if s.Source == nil {
		return ""
	}
	return s.Source.Checkpoint
}
