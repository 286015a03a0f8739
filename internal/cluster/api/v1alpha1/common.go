package v1alpha1

import "k8s.io/apimachinery/pkg/api/resource"

// Runtime is an OCI runtime a node offers.
// +kubebuilder:validation:Enum=gvisor;crun
type Runtime string

// Runtime names.
const (
	RuntimeGVisor Runtime = "gvisor"
	RuntimeCrun   Runtime = "crun"
)

// Resources are a sandbox's limits. Unset fields take the node's defaults.
type Resources struct {
	// CPU in cores ("1", "500m").
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`
	// Memory ("512Mi", "2Gi").
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// Disk bounds the sandbox's writes ("10Gi").
	// +optional
	Disk *resource.Quantity `json:"disk,omitempty"`
	// Pids bounds the number of processes.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	Pids *int64 `json:"pids,omitempty"`
}

// EnvVar is one environment variable of a sandbox.
type EnvVar struct {
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	Value string `json:"value,omitempty"`
}

// SecretKeyRef names one key of a Secret in the object's namespace.
type SecretKeyRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key"`
}

// Credential is a named secret attached to a sandbox: injected as an
// environment variable or a file, redacted everywhere, carried to forks
// unless PerFork.
type Credential struct {
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// SecretRef is where the value comes from.
	SecretRef SecretKeyRef `json:"secretRef"`
	// File, when set, is the absolute path the value is written to
	// instead of an environment variable.
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	File string `json:"file,omitempty"`
	// PerFork credentials are not copied to forks.
	// +optional
	PerFork bool `json:"perFork,omitempty"`
}

// Egress is a sandbox's outbound network policy.
type Egress struct {
	// Mode: "none" (no network), "all" (the outside world minus Deny,
	// CIDRs only) or "allow" (only Allow: CIDRs, addresses, names and
	// "*." wildcards). Empty: "allow" when Allow is given, else the
	// node's default.
	// +kubebuilder:validation:Enum=none;all;allow
	// +optional
	Mode string `json:"mode,omitempty"`
	// Allow and Deny list host names, addresses or CIDRs.
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	// +optional
	Allow []string `json:"allow,omitempty"`
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	// +optional
	Deny []string `json:"deny,omitempty"`
}
