package daemon

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// TestAgentEnv: the agent's configuration opens every sandbox's
// environment and nothing of the image's or the caller's can stand in for
// it (crun's agent takes the first of a duplicated name, runsc keeps one
// of them): a hostile image's FORKBOX_ variables are dropped (its token
// would leave the daemon locked out of its own sandbox, its pids limit of
// 0 would lift the tenant's), a caller's are refused. Under a runsc that
// enforces the memory limit the agent is told so (its watchdog becomes a
// slower backstop); under a stock runsc and crun nothing changes.
func TestAgentEnv(t *testing.T) {
	h := newHarness(t)
	h.importImageEnv("hostile:1", []string{"FORKBOX_AGENT_TOKEN=known", "FORKBOX_PIDS_LIMIT=0",
		"FORKBOX_MEMORY_ENFORCER=sentry", "FORKBOX_MEMORY_LIMIT=0", "PATH=/bin"})
	const mem, pids = 64 << 20, 50
	check := func(what, rt string, enforcer bool) {
		t.Helper()
		id := h.create(CreateOptions{Image: "hostile:1", Runtime: rt, Memory: "64Mi", Pids: pids, Env: map[string]string{"MINE": "1"}})
		sb, err := h.d.store.GetSandbox(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		s, err := spec.ReadBundle(h.d.bundleDir(id))
		if err != nil {
			t.Fatal(err)
		}
		limit, agentPids := int64(0), int64(pids)
		if rt == RuntimeGVisor {
			limit = mem
		} else {
			agentPids = 0
		}
		want := []string{agent.EnvAddr + "=:" + strconv.Itoa(agentPort), agent.EnvToken + "=" + sb.AgentToken,
			agent.EnvMemoryLimit + "=" + strconv.FormatInt(limit, 10), agent.EnvPidsLimit + "=" + strconv.FormatInt(agentPids, 10)}
		if enforcer {
			want = append(want, agent.EnvMemoryEnforcer+"=sentry")
		}
		env := s.Process.Env
		if len(env) < len(want) || !slices.Equal(env[:len(want)], want) {
			t.Errorf("%s: the environment begins %q, want %q", what, env, want)
		}
		for _, kv := range env[min(len(want), len(env)):] {
			if strings.HasPrefix(kv, "FORKBOX_") {
				t.Errorf("%s: %q follows the agent's configuration", what, kv)
			}
		}
		for _, kv := range []string{"PATH=/bin", "MINE=1"} {
			if !slices.Contains(env, kv) {
				t.Errorf("%s: %q is missing from %q", what, kv, env)
			}
		}
	}
	check("gvisor, patched runsc", RuntimeGVisor, true)
	check("crun", RuntimeCrun, false)
	h.w.noMemoryLimitPatch = true
	check("gvisor, stock runsc", RuntimeGVisor, false)

	_, err := h.d.Create(context.Background(), CreateOptions{Image: "unit:1", Env: map[string]string{"FORKBOX_PIDS_LIMIT": "0"}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("a caller's FORKBOX_PIDS_LIMIT: %v, want InvalidArgument (reserved)", err)
	}
}
