package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EnvironmentSpec is a declarative baseline: image, resources and setup
// steps, built once into a warm checkpoint.
type EnvironmentSpec struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image"`
	// +optional
	Runtime Runtime `json:"runtime,omitempty"`
	// +optional
	Resources Resources `json:"resources,omitzero"`
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`
	// Setup are shell commands run in order in a builder sandbox.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=65536
	// +listType=atomic
	// +optional
	Setup []string `json:"setup,omitempty"`
	// SetupHash, when set, says a client runs the setup instead of
	// Setup (the gateway's BeginBuild and CompleteBuild: an SDK's setup
	// function): it is a hash of the client's setup code, and part of the
	// spec's hash. The builder is handed to that client, which says how
	// its setup went on the builder (SetupResultAnnotation).
	// +kubebuilder:validation:MaxLength=128
	// +optional
	SetupHash string `json:"setupHash,omitempty"`
	// MaxAge rebuilds the checkpoint once it is older (0 = never).
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
	// PoolSize is how many Sandboxes of the built checkpoint the
	// controller keeps started, ready to hand over (a warm pool: each is
	// labelled PoolLabel, and a handover takes it out of the pool; 0 =
	// none). Like maxAge it says nothing of what is built: it is not part
	// of the spec's hash.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	// +optional
	PoolSize int32 `json:"poolSize,omitempty"`
}

// EnvironmentStatus says which checkpoint holds the built environment.
type EnvironmentStatus struct {
	// Build names the build under way or last tried: its builder Sandbox
	// and its Checkpoint have this name.
	// +optional
	Build string `json:"build,omitempty"`
	// Hash of the definition the checkpoint was built from.
	// +optional
	Hash string `json:"hash,omitempty"`
	// Checkpoint names the Checkpoint of the last good build.
	// +optional
	Checkpoint string `json:"checkpoint,omitempty"`
	// +optional
	BuiltAt *metav1.Time `json:"builtAt,omitempty"`
	// PoolReady counts the warm pool's Sandboxes of the checkpoint that
	// run, ready to hand over.
	// +optional
	PoolReady int32 `json:"poolReady,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Environment is a baseline that sandboxes start from warm
// (spec.source.environment).
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=fbenv
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Checkpoint",type=string,JSONPath=`.status.checkpoint`
// +kubebuilder:printcolumn:name="Built",type=date,JSONPath=`.status.builtAt`
// +kubebuilder:printcolumn:name="Pool",type=integer,JSONPath=`.status.poolReady`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Environment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec EnvironmentSpec `json:"spec"`
	// +optional
	Status EnvironmentStatus `json:"status,omitzero"`
}

// EnvironmentList is a list of Environments.
// +kubebuilder:object:root=true
type EnvironmentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Environment `json:"items"`
}

func init() { SchemeBuilder.Register(&Environment{}, &EnvironmentList{}) }

// Hash is the hash of the definition a build makes (the spec without
// maxAge, which says when to rebuild, and poolSize, how many to keep
// started: neither says what): 16 hex digits.
func (s *EnvironmentSpec) Hash() string {
	d := s.DeepCopy()
	d.MaxAge, d.PoolSize = nil, 0
	b, _ := json.Marshal(d)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// BuildName names the build of spec hash: the Checkpoint it makes (and,
// through BuilderName, its builder Sandbox). It is the environment's name and the hash; for a
// rebuild of the same spec after maxAge, also the build time of the
// checkpoint it replaces; for a retry (RetryAnnotation), the retry's
// count. While the checkpoint of hash is current it is that checkpoint's
// name.
func BuildName(e *Environment, hash string) string {
	base := e.Name
	if len(base) > 200 {
		base = base[:200]
	}
	name := base + "-" + hash[:10]
	if e.Status.Hash == hash && e.Status.BuiltAt != nil && e.Spec.MaxAge != nil && e.Spec.MaxAge.Duration > 0 &&
		time.Since(e.Status.BuiltAt.Time) >= e.Spec.MaxAge.Duration {
		name += "-" + strconv.FormatInt(e.Status.BuiltAt.Unix(), 36)
	} else if e.Status.Hash == hash && e.Status.Checkpoint != "" {
		return e.Status.Checkpoint // the current one, not aged yet
	}
	if n := Retries(e); n > 0 {
		name += "-r" + strconv.Itoa(n)
	}
	return name
}

// BuilderName is the name of the builder Sandbox of build: "build-"
// and the build, as one host names an environment's builder
// (build-<env>-...), so that a caller's list of sandboxes shows the
// builders alike, and a builder's name never takes a name a caller may
// give a sandbox of its own (<env>-<hash>).
func BuilderName(build string) string { return "build-" + build }

// Retries is the count of RetryAnnotation (0 when unset or not a count).
func Retries(e *Environment) int {
	n, err := strconv.Atoi(e.Annotations[RetryAnnotation])
	if err != nil || n < 0 || n > 1_000_000 {
		return 0
	}
	return n
}
