// Command probe is a hostile tenant's toolbox for the e2e suite: copied
// into a sandbox, it tries escapes and privileged operations with raw
// syscalls and prints one line per attempt, "<name> denied <errno>" or
// "<name> ALLOWED <detail>". The suite asserts that every attempt is denied.
//
//	probe escapes HOSTDEVMAJOR HOSTDEVMINOR   privileged syscalls and files
//	probe dial ADDR...                        TCP connects (2 s each, in parallel)
//	probe lookup NAME...                      DNS lookups through /etc/resolv.conf
//	probe dnsflood SERVER COUNT NAME          COUNT A queries at once over UDP, then a 600-byte one (over the proxy's 512)
//	probe alloc MB                            maps and touches MB MiB in one mapping, as fast as it can
//	probe pattern MB OUT                      holds MB MiB of known pages and checks them on SIGUSR1 (pattern.go)
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe escapes MAJOR MINOR | probe dial ADDR...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "escapes":
		maj, _ := strconv.Atoi(arg(2))
		min, _ := strconv.Atoi(arg(3))
		escapes(uint32(maj), uint32(min))
	case "dial":
		dial(os.Args[2:])
	case "lookup":
		lookup(os.Args[2:])
	case "dnsflood":
		n, _ := strconv.Atoi(arg(3))
		dnsFlood(arg(2), n, arg(4))
	case "alloc":
		mb, _ := strconv.Atoi(arg(2))
		alloc(mb, unix.MAP_PRIVATE)
	case "shared":
		mb, _ := strconv.Atoi(arg(2))
		alloc(mb, unix.MAP_SHARED)
	case "pattern":
		mb, _ := strconv.Atoi(arg(2))
		pattern(mb, arg(3))
	case "hold":
		mb, _ := strconv.Atoi(arg(2))
		alloc(mb, unix.MAP_PRIVATE)
		for { // holds it until killed
			unix.Pause()
		}
	default:
		os.Exit(2)
	}
}

// alloc maps mb MiB of private anonymous memory and writes one byte per
// page, with no pause and no allocator in between: the fastest way for a
// tenant to take memory. It prints "allocated MB" when it got all of it.
// "hold MB" does the same and then keeps it until it is killed. "shared
// MB" maps it shared (gVisor backs that with a tmpfs file): memory gVisor
// charges to the sandbox but lets a fault allocate past its limit.
func alloc(mb, share int) {
	n := mb << 20
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, share|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Println("alloc denied", err)
		os.Exit(3)
	}
	for i := 0; i < n; i += os.Getpagesize() {
		b[i] = 1
	}
	fmt.Println("allocated", mb)
}

func arg(i int) string {
	if i < len(os.Args) {
		return os.Args[i]
	}
	return "0"
}

func report(name string, err error, detail string) {
	if err != nil {
		fmt.Printf("%s denied %v\n", name, err)
		return
	}
	fmt.Printf("%s ALLOWED %s\n", name, detail)
}

// writeFile opens path for writing and writes data, returning the first error.
func writeFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write(data)
	return err
}

// sentryLocal are the files that gVisor's sentry virtualises (its own
// cgroupfs and netstack), with the distinct value the probe writes to them.
var sentryLocal = map[string]string{
	"/sys/fs/cgroup/memory/memory.limit_in_bytes": "1234567168\n",
	"/sys/fs/cgroup/cpu/cpu.cfs_quota_us":         "12345\n",
	"/proc/sys/net/ipv4/ip_forward":               "0\n",
}

