// Package kube holds what the controller and the node agent share about
// talking to Kubernetes: the scheme, the kubeconfig, the field indexes,
// the local names of objects and condition helpers.
package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// NewScheme returns a scheme with the core types, Leases and
// forkbox.dev/v1alpha1.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, coordinationv1.AddToScheme, fbv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err) // static registrations: cannot fail
		}
	}
	return s
}

// Config loads a kubeconfig file, or the in-cluster config when path is "".
func Config(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes config (--kubeconfig %q): %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}

var logOnce sync.Once

// SetLogger routes controller-runtime's and client-go's logs to log (once
// per process: both keep a global logger).
func SetLogger(log *slog.Logger) logr.Logger {
	l := logr.FromSlogHandler(log.Handler())
	logOnce.Do(func() {
		ctrl.SetLogger(l)
		klog.SetLogger(l)
	})
	return l
}

// IndexNodeName indexes Sandboxes and Checkpoints by spec.nodeName in a
// cache, for client.MatchingFields{fbv1.NodeNameField: node}.
func IndexNodeName(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &fbv1.Sandbox{}, fbv1.NodeNameField, func(o client.Object) []string {
		return []string{o.(*fbv1.Sandbox).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("index sandboxes by node: %w", err)
	}
	if err := idx.IndexField(ctx, &fbv1.Checkpoint{}, fbv1.NodeNameField, func(o client.Object) []string {
		return []string{o.(*fbv1.Checkpoint).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("index checkpoints by node: %w", err)
	}
	return nil
}

// LocalSandboxName is the name of an object's sandbox in its node's
// ledger: derived from the object's UID, so a node that crashed between
// creating it and writing status finds it again.
func LocalSandboxName(sb *fbv1.Sandbox) string { return "k8s-" + string(sb.UID) }

// LocalCheckpointTag is the tag of a Checkpoint in its node's ledger:
// bound to the object's UID (a sandbox may have many Checkpoints of one
// spec.tag, each its own capture), after the spec's tag if any, which
// people reading the node's ledger know it by.
func LocalCheckpointTag(ck *fbv1.Checkpoint) string {
	if ck.Spec.Tag != "" {
		return ck.Spec.Tag + "@k8s-" + string(ck.UID)
	}
	return "k8s-" + string(ck.UID)
}

// SetCondition sets a condition on conds, stamped with gen; it reports
// whether anything changed.
func SetCondition(conds *[]metav1.Condition, typ string, ok bool, reason, msg string, gen int64) bool {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	return meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// IsTrue reports whether conds has typ set to True.
func IsTrue(conds []metav1.Condition, typ string) bool { return meta.IsStatusConditionTrue(conds, typ) }

// Truncate bounds a message written to an object.
func Truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
