package network

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// dumpTries bounds how often a netlink dump is asked again when the kernel
// says the table changed under it.
const dumpTries = 10

// dump runs a netlink dump (links, addresses, conntrack entries) again
// when it was interrupted: the kernel sets NLM_F_DUMP_INTR when the table
// changed while it was read (another sandbox's veth coming or going, on a
// busy host), and the result may then miss entries. A fresh dump is
// consistent unless the table changes again; after dumpTries the error is
// returned.
func dump[T any](f func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range dumpTries {
		if v, err = f(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}
