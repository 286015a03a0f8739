package network

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// What these tests make on the host, by name (helpers_test.go,
// egress_test.go): bridges fbt<pid>-<n>, uplinks fbu<pid>, sandbox veths
// ft<nn><hash>, nftables tables forkbox_test_<pid>_<n> and their
// forwarding holders, and netns files of sandbox ids t<pid>-<name> and
// "outside" uplinks under the test's temp dir.
var (
	staleLink  = regexp.MustCompile(`^(fbt\d+-\d+|fbu\d+|ft\d\d[0-9a-f]+)$`)
	staleTable = regexp.MustCompile(`^forkbox_test_\d+_\d+$`)
	staleNetns = regexp.MustCompile(`^/tmp/Test[^/]+/\d+/(netns/t\d+-[^/]+|outside)$`)
)

// sweepStale removes what a killed run of these tests left. Only call it
// holding hostLock: then no run that made these is alive.
func sweepStale() error {
	var errs []error
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if name := l.Attrs().Name; staleLink.MatchString(name) {
			if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete link %s: %w", name, err))
			} else {
				fmt.Fprintf(os.Stderr, "network tests: removed link %s of a killed run\n", name)
			}
		}
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	for _, t := range tables {
		if staleTable.MatchString(t.Name) {
			c.DelTable(t)
			fmt.Fprintf(os.Stderr, "network tests: removed table %s of a killed run\n", t.Name)
			if err := os.Remove(filepath.Join(forwardDir, "holder-"+t.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("delete tables: %w", err))
	}
	mounts, err := nsfsMounts()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, m := range mounts {
		if staleNetns.MatchString(m) {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errors.Join(errs...)
}

// nsfsMounts lists this mount namespace's nsfs mount points.
func nsfsMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "nsfs ") {
			continue
		}
		if fs := strings.Fields(pre); len(fs) >= 5 {
			out = append(out, fs[4])
		}
	}
	return out, sc.Err()
}
