package clustertest

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StaleCache is a client as a component with an informer cache sees the
// API server when the cache is a write behind: reads (Get, List) come from
// Stale, a copy of the objects from before the write, and writes go to the
// embedded Client, the API server.
type StaleCache struct {
	client.Client
	Stale client.Reader
}

// Get reads key from the stale copy.
func (s StaleCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return s.Stale.Get(ctx, key, obj, opts...)
}

// List lists from the stale copy.
func (s StaleCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return s.Stale.List(ctx, list, opts...)
}