func escapes(maj, min uint32) {
	os.MkdirAll("/tmp/probe-mnt", 0o755)
	report("mount-tmpfs", unix.Mount("tmpfs", "/tmp/probe-mnt", "tmpfs", 0, ""), "tmpfs mounted")
	report("mount-proc-remount-rw", unix.Mount("", "/proc/sys", "", unix.MS_REMOUNT|unix.MS_BIND, ""), "/proc/sys remounted rw")
	for _, ns := range []struct {
		name string
		flag int
	}{{"unshare-user", unix.CLONE_NEWUSER}, {"unshare-mount", unix.CLONE_NEWNS}, {"unshare-net", unix.CLONE_NEWNET}, {"unshare-pid", unix.CLONE_NEWPID}} {
		// In a fresh thread that is never reused: a successful unshare
		// must not change the rest of the probe.
		done := make(chan error)
		go func() {
			lockOSThreadForever()
			done <- unix.Unshare(ns.flag)
		}()
		report(ns.name, <-done, "new namespace created")
	}
	report("setns-init-mnt", setns("/proc/1/ns/mnt"), "joined pid 1's mount namespace")
	report("ptrace-attach-init", unix.PtraceAttach(1), "attached to pid 1")
	if err := unix.PtraceAttach(1); err == nil {
		unix.PtraceDetach(1)
	}
	report("write-proc1-mem", writeProcMem(), "wrote pid 1's memory")
	// Each file gets its own value back (where it can be read): the point
	// is whether the write is let through, not to break the sandbox.
	for _, p := range []string{"/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname",
		"/proc/sys/net/ipv4/ip_forward", "/proc/sysrq-trigger", "/sys/kernel/uevent_helper",
		"/sys/kernel/mm/transparent_hugepage/enabled", "/sys/class/net/eth0/mtu",
		"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"} {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			data = []byte("0\n")
		}
		if v, ok := sentryLocal[p]; ok && os.Getenv("PROBE_SENTRY_LOCAL") == "1" {
			// gVisor serves these files from its own kernel: a write is
			// let through but changes only the sentry's copy. Write a value
			// unlike the host's, so the test can check the host kept its own.
			if err := writeFile(p, []byte(v)); err == nil {
				fmt.Printf("%s sentry-local wrote %q\n", "write"+p, v)
				continue
			}
		}
		report("write"+p, writeFile(p, data), "written (its own value back)")
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	report("socket-raw-inet", err, "raw IPv4 socket")
	if err == nil {
		unix.Close(fd)
	}
	fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	report("socket-packet", err, "AF_PACKET socket")
	if err == nil {
		unix.Close(fd)
	}
	// A network change: a new address or MAC on eth0 (needs CAP_NET_ADMIN).
	report("set-mac", setMAC("eth0"), "eth0's MAC changed")
	// The host's root disk, made as a device node (CAP_MKNOD is granted;
	// the device cgroup or the sentry must refuse opening it).
	dev := "/tmp/probe-hostdisk"
	os.Remove(dev)
	if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(maj, min))); err != nil {
		report("open-host-disk", err, "")
	} else {
		f, err := os.Open(dev)
		detail := ""
		if err == nil {
			b := make([]byte, 512)
			n, rerr := f.Read(b)
			f.Close()
			err = rerr
			detail = fmt.Sprintf("read %d bytes of block device %d:%d", n, maj, min)
		}
		report("open-host-disk", err, detail)
	}
	os.Remove(dev)
	for _, p := range []string{"/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg"} {
		f, err := os.Open(p)
		if err == nil {
			f.Close()
		}
		report("open"+p, err, "opened")
	}
	report("init-module", initModule(), "reached the module loader")
	report("open-by-handle", openByHandle(), "passed the capability check (EFAULT on a bad handle)")
	_, _, e := unix.Syscall(unix.SYS_BPF, 5 /* BPF_PROG_LOAD */, 0, 0)
	report("bpf", errnoErr(e, unix.EFAULT), "reached bpf(2)")
	_, _, e = unix.Syscall(unix.SYS_KEYCTL, 0 /* GET_KEYRING_ID */, ^uintptr(3) /* SESSION */, 0)
	report("keyctl", errnoErr(e, 0), "reached the kernel keyring")
	report("settimeofday", unix.Settimeofday(&unix.Timeval{Sec: 0}), "set the clock")
	report("sethostname-after-uts", unix.Sethostname([]byte("probe-host")), "")
}

// errnoErr is e as an error; ok (a harmless errno showing the syscall ran)
// counts as allowed.
func errnoErr(e unix.Errno, ok unix.Errno) error {
	if e == 0 || e == ok {
		return nil
	}
	return e
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func lockOSThreadForever() { runtimeLockOSThread() }

func setns(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	done := make(chan error)
	go func() {
		lockOSThreadForever()
		done <- unix.Setns(int(f.Fd()), unix.CLONE_NEWNS)
	}()
	return <-done
}

// writeProcMem writes one byte of pid 1's memory, back with its own value.
func writeProcMem() error {
	maps, err := os.ReadFile("/proc/1/maps")
	if err != nil {
		return err
	}
	var start uint64
	if _, err := fmt.Sscanf(string(maps), "%x-", &start); err != nil {
		return fmt.Errorf("parse maps: %v", err)
	}
	f, err := os.OpenFile("/proc/1/mem", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, int64(start)); err != nil {
		return err
	}
	_, err = f.WriteAt(b, int64(start))
	return err
}

func setMAC(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFHWADDR, ifr); err != nil {
		return err
	}
	raw := (*[unix.IFNAMSIZ + 24]byte)(unsafe.Pointer(ifr))
	mac := raw[unix.IFNAMSIZ+2 : unix.IFNAMSIZ+8]
	mac[5] ^= 0x01
	return unix.IoctlIfreq(fd, unix.SIOCSIFHWADDR, ifr)
}

