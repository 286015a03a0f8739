package controller

import (
	"context"
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
	if err := idx.IndexField(ctx, &fbv1.Sandbox{}, sourceCheckpointField, func(o client.Object) []string {
		if s := o.(*fbv1.Sandbox).Spec.Source; s != nil && s.Checkpoint != "" {
			return []string{s.Checkpoint}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index sandboxes by checkpoint: %w", err)
	}
	if err := idx.IndexField(ctx, &fbv1.Sandbox{}, sourceEnvField, func(o client.Object) []string {
		if s := o.(*fbv1.Sandbox).Spec.Source; s != nil && s.Environment != "" {
			return []string{s.Environment}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index sandboxes by environment: %w", err)
	}
	if err := idx.IndexField(ctx, &fbv1.Fork{}, forkSandboxField, func(o client.Object) []string {
		if s := o.(*fbv1.Fork).Spec.Source.Sandbox; s != "" {
			return []string{s}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index forks by sandbox: %w", err)
	}
	if err := idx.IndexField(ctx, &fbv1.Fork{}, forkCheckpointField, func(o client.Object) []string {
		if s := o.(*fbv1.Fork).Spec.Source.Checkpoint; s != "" {
			return []string{s}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index forks by checkpoint: %w", err)
	}
	if err := idx.IndexField(ctx, &fbv1.Environment{}, envCheckpointField, func(o client.Object) []string {
		if ck := o.(*fbv1.Environment).Status.Checkpoint; ck != "" {
			return []string{ck}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index environments by checkpoint: %w", err)
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
