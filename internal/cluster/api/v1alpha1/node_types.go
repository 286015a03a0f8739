package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ForkboxNodeSpec is what the node agent registers about its host.
type ForkboxNodeSpec struct {
	// Endpoint is where other nodes and the gateway reach this node's
	// API (host:port).
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// PreviewEndpoint is where the gateway reaches this node's preview
	// listener of sandbox ports (host:port; `serve --ports`), if any.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	PreviewEndpoint string `json:"previewEndpoint,omitempty"`
	// Unschedulable nodes get no new placements (a cordon).
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`
}

// RuntimeInfo is one OCI runtime a node offers.
type RuntimeInfo struct {
	Name Runtime `json:"name"`
	// Version is the first line the runtime binary prints for --version.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Version string `json:"version,omitempty"`
}

// TransferInfo is a node's checkpoint transfer listener: other nodes pull
// checkpoints from it over mutual TLS, and accept it as a client, with
// exactly this certificate (pinned; no CA).
type TransferInfo struct {
	// Endpoint is host:port of the listener.
	// +kubebuilder:validation:MaxLength=512
	Endpoint string `json:"endpoint"`
	// Certificate is the node's self-signed certificate (PEM).
	// +kubebuilder:validation:MaxLength=4096
	Certificate string `json:"certificate"`
}

// Allocatable is what a node can give sandboxes in total.
type Allocatable struct {
	// Slots is the number of live sandboxes the node takes.
	// +kubebuilder:validation:Minimum=0
	Slots int32 `json:"slots"`
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// +optional
	Disk *resource.Quantity `json:"disk,omitempty"`
}

// ForkboxNodeStatus is written by the node's agent (runtimes, allocatable,
// images) and by the controller (Ready=False when the Lease expires).
type ForkboxNodeStatus struct {
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	// +optional
	Runtimes []RuntimeInfo `json:"runtimes,omitempty"`
	// AgentVersion is the forkbox version the node runs.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	AgentVersion string `json:"agentVersion,omitempty"`
	// +optional
	Allocatable Allocatable `json:"allocatable,omitzero"`
	// Images are the image references cached on the node.
	// +kubebuilder:validation:MaxItems=512
	// +listType=set
	// +optional
	Images []string `json:"images,omitempty"`
	// Transfer is where and how peers pull checkpoints from this node.
	// +optional
	Transfer *TransferInfo `json:"transfer,omitempty"`
	// LeaseName names the coordination.k8s.io Lease the agent renews.
	// +optional
	LeaseName string `json:"leaseName,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ForkboxNode is one forkbox host of the cluster, registered by its node
// agent (`forkbox serve --cluster --node-name N`).
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=fbnode
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=='Ready')].status`
// +kubebuilder:printcolumn:name="Slots",type=integer,JSONPath=`.status.allocatable.slots`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ForkboxNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec ForkboxNodeSpec `json:"spec,omitzero"`
	// +optional
	Status ForkboxNodeStatus `json:"status,omitzero"`
}

// ForkboxNodeList is a list of ForkboxNodes.
// +kubebuilder:object:root=true
type ForkboxNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ForkboxNode `json:"items"`
}

func init() { SchemeBuilder.Register(&ForkboxNode{}, &ForkboxNodeList{}) }
