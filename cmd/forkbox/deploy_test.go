package main

import (
	"bytes"
	"os"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// TestNodeManifestFlags: the node DaemonSet's command is one `forkbox
// serve` accepts, and it lets the sandboxes' mounts reach the host through
// its Bidirectional volumes (--propagate-sandbox-mounts), which the next
// pod needs to find the sandboxes that outlived the last.
func TestNodeManifestFlags(t *testing.T) {
	b, err := os.ReadFile("../../deploy/node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		var d appsv1.DaemonSet
		if err := yaml.Unmarshal(doc, &d); err == nil && d.Kind == "DaemonSet" {
			ds = &d
		}
	}
	if ds == nil || len(ds.Spec.Template.Spec.Containers) == 0 {
		t.Fatal("no DaemonSet with a container in deploy/node.yaml")
	}
	c := ds.Spec.Template.Spec.Containers[0]
	if len(c.Command) < 2 || c.Command[0] != "forkbox" || c.Command[1] != "serve" {
		t.Fatalf("command %q, want forkbox serve ...", c.Command)
	}
	cmd := serveCmd()
	if err := cmd.ParseFlags(c.Command[2:]); err != nil {
		t.Fatalf("serve refuses the manifest's flags: %v", err)
	}
	if v, err := cmd.Flags().GetBool("propagate-sandbox-mounts"); err != nil || !v {
		t.Errorf("--propagate-sandbox-mounts is %v (%v), want set", v, err)
	}
	bidi := 0
	for _, m := range c.VolumeMounts {
		if slices.Contains([]string{"/var/lib/forkbox", "/run/forkbox"}, m.MountPath) &&
			m.MountPropagation != nil && *m.MountPropagation == "Bidirectional" {
			bidi++
		}
	}
	if bidi != 2 {
		t.Errorf("%d of the state and run volumes are Bidirectional, want both", bidi)
	}
}
