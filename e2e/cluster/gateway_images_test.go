package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	gwpkg "github.com/forkbox/forkbox/internal/cluster/gateway"
	"github.com/forkbox/forkbox/internal/testimage"
)

// ImportImage through the gateway: the caller sends the archive, every
// Ready node imports it (progress forwarded), and a sandbox then starts
// from it on each node; a host path is PermissionDenied (as a daemon
// answers a remote caller), an oversized archive ResourceExhausted, a
// corrupt one an error naming the node that refused it; the same image
// again is fine, another image under its name FailedPrecondition and
// nothing replaced (images are shared by every tenant); RemoveImage and
// an insecure PullImage are PermissionDenied (a cluster admin's, on the
// nodes); PullImage reaches the nodes and names the one that failed.
func TestGatewayImportImage(t *testing.T) {
	c := gateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	mark := "gw-import-" + cl.RunID + "\n"
	img := testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{"etc/gw-import": mark})
	ref := "e2e.local/gw-import-" + cl.RunID + ":1"
	path := filepath.Join(cl.Dir, "gw-import.tar")
	if err := testimage.WriteOCIArchive(img, ref, path); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	archive, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := c.ImportImage(ctx, path, "", nil); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("import of a host path: got %v, want PermissionDenied", err)
	}
	if _, err := c.ImportImageArchive(ctx, make([]byte, gwpkg.MaxArchiveBytes+1), "", nil); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("import of %d bytes: got %v, want ResourceExhausted", gwpkg.MaxArchiveBytes+1, err)
	}
	if _, err := c.ImportImageArchive(ctx, []byte("not a tar"), "", nil); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "on node "+nodes()[0].Name) {
		t.Fatalf("import of garbage: got %v, want InvalidArgument naming node %s", err, nodes()[0].Name)
	}

	var progress []*fbclient.Progress
	im, err := c.ImportImageArchive(ctx, archive, "", func(p *fbclient.Progress) { progress = append(progress, p) })
	if err != nil {
		t.Fatal(err)
	}
	if im.Name != ref || !strings.HasPrefix(im.Digest, "sha256:") || len(progress) == 0 {
		t.Fatalf("import: got image %q %q after %d progress messages, want %s", im.Name, im.Digest, len(progress), ref)
	}
	// On every node, and a sandbox of it runs there.
	var objs []*fbv1.Sandbox
	for i, n := range nodes() {
		if !nodeHasImage(t, n, im.Digest) {
			t.Errorf("node %s lacks the imported image", n.Name)
		}
		sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: "gw-import-" + string(rune('a'+i))},
			Spec: fbv1.SandboxSpec{Image: ref, NodeName: n.Name}}
		create(t, sb)
		objs = append(objs, sb)
		if got := sh(t, running(t, sb, fbv1.PhaseRunning), "cat /etc/gw-import"); got != mark {
			t.Errorf("sandbox on %s: got %q, want %q", n.Name, got, mark)
		}
	}
	// The same image again is fine; another image under its name is
	// refused, naming the node, and replaces nothing: one tenant's import
	// never swaps the image another tenant runs.
	if again, err := c.ImportImageArchive(ctx, archive, "", nil); err != nil || again.Digest != im.Digest {
		t.Fatalf("the same import again: %v, %v", again, err)
	}
	other := filepath.Join(cl.Dir, "gw-import-other.tar")
	if err := testimage.WriteOCIArchive(testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{"etc/gw-import": "someone else's\n"}), ref, other); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(other)
	otherBytes, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ImportImageArchive(ctx, otherBytes, "", nil); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "on node "+nodes()[0].Name) {
		t.Fatalf("import of another image under a taken name: got %v, want FailedPrecondition naming node %s", err, nodes()[0].Name)
	}
	for _, n := range nodes() {
		if !nodeHasImage(t, n, im.Digest) {
			t.Errorf("node %s lost the image another import tried to replace", n.Name)
		}
	}
	// Removal is the cluster admin's, on the nodes: images are shared.
	if err := c.RemoveImage(ctx, ref); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("remove through the gateway: got %v, want PermissionDenied", err)
	}
	for _, sb := range objs {
		if err := plane.Client.Delete(ctx, sb); err != nil {
			t.Fatal(err)
		}
		gone(t, sb)
	}
	removeOnNodes := func() {
		t.Helper()
		for _, n := range nodes() {
			if err := n.Client.RemoveImage(ctx, ref); err != nil && !errdefs.IsNotFound(err) {
				t.Fatalf("remove on node %s: %v", n.Name, err)
			}
			if nodeHasImage(t, n, im.Digest) {
				t.Errorf("node %s still has the removed image", n.Name)
			}
		}
	}
	removeOnNodes()

	// The CLI, as the README says: --upload sends this machine's file.
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(cl.Bin, append([]string{"--host", "http://" + gw.addr, "--token", gw.token}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("forkbox %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := cli("image", "import", "--upload", path); !strings.Contains(out, ref) || !strings.Contains(out, im.Digest) {
		t.Fatalf("forkbox image import --upload: got %q", out)
	}
	for _, n := range nodes() {
		if !nodeHasImage(t, n, im.Digest) {
			t.Errorf("node %s lacks the image the CLI imported", n.Name)
		}
	}
	removeOnNodes()

	// Pull: each node is asked; the first that fails is named (the test
	// hosts have no registry). A plain-HTTP pull is not a tenant's to ask.
	if _, err := c.PullImage(ctx, "127.0.0.1:1/none:latest", false, nil); err == nil || !strings.Contains(err.Error(), "on node "+nodes()[0].Name) {
		t.Fatalf("pull from no registry: got %v, want an error naming node %s", err, nodes()[0].Name)
	}
	if _, err := c.PullImage(ctx, "127.0.0.1:1/none:latest", true, nil); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("insecure pull through the gateway: got %v, want PermissionDenied", err)
	}
}

func nodeHasImage(t *testing.T, n *clustertest.Node, digest string) bool {
	t.Helper()
	l, err := n.Client.ListImages(context.Background())
	if err != nil {
		t.Fatalf("list images on %s: %v", n.Name, err)
	}
	for _, i := range l {
		if i.Digest == digest {
			return true
		}
	}
	return false
}
