package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/testimage"
)

// TestSpillShipsImage: the checkpoint's image is on its node only. When
// a fork spills to another node, that node's agent fetches the image's
// blobs from the sender by digest (over the transfer channel) before the
// checkpoint, and the spilled child runs with the image's files and the
// checkpoint's; the node then lists the image, and nothing is left
// staged in its image store.
func TestSpillShipsImage(t *testing.T) {
	needNodes(t, 2)
	ns := testNamespace(t)
	ctx := context.Background()
	src := node(0)
	mark := ns + "\n"
	img := testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{"etc/only-on-src": mark})
	ref := "e2e.local/only-on-src-" + ns + ":1"
	archive := filepath.Join(cl.Dir, ns+"-image.tar")
	if err := testimage.WriteOCIArchive(img, ref, archive); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(archive)
	im, err := src.Client.ImportImage(ctx, archive, "", nil)
	if err != nil {
		t.Fatalf("import on %s: %v", src.Name, err)
	}
	hasImage := func(n *clustertest.Node) bool {
		l, err := n.Client.ListImages(ctx)
		if err != nil {
			t.Fatalf("list images on %s: %v", n.Name, err)
		}
		for _, i := range l {
			if i.Digest == im.Digest {
				return true
			}
		}
		return false
	}
	for _, n := range nodes()[1:] {
		if hasImage(n) {
			t.Fatalf("node %s has the image before the test", n.Name)
		}
	}

	box := newSandbox(ns, "src", src.Name, fbv1.RuntimeCrun)
	box.Spec.Image = im.Name
	create(t, box)
	local := running(t, box, fbv1.PhaseRunning)
	sh(t, local, "echo from-checkpoint > /root/marker")

	// Slots - 1 children fill the source's node; the last one spills.
	spill := fork(t, ns, "spill", "src", int32(src.Slots))
	var spilled *fbv1.Sandbox
	for i := range src.Slots {
		c := child(t, spill, i)
		l := running(t, c, fbv1.PhaseRunning)
		if c.Spec.NodeName == src.Name {
			continue
		}
		if spilled != nil {
			t.Fatalf("children %s and %s both off %s, want one", spilled.Name, c.Name, src.Name)
		}
		spilled = c
		if got := sh(t, l, "cat /etc/only-on-src /root/marker"); got != mark+"from-checkpoint\n" {
			t.Fatalf("spilled child %s on %s: got %q, want the image's file and the checkpoint's", c.Name, c.Spec.NodeName, got)
		}
	}
	if spilled == nil {
		t.Fatalf("no child of %s spilled off %s", spill.Name, src.Name)
	}
	target := nodeNamed(spilled.Spec.NodeName)
	if !hasImage(target) {
		t.Errorf("node %s does not list image %s after the spill", target.Name, im.Digest)
	}
	ck := &fbv1.Checkpoint{}
	ck.Namespace, ck.Name = ns, get(t, spill).Status.Checkpoint
	pulls := waitTransfers(t, ck, 1)
	t.Logf("pull of %s: %+v", ck.Name, pulls)
	var evs corev1.EventList
	if err := plane.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	shipped := false
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == ck.Name && e.Reason == "Transferred" {
			t.Logf("event: %s", e.Message)
			shipped = shipped || strings.Contains(e.Message, fmt.Sprintf("image %s fetched from node %s", im.Name, src.Name))
		}
	}
	if !shipped {
		t.Errorf("no Transferred event of %s says the image was fetched from %s", ck.Name, src.Name)
	}
	clustertest.Eventually(t, time.Minute, "fork spill complete", func() (bool, string) {
		get(t, spill)
		return spill.Status.Phase == fbv1.ForkComplete && spill.Status.Ready == int32(src.Slots), fmt.Sprintf("%+v", spill.Status)
	})
	noHalfCheckpoint(t, target)
	if ents, _ := os.ReadDir(filepath.Join(target.StateDir, "images", "tmp")); len(ents) != 0 {
		t.Errorf("node %s: images/tmp holds %d entries after the transfer", target.Name, len(ents))
	}
}
