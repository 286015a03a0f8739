package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/store"
)

// allocNet is a netManager that only allocates addresses (with the real
// allocator, in the default /16); reserve uses nothing else.
type allocNet struct{ netManager }

func (allocNet) AllocateFunc(last netip.Addr, taken network.Taken) (netip.Addr, error) {
	return network.AllocateFunc(network.DefaultSubnet, last, taken)
}

// BenchmarkReserve is what every create and fork child pays under the
// daemon's allocation lock, with 10 and with 1,000 live sandboxes
// recorded: the live-sandbox limit, an address, and the record.
//
//	go test ./internal/daemon -run - -bench Reserve
func BenchmarkReserve(b *testing.B) {
	for _, live := range []int{10, 1000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) { benchReserve(b, live) })
	}
}

func benchReserve(b *testing.B, live int) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(b.TempDir(), "forkbox.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	d := &Daemon{cfg: Config{MaxSandboxes: 100000}, store: st, net: allocNet{}}
	n := 0
	record := func() *store.Sandbox {
		n++
		sb := &store.Sandbox{ID: fmt.Sprintf("sb-%012d", n), Name: fmt.Sprintf("n%d", n), State: store.StateRunning,
			Image: "img", Runtime: RuntimeGVisor, Config: store.SandboxConfig{Egress: "none", Env: map[string]string{"A": "b"}}}
		if err := d.reserve(ctx, sb, false, nil); err != nil {
			b.Fatal(err)
		}
		return sb
	}
	for range live {
		record()
	}
	b.ResetTimer()
	for b.Loop() {
		sb := record()
		b.StopTimer()
		if err := st.SwapSandboxState(ctx, sb.ID, store.StateRunning, store.StateClosed, ""); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
