package controller

import (
	"context"
	"errors"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Cache indexes that map an object to those waiting on it.
const (
	sourceCheckpointField = "spec.source.checkpoint"  // Sandbox → its Checkpoint
	forkSandboxField      = "spec.source.sandbox"     // Fork → its source Sandbox
	forkCheckpointField   = "spec.source.checkpoint"  // Fork → its source Checkpoint (one it does not own)
	envCheckpointField    = "status.checkpoint"       // Environment → the Checkpoint it serves
	sourceEnvField        = "spec.source.environment" // Sandbox → its Environment
)

func indexSources(ctx context.Context, idx client.FieldIndexer) error {
	source := func(sb *fbv1.Sandbox) *fbv1.SandboxSource {
		if sb.Spec.Source == nil {
			return &fbv1.SandboxSource{}
		}
		return sb.Spec.Source
	}
	return errors.Join(
		indexBy(ctx, idx, &fbv1.Sandbox{}, sourceCheckpointField, "sandboxes by checkpoint", func(sb *fbv1.Sandbox) string { return source(sb).Checkpoint }),
		indexBy(ctx, idx, &fbv1.Sandbox{}, sourceEnvField, "sandboxes by environment", func(sb *fbv1.Sandbox) string { return source(sb).Environment }),
		indexBy(ctx, idx, &fbv1.Fork{}, forkSandboxField, "forks by sandbox", func(fk *fbv1.Fork) string { return fk.Spec.Source.Sandbox }),
		indexBy(ctx, idx, &fbv1.Fork{}, forkCheckpointField, "forks by checkpoint", func(fk *fbv1.Fork) string { return fk.Spec.Source.Checkpoint }),
		indexBy(ctx, idx, &fbv1.Environment{}, envCheckpointField, "environments by checkpoint", func(e *fbv1.Environment) string { return e.Status.Checkpoint }),
	)
}

// indexBy indexes the objects of obj's kind under field by key ("": not
// indexed).
func indexBy[T client.Object](ctx context.Context, idx client.FieldIndexer, obj T, field, what string, key func(T) string) error {
	err := idx.IndexField(ctx, obj, field, func(o client.Object) []string {
		if k := key(o.(T)); k != "" {
			return []string{k}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index %s: %w", what, err)
	}
	return nil
}

// deleted passes only the deletions of the objects watched.
var deleted = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// requests turns a list of objects into reconcile requests.
func requests[T client.Object](items []T) []reconcile.Request {
	out := make([]reconcile.Request, 0, len(items))
	for _, o := range items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
	}
	return out
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
