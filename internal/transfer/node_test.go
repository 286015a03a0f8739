package transfer

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"github.com/forkbox/forkbox/internal/snapshot/testsuite"
	"github.com/forkbox/forkbox/internal/store"
)

// storeLedger is the Ledger of a real SQLite store.
type storeLedger struct{ st *store.Store }

func (l storeLedger) Record(ctx context.Context, id string) ([]byte, error) {
	ck, err := l.st.GetCheckpoint(ctx, id)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ck)
}

func (l storeLedger) Commit(ctx context.Context, id string, rec []byte, memDir, imageDigest string) error {
	var ck store.Checkpoint
	if err := json.Unmarshal(rec, &ck); err != nil || ck.ID != id {
		return errdefs.ErrInvalidArgument
	}
	return l.st.AddReceivedCheckpoint(ctx, &ck)
}

// node is one test node: a btrfs snapshot store on its own loop-mounted
// filesystem, a ledger, an identity, a transfer server.
type node struct {
	name   string
	dir    string
	snaps  *btrfs.Snapshotter
	ledger *store.Store
	local  *Local
	id     *Identity
	grants *testGrants // what its server lets peers pull
	srv    *Server
	addr   string
	client *Client
}

func requireRoot(t testing.TB) {
	t.Helper()
	testsuite.Require(t, os.Geteuid() == 0 && btrfs.Supported(context.Background()) == nil, "needs root and btrfs")
}

// newNode opens a node under a fresh dir; trust is filled by the caller
// before pulls (it is read at each handshake).
func newNode(t testing.TB, name string, trust StaticTrust) *node {
	t.Helper()
	ctx := context.Background()
	n := &node{name: name, dir: t.TempDir()}
	n.open(t)
	id, err := LoadOrCreateIdentity(filepath.Join(n.dir, "identity"), name)
	if err != nil {
		t.Fatal(err)
	}
	n.id = id
	n.client.Identity = id
	trust[name] = id.CertPEM
	n.grants = &testGrants{g: StaticGrants{}}
	n.srv, err = NewServer(ServerOptions{Identity: id, Trust: trust, Grants: n.grants, Local: n.local})
	if err != nil {
		t.Fatal(err)
	}
	a, err := n.srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = a.String()
	t.Cleanup(func() {
		n.srv.Close()
		n.close()
		if err := btrfs.Detach(ctx, n.root()); err != nil {
			t.Errorf("detach %s: %v", n.root(), err)
		}
	})
	return n
}

// testGrants are a node's StaticGrants, added to by the test between
// pulls.
type testGrants struct {
	mu sync.Mutex
	g  StaticGrants
}

func (g *testGrants) MayPull(ctx context.Context, node, checkpoint string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.g.MayPull(ctx, node, checkpoint)
}

// grant lets node to pull the checkpoints ids from n.
func (n *node) grant(to *node, ids ...string) {
	n.grants.mu.Lock()
	defer n.grants.mu.Unlock()
	n.grants.g[to.name] = append(n.grants.g[to.name], ids...)
}

func (n *node) root() string { return filepath.Join(n.dir, "snaps") }

func (n *node) open(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	s, err := btrfs.Open(ctx, n.root(), btrfs.Options{LoopSize: 1 << 30})
	if err != nil {
		t.Fatalf("btrfs.Open: %v", err)
	}
	st, err := store.Open(ctx, filepath.Join(n.dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	n.snaps, n.ledger = s, st
	n.local = &Local{Snaps: s, MemRoot: filepath.Join(n.dir, "memimages"), Ledger: storeLedger{st}}
	n.client = &Client{Identity: n.id, Local: n.local}
	if n.srv != nil {
		n.srv.o.Local = n.local
	}
}

func (n *node) close() {
	n.snaps.Close()
	n.ledger.Close()
}

func (n *node) peer() Peer { return Peer{Node: n.name, Endpoint: n.addr, CertPEM: n.id.CertPEM} }

// write makes active snapshot key (from parent) if needed and writes
// size random bytes to file in it.
func (n *node) write(t testing.TB, key, parent, file string, size int) []byte {
	t.Helper()
	ctx := context.Background()
	if _, err := n.snaps.Stat(ctx, key); errdefs.IsNotFound(err) {
		if err := n.snaps.Prepare(ctx, key, parent); err != nil {
			t.Fatal(err)
		}
	}
	b := make([]byte, size)
	rand.Read(b)
	if err := os.WriteFile(filepath.Join(n.root(), "active", key, "upper", file), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// checkpoint commits key as checkpoint id and records it.
func (n *node) checkpoint(t testing.TB, id, key string, memory bool) {
	t.Helper()
	ctx := context.Background()
	if err := n.snaps.Commit(ctx, id, key); err != nil {
		t.Fatal(err)
	}
	kind := "filesystem"
	if memory {
		kind = "filesystem+memory"
		dir := filepath.Join(n.local.MemRoot, id, "mem")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, size := range map[string]int{"checkpoint.img": 3 << 20, "pages.img": 1 << 20} {
			b := make([]byte, size)
			rand.Read(b)
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(n.local.MemRoot, id, "config.json"), []byte(`{}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.ledger.AddCheckpoint(ctx, &store.Checkpoint{ID: id, SandboxID: key, Tag: id, Kind: kind, Image: "busybox", Runtime: "gvisor"}); err != nil {
		t.Fatal(err)
	}
}

func (n *node) uuid(t testing.TB, id string) string {
	t.Helper()
	in, err := btrfs.Subvolume(n.snaps.CommittedPath(id))
	if err != nil {
		t.Fatal(err)
	}
	return in.Origin()
}

// requireNothing checks that node n holds nothing of checkpoint id: no
// snapshot, no data dir, no ledger record, no memory image or staging.
func (n *node) requireNothing(t testing.TB, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := n.snaps.Stat(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("%s: snapshot %s: got %v, want NotFound", n.name, id, err)
	}
	if _, err := os.Lstat(n.snaps.CommittedPath(id)); !os.IsNotExist(err) {
		t.Errorf("%s: data dir of %s: got %v, want none", n.name, id, err)
	}
	if _, err := n.ledger.GetCheckpoint(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("%s: ledger record of %s: got %v, want NotFound", n.name, id, err)
	}
	ents, _ := os.ReadDir(n.local.MemRoot)
	for _, e := range ents {
		if e.Name() == id || bytes.HasPrefix([]byte(e.Name()), []byte(stagingPrefix)) {
			t.Errorf("%s: memory images hold %s", n.name, e.Name())
		}
	}
}

// requireHeld checks that n holds id read-only, with file's content.
func (n *node) requireHeld(t testing.TB, id, file string, want []byte) {
	t.Helper()
	ctx := context.Background()
	if !n.local.Holds(ctx, id) {
		t.Fatalf("%s does not hold %s", n.name, id)
	}
	got, err := os.ReadFile(filepath.Join(n.snaps.CommittedPath(id), "upper", file))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s: %s/%s: got %d bytes (%v), want the %d written", n.name, id, file, len(got), err, len(want))
	}
	if err := os.WriteFile(filepath.Join(n.snaps.CommittedPath(id), "upper", "w"), nil, 0o644); err == nil {
		t.Fatalf("%s: a write into received %s: got nil, want EROFS", n.name, id)
	}
}
