package cluster

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// rawPull asks node from's transfer server for its checkpoint id as node
// as (with as's own key pair, from its state directory: a real, trusted
// node), pinning from's published certificate, and returns the first
// frame of the answer: its type and payload.
func rawPull(t *testing.T, as, from *clustertest.Node, id string) (byte, []byte) {
	t.Helper()
	dir := filepath.Join(as.StateDir, "transfer")
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "transfer-cert.pem"), filepath.Join(dir, "transfer-key.pem"))
	if err != nil {
		t.Fatalf("node %s's transfer key pair: %v", as.Name, err)
	}
	fn := get(t, &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: from.Name}})
	if fn.Status.Transfer == nil {
		t.Fatalf("node %s publishes no transfer endpoint", from.Name)
	}
	blk, _ := pem.Decode([]byte(fn.Status.Transfer.Certificate))
	if blk == nil {
		t.Fatalf("node %s publishes no PEM certificate", from.Name)
	}
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, // pinned below, as the nodes do
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) != 1 || !bytes.Equal(raw[0], blk.Bytes) {
				return fmt.Errorf("node %s's certificate is not the one it published", from.Name)
			}
			return nil
		}}}
	defer tr.CloseIdleConnections()
	body, _ := json.Marshal(map[string]string{"checkpoint": id})
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	resp, err := hc.Post("https://"+fn.Status.Transfer.Endpoint+"/v1/pull", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("node %s asks node %s for %s: %v", as.Name, from.Name, id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("node %s asks node %s for %s: %s", as.Name, from.Name, id, resp.Status)
	}
	var h [5]byte
	if _, err := io.ReadFull(resp.Body, h[:]); err != nil {
		t.Fatalf("the answer's first frame: %v", err)
	}
	p := make([]byte, min(binary.BigEndian.Uint32(h[1:]), 1<<20))
	if _, err := io.ReadFull(resp.Body, p); err != nil {
		t.Fatalf("the answer's first frame: %v", err)
	}
	return h[0], p
}

// TestTransferNeedsPlacement: a node that is trusted (its certificate is
// published) but has no sandbox placed on it that starts from a
// checkpoint asks the checkpoint's node for it with its own key: it is
// refused, PermissionDenied, naming the node and the checkpoint, and
// nothing is sent. Once a sandbox from that checkpoint is placed on it,
// its agent pulls the checkpoint and the sandbox runs.
func TestTransferNeedsPlacement(t *testing.T) {
	needNodes(t, 2)
	ns := testNamespace(t)
	src, other := node(0), node(1)
	box := newSandbox(ns, "src", src.Name, fbv1.RuntimeCrun)
	create(t, box)
	sh(t, running(t, box, fbv1.PhaseRunning), "echo secret > /root/marker")
	ck := newCheckpoint(t, ns, "ck", "src", false)
	id := ""
	for _, rp := range ck.Status.Replicas {
		if rp.Node == src.Name && rp.Ready {
			id = rp.LocalID
		}
	}
	if id == "" {
		t.Fatalf("checkpoint %s has no ready replica on %s: %+v", ck.Name, src.Name, ck.Status.Replicas)
	}

	typ, p := rawPull(t, other, src, id)
	var re struct{ Class, Message string }
	if typ != 'E' || json.Unmarshal(p, &re) != nil {
		t.Fatalf("node %s, no placement, asks for %s: got frame %q (%d bytes), want an error frame", other.Name, id, typ, len(p))
	}
	t.Logf("refused: %+v", re)
	want := fmt.Sprintf("node %s may not pull checkpoint %s (%s/%s)", other.Name, id, ns, ck.Name)
	if re.Class != "PermissionDenied" || !strings.Contains(re.Message, want) {
		t.Fatalf("node %s, no placement, asks for %s: got %+v, want PermissionDenied saying %q", other.Name, id, re, want)
	}

	// Placed there, it is pulled and runs.
	c := fromCheckpoint(ns, "child", ck.Name, other.Name)
	create(t, c)
	if got := sh(t, running(t, c, fbv1.PhaseRunning), "cat /root/marker"); got != "secret\n" {
		t.Fatalf("child on %s: got %q, want the source's file", other.Name, got)
	}
	if !replicaOn(t, ck, other.Name) {
		t.Fatalf("checkpoint %s has no ready replica on %s after the child started: %+v", ck.Name, other.Name, ck.Status.Replicas)
	}
}
