package network

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeForwarding points the forwarding switch and its record at temporary
// files, so the test needs no root and leaves the host's sysctl alone.
func fakeForwarding(t *testing.T, initial string) (read func() string) {
	t.Helper()
	dir := t.TempDir()
	oldDir, oldPath := forwardDir, forwardPath
	forwardDir, forwardPath = filepath.Join(dir, "ip_forward.d"), filepath.Join(dir, "ip_forward")
	t.Cleanup(func() { forwardDir, forwardPath = oldDir, oldPath })
	if err := os.WriteFile(forwardPath, []byte(initial+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() string {
		b, err := os.ReadFile(forwardPath)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
}

func fakeManager(table string) *Manager {
	return &Manager{cfg: Config{Table: table}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// TestForwardingRestoredByLastHolder: forwarding switched on by two
// networks stays on until both are destroyed, then goes back to 0.
func TestForwardingRestoredByLastHolder(t *testing.T) {
	read := fakeForwarding(t, "0")
	a, b := fakeManager("a"), fakeManager("b")
	for _, m := range []*Manager{a, b, a} {
		if err := m.enableForwarding(); err != nil {
			t.Fatal(err)
		}
	}
	if got := read(); got != "1" {
		t.Fatalf("after enable: ip_forward = %s, want 1", got)
	}
	if err := a.releaseForwarding(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "1" {
		t.Errorf("after the first of two holders let go: ip_forward = %s, want 1 (b still needs it)", got)
	}
	if err := b.releaseForwarding(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "0" {
		t.Errorf("after the last holder let go: ip_forward = %s, want 0 (restored)", got)
	}
	left, _ := os.ReadDir(forwardDir)
	for _, e := range left {
		if e.Name() != "lock" {
			t.Errorf("record left behind: %s", e.Name())
		}
	}
	// A second release, or one by a network that never needed it, changes nothing.
	os.WriteFile(forwardPath, []byte("1\n"), 0o644)
	if err := b.releaseForwarding(); err != nil || read() != "1" {
		t.Errorf("release without a hold: ip_forward = %s, %v; want 1 untouched", read(), err)
	}
}

// TestForwardingAlreadyOnIsKept: a host that forwarded before forkbox keeps
// forwarding after it.
func TestForwardingAlreadyOnIsKept(t *testing.T) {
	read := fakeForwarding(t, "1")
	m := fakeManager("a")
	if err := m.enableForwarding(); err != nil {
		t.Fatal(err)
	}
	if err := m.releaseForwarding(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "1" {
		t.Errorf("ip_forward = %s, want 1 (it was on before)", got)
	}
}

// TestForwardingSurvivesRestart: the record outlives the Manager that made
// it (a daemon restart), and the next Manager of the same table restores it.
func TestForwardingSurvivesRestart(t *testing.T) {
	read := fakeForwarding(t, "0")
	if err := fakeManager("a").enableForwarding(); err != nil {
		t.Fatal(err)
	}
	if err := fakeManager("a").releaseForwarding(); err != nil { // the restarted daemon uninstalls
		t.Fatal(err)
	}
	if got := read(); got != "0" {
		t.Errorf("ip_forward = %s after the restarted daemon's uninstall, want 0", got)
	}
}

// TestForwardingSwitchedOffUnderUs: something else on the host switches
// forwarding off while a Manager holds it; the Manager's next need for it
// switches it on again, and its release still restores the host's value.
func TestForwardingSwitchedOffUnderUs(t *testing.T) {
	read := fakeForwarding(t, "0")
	m := fakeManager("a")
	if err := m.enableForwarding(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(forwardPath, []byte("0\n"), 0o644)
	if err := m.enableForwarding(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "1" {
		t.Fatalf("after enable with forwarding switched off: ip_forward = %s, want 1", got)
	}
	if err := m.releaseForwarding(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "0" {
		t.Errorf("after release: ip_forward = %s, want 0", got)
	}
}
