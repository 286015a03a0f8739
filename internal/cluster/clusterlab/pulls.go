package clusterlab

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Pull is one pull of a checkpoint by a node, as its Transferred event
// tells it (internal/cluster/nodeagent/transfer.go writes them).
type Pull struct {
	// Node pulled from From.
	Node, From string
	// Parent is the ancestor checkpoint of an incremental send ("": full).
	Parent string
	// Bytes is what the send carried (the btrfs stream and the files
	// beside it), MS how long the pull took on the receiver.
	Bytes, MS int64
}

var pulledRE = regexp.MustCompile(`^node (\S+) pulled from node (\S+): (full|incremental from (\S+)), (\d+) bytes in (\d+) ms`)

// ParsePull reads a Transferred event's message.
func ParsePull(msg string) (Pull, bool) {
	m := pulledRE.FindStringSubmatch(msg)
	if m == nil {
		return Pull{}, false
	}
	b, err1 := strconv.ParseInt(m[5], 10, 64)
	ms, err2 := strconv.ParseInt(m[6], 10, 64)
	if err1 != nil || err2 != nil {
		return Pull{}, false
	}
	return Pull{Node: m[1], From: m[2], Parent: m[4], Bytes: b, MS: ms}, true
}

// Pulls are the pulls of Checkpoint name in namespace ns so far, from its
// Transferred events.
func (l *Lab) Pulls(ctx context.Context, ns, name string) ([]Pull, error) {
	var evs corev1.EventList
	if err := l.Plane.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []Pull
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind != "Checkpoint" || e.InvolvedObject.Name != name || e.Reason != "Transferred" {
			continue
		}
		if p, ok := ParsePull(e.Message); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// PullBy waits (at most timeout) for the Transferred event of node's pull
// of checkpoint ck (events are written asynchronously, after the replica
// may already serve a child) and returns it.
func (l *Lab) PullBy(ctx context.Context, ck *fbv1.Checkpoint, node string, timeout time.Duration) (Pull, error) {
	var got Pull
	var seen []Pull
	err := poll(ctx, timeout, func() (bool, error) {
		ps, err := l.Pulls(ctx, ck.Namespace, ck.Name)
		for _, p := range ps {
			if p.Node == node {
				got = p
				return true, nil
			}
		}
		seen = ps
		return false, err
	})
	if err != nil {
		return Pull{}, fmt.Errorf("the Transferred event of node %s pulling checkpoint %s (pulls: %+v): %w", node, ck.Name, seen, err)
	}
	return got, nil
}
