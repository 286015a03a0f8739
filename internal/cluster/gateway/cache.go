package gateway

import (
	"context"
	"fmt"
	"sync"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Cache indexes the gateway routes by.
const (
	localIDField        = "status.localID"          // Sandbox → its node's local ID
	replicaIDField      = "status.replicas.localID" // Checkpoint → each holder's local ID
	checkpointSandboxes = "spec.sandbox"            // Checkpoint → the sandbox it captured
)

func indexFields(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &fbv1.Sandbox{}, localIDField, func(o client.Object) []string {
		if id := o.(*fbv1.Sandbox).Status.LocalID; id != "" {
			return []string{id}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index sandboxes by local ID: %w", err)
	}
	if err := idx.IndexField(ctx, &fbv1.Checkpoint{}, replicaIDField, func(o client.Object) []string {
		var ids []string
		for _, r := range o.(*fbv1.Checkpoint).Status.Replicas {
			if r.LocalID != "" {
				ids = append(ids, r.LocalID)
			}
		}
		return ids
	}); err != nil {
		return fmt.Errorf("index checkpoints by local ID: %w", err)
	}
	if err := idx.IndexField(ctx, &fbv1.Checkpoint{}, checkpointSandboxes, func(o client.Object) []string {
		return []string{o.(*fbv1.Checkpoint).Spec.Sandbox}
	}); err != nil {
		return fmt.Errorf("index checkpoints by sandbox: %w", err)
	}
	return nil
}

// notifier wakes the calls waiting for an object to change: each change
// the cache sees closes the channel waiters hold and makes a new one.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func newNotifier() *notifier { return &notifier{ch: make(chan struct{})} }

// wait returns a channel closed at the next change.
func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ch
}

func (n *notifier) notify() {
	n.mu.Lock()
	defer n.mu.Unlock()
	close(n.ch)
	n.ch = make(chan struct{})
}

func (n *notifier) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.notify() },
		UpdateFunc: func(any, any) { n.notify() },
		DeleteFunc: func(any) { n.notify() },
	}
}