// initModule calls init_module(2) with no module: EPERM (no
// CAP_SYS_MODULE or seccomp) or ENOSYS is a refusal; EFAULT means the
// capability check passed.
func initModule() error {
	_, _, e := unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)
	if e != unix.EFAULT && e != 0 {
		return e
	}
	return nil
}

// openByHandle calls open_by_handle_at(2) with a bad handle: EPERM (no
// CAP_DAC_READ_SEARCH), or ENOSYS/EOPNOTSUPP (not implemented), is a
// refusal; EFAULT means the capability check passed.
func openByHandle() error {
	cwd := unix.AT_FDCWD
	_, _, e := unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, uintptr(cwd), 0, 0)
	if e != unix.EFAULT && e != 0 {
		return e
	}
	return nil
}

// lookup resolves each name (the pure Go resolver: /etc/resolv.conf) and
// prints "lookup-NAME ok ADDR,..." or "lookup-NAME denied ERROR".
func lookup(names []string) {
	for _, n := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := net.DefaultResolver.LookupHost(ctx, n)
		cancel()
		if err != nil {
			fmt.Printf("lookup-%s denied %v\n", n, err)
			continue
		}
		sort.Strings(addrs)
		fmt.Printf("lookup-%s ok %s\n", n, strings.Join(addrs, ","))
	}
}

// dnsFlood sends count queries for name to server (ip:port) as fast as it
// can, then one too big for a DNS server's 512-byte buffer, and prints
// "dnsflood sent N noerror X refused Y other Z silent S span_ms T", T the
// time from the first query to the last answer (a rate limiter's bound
// depends on it).
func dnsFlood(server string, count int, name string) {
	c, err := net.Dial("udp", server)
	if err != nil {
		fmt.Printf("dnsflood denied %v\n", err)
		return
	}
	defer c.Close()
	start := time.Now()
	for i := range count {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		m.Id = uint16(i)
		b, _ := m.Pack()
		c.Write(b)
	}
	big := new(dns.Msg)
	big.SetQuestion(dns.Fqdn(name), dns.TypeA)
	big.Id = uint16(count)
	big.Extra = append(big.Extra, &dns.TXT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeTXT, Class: dns.ClassINET},
		Txt: []string{strings.Repeat("x", 250), strings.Repeat("y", 250), strings.Repeat("z", 90)}})
	b, _ := big.Pack()
	c.Write(b)
	counts := map[int]int{}
	got := 0
	last := start
	buf := make([]byte, 4096)
	for got < count+1 {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			break
		}
		r := new(dns.Msg)
		if r.Unpack(buf[:n]) != nil {
			continue
		}
		got++
		counts[r.Rcode]++
		last = time.Now()
	}
	fmt.Printf("dnsflood sent %d noerror %d refused %d other %d silent %d span_ms %d\n", count+1, counts[dns.RcodeSuccess],
		counts[dns.RcodeRefused], got-counts[dns.RcodeSuccess]-counts[dns.RcodeRefused], count+1-got, last.Sub(start).Milliseconds())
}

func dial(addrs []string) {
	type res struct{ addr, line string }
	var mu sync.Mutex
	var out []res
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Add(1)
		go func(a string) {
			defer wg.Done()
			// 5 s: an allowed dial whose first SYN is lost on a loaded
			// host is retried at 1 s and 3 s; a denied one (dropped)
			// costs the whole wait, once per run (the dials are parallel).
			c, err := net.DialTimeout("tcp", a, 5*time.Second)
			line := ""
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					err = errors.New("timeout")
				}
				line = fmt.Sprintf("dial-%s denied %v", a, err)
			} else {
				c.Close()
				line = fmt.Sprintf("dial-%s ALLOWED connected", a)
			}
			mu.Lock()
			out = append(out, res{a, line})
			mu.Unlock()
		}(a)
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].addr < out[j].addr })
	for _, r := range out {
		fmt.Println(r.line)
	}
}
