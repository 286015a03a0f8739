package nodeagent

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/daemon"
)

// TestCheckRuntime: a memory checkpoint is pulled only by a node whose
// runsc is the version it was taken under; the error names both.
func TestCheckRuntime(t *testing.T) {
	n := func(name, version string) *fbv1.ForkboxNode {
		return &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: fbv1.ForkboxNodeStatus{Runtimes: []fbv1.RuntimeInfo{{Name: fbv1.RuntimeGVisor, Version: version}}}}
	}
	a := &agent{o: Options{NodeName: "b"}}
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Name: "mem"},
		Status: fbv1.CheckpointStatus{Kind: daemon.KindMemory, OriginNode: "a", Runtime: fbv1.RuntimeGVisor}}
	same := map[string]*fbv1.ForkboxNode{"a": n("a", "runsc version 1"), "b": n("b", "runsc version 1")}
	if err := a.checkRuntime(ck, same); err != nil {
		t.Fatalf("same version: %v", err)
	}
	other := map[string]*fbv1.ForkboxNode{"a": n("a", "runsc version 1"), "b": n("b", "runsc version 2")}
	err := a.checkRuntime(ck, other)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"runsc version 1"`) || !strings.Contains(err.Error(), `"runsc version 2"`) {
		t.Fatalf("another version: got %v, want a FailedPrecondition naming both", err)
	}
	ck.Status.Kind = daemon.KindFilesystem
	if err := a.checkRuntime(ck, other); err != nil {
		t.Fatalf("a filesystem checkpoint: %v", err)
	}
}

// TestPullLock: pulls of one checkpoint take turns, of others do not.
func TestPullLock(t *testing.T) {
	var tr transfers
	unlock := tr.lock("ck-1")
	other := tr.lock("ck-2") // not held up by ck-1
	other()
	got := make(chan struct{})
	go func() {
		defer close(got)
		tr.lock("ck-1")()
	}()
	select {
	case <-got:
		t.Fatal("a second pull of ck-1 ran while the first held it")
	default:
	}
	unlock()
	<-got
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.pulls) != 0 {
		t.Errorf("locks left: %v", tr.pulls)
	}
}

// TestPullSources: a checkpoint is pulled from its capturing node's ready
// copy only, never from a copy another node lists (it may never have had
// it), nor from a capturing node whose copy is not ready.
func TestPullSources(t *testing.T) {
	ck := &fbv1.Checkpoint{Status: fbv1.CheckpointStatus{OriginNode: "a", Replicas: []fbv1.Replica{
		{Node: "evil", LocalID: "ck-1", Ready: true}, {Node: "a", LocalID: "ck-1", Ready: true}, {Node: "c", LocalID: "ck-1", Ready: true}}}}
	if got := pullSources(ck, "b"); len(got) != 1 || got[0].Node != "a" {
		t.Errorf("pull sources: %+v, want a's copy only", got)
	}
	if got := pullSources(ck, "a"); len(got) != 0 {
		t.Errorf("the capturing node's own sources: %+v, want none", got)
	}
	ck.Status.Replicas[1].Ready = false
	if got := pullSources(ck, "b"); len(got) != 0 {
		t.Errorf("with the capturing node's copy not ready: %+v, want none", got)
	}
}
