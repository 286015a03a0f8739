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
// environment variable of every exec, as a file under /run/secrets, or
// both (as on one host: internal/credentials), redacted everywhere,
// carried to forks unless PerFork. The gateway's SetCredential writes one
// (its value in a Secret the Sandbox owns); a node applies changes to a
// running sandbox.
type Credential struct {
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// SecretRef is where the value comes from.
	SecretRef SecretKeyRef `json:"secretRef"`
	// Env is the environment variable the value is given as. With
	// neither Env nor File, it is Name.
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Env string `json:"env,omitempty"`
	// File, when set, is the file under /run/secrets (a plain name: a
	// tmpfs outside the sandbox's writable layer) the value is written to.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`
	// +kubebuilder:validation:MaxLength=128
	// +optional
	File string `json:"file,omitempty"`
	// PerFork credentials are not copied to forks: each fork must be
	// given its own value.
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
