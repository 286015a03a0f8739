package nodeagent

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/store"
)

// TestSameCheckpoint: a local checkpoint serves as a copy of a
// Checkpoint only when its subvolume is the one the Checkpoint's status
// names and its tag is the Checkpoint's: a replica entry (which any node
// writes) naming the local ID of another tenant's checkpoint is refused,
// PermissionDenied, naming both.
func TestSameCheckpoint(t *testing.T) {
	mine := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "evil", Name: "mine", UID: "uid-mine"},
		Status: fbv1.CheckpointStatus{SubvolumeUUID: "uuid-mine"}}
	tagged := mine.DeepCopy()
	tagged.Spec.Tag = "my-tag"
	for _, tc := range []struct {
		name  string
		ck    *fbv1.Checkpoint
		local store.Checkpoint
		uuid  string
		ok    bool
	}{
		{"its own copy", mine, store.Checkpoint{ID: "ck-1", Tag: "k8s-uid-mine"}, "uuid-mine", true},
		{"its own copy, tagged", tagged, store.Checkpoint{ID: "ck-1", Tag: "my-tag@k8s-uid-mine"}, "uuid-mine", true},
		{"a bare tag, as nodes gave copies before tags were bound to the UID", tagged, store.Checkpoint{ID: "ck-victim", Tag: "my-tag"}, "uuid-mine", false},
		{"another Checkpoint of the same tag", tagged, store.Checkpoint{ID: "ck-2", Tag: "my-tag@k8s-uid-other"}, "uuid-mine", false},
		{"a bare tag without a subvolume to tell it", &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{UID: "uid-mine"}, Spec: fbv1.CheckpointSpec{Tag: "my-tag"}},
			store.Checkpoint{ID: "ck-2", Tag: "my-tag"}, "", false},
		{"a node without btrfs", &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{UID: "uid-mine"}}, store.Checkpoint{ID: "ck-1", Tag: "k8s-uid-mine"}, "", true},
		{"another tenant's checkpoint", mine, store.Checkpoint{ID: "ck-victim", Tag: "k8s-uid-victim"}, "uuid-victim", false},
		{"another's subvolume under the right tag", mine, store.Checkpoint{ID: "ck-victim", Tag: "k8s-uid-mine"}, "uuid-victim", false},
		{"the right subvolume under another tag", mine, store.Checkpoint{ID: "ck-victim", Tag: "k8s-uid-victim"}, "uuid-mine", false},
		{"a checkpoint that names no subvolume", &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{UID: "uid-mine"}},
			store.Checkpoint{ID: "ck-victim", Tag: "k8s-uid-mine"}, "uuid-victim", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := sameCheckpoint(tc.ck, &tc.local, tc.uuid)
			if tc.ok {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), tc.local.ID) || !strings.Contains(err.Error(), tc.ck.Name) {
				t.Fatalf("got %v, want PermissionDenied naming %s and %s", err, tc.local.ID, tc.ck.Name)
			}
		})
	}
}
