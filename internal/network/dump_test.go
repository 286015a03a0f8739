package network

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

// An interrupted dump is asked again until it is whole, at most dumpTries
// times; other errors are returned at once.
func TestDumpRetriesInterrupted(t *testing.T) {
	calls := 0
	v, err := dump(func() (int, error) {
		calls++
		if calls < 3 {
			return calls, netlink.ErrDumpInterrupted
		}
		return calls, nil
	})
	if err != nil || v != 3 || calls != 3 {
		t.Errorf("interrupted twice: got %d, %v after %d calls; want 3, nil after 3", v, err, calls)
	}
	calls = 0
	_, err = dump(func() (int, error) { calls++; return 0, netlink.ErrDumpInterrupted })
	if !errors.Is(err, netlink.ErrDumpInterrupted) || calls != dumpTries {
		t.Errorf("always interrupted: got %v after %d calls; want ErrDumpInterrupted after %d", err, calls, dumpTries)
	}
	calls = 0
	other := errors.New("no")
	if _, err = dump(func() (int, error) { calls++; return 0, other }); err != other || calls != 1 {
		t.Errorf("another error: got %v after %d calls; want it after 1", err, calls)
	}
}
