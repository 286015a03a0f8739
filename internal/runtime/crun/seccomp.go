// The seccomp profile crun sandboxes get on top of runtime/spec's hardening.

package crun

import (
	goruntime "runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// DeniedSyscalls fail with EPERM in a crun sandbox. They are the syscalls
// Docker's default profile keeps from containers without extra
// capabilities: kernel modules and kexec, the kernel keyring, BPF and perf,
// handle-based opens (the "shocker" escape), new namespaces, mounts, tracing
// other processes, userfaultfd, io_uring, clock and system-wide settings.
// Most also need a capability the spec does not grant; the filter stays as
// a second wall against kernel bugs in their permission checks.
var DeniedSyscalls = []string{
	// kernel code and kexec
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	// keyring, BPF, perf
	"add_key", "request_key", "keyctl", "bpf", "perf_event_open",
	// files by handle
	"open_by_handle_at", "name_to_handle_at",
	// namespaces and mounts (clone with namespace flags: see Harden)
	"unshare", "setns", "mount", "umount2", "pivot_root", "mount_setattr",
	"move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
	// other processes' memory
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
	// memory and I/O interfaces with a history of escapes
	"userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
	// system-wide settings
	"reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime",
	"clock_adjtime", "sethostname", "setdomainname", "syslog", "quotactl",
	"quotactl_fd", "lookup_dcookie", "fanotify_init", "nfsservctl", "uselib",
	"vhangup", "iopl", "ioperm", "_sysctl",
}

// namespaceCloneFlags are the clone(2) flags that create namespaces:
// CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET.
var namespaceCloneFlags = []uint64{
	0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
}

// Harden adds forkbox's seccomp profile for crun to s: every syscall is
// allowed except DeniedSyscalls (EPERM), clone with a namespace flag
// (EPERM), and clone3 (ENOSYS, as Docker does: its flags are in memory
// seccomp cannot read, and libc falls back to clone). The profile lists
// only the native architecture, so 32-bit (and x32) syscalls, which would
// get around a deny list, are refused by the kernel filter as a bad arch.
//
// A deny list rather than Docker's allow list: the sandbox runs an agent
// and arbitrary user programs, and a missing entry in an allow list breaks
// them in ways that are hard to see; everything dangerous is either listed
// here or needs a capability the spec drops.
func Harden(s *specs.Spec) {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	eperm, enosys := uint(1), uint(38)
	sc := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: nativeArch(),
		Syscalls: []specs.LinuxSyscall{
			{Names: append([]string(nil), DeniedSyscalls...), Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
	// clone's flags are argument 0 (argument 1 on s390x, not supported).
	// One rule per flag: rules for the same syscall are or-ed.
	for _, f := range namespaceCloneFlags {
		sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{
			Names:    []string{"clone"},
			Action:   specs.ActErrno,
			ErrnoRet: &eperm,
			Args:     []specs.LinuxSeccompArg{{Index: 0, Value: f, ValueTwo: f, Op: specs.OpMaskedEqual}},
		})
	}
	s.Linux.Seccomp = sc
}

func nativeArch() []specs.Arch {
	switch goruntime.GOARCH {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64}
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64}
	}
	return nil // the runtime's native arch
}

// OCIVersion is the newest ociVersion crun 1.8 accepts ("unknown version
// specified" for 1.2.0 and later; runtime-spec v1.3.0 writes 1.3.0). Every
// field runtime/spec and Harden set exists in 1.1.
const OCIVersion = "1.1.0"

// Adapt makes a spec from runtime/spec ready for crun: it pins ociVersion
// to OCIVersion, lowers rlimits this process could not grant (see
// clampRlimits) and applies Harden. The daemon calls it for crun sandboxes
// only.
func Adapt(s *specs.Spec) {
	s.Version = OCIVersion
	clampRlimits(s)
	Harden(s)
}

// clampRlimits lowers each of the spec's rlimits to this process's own hard
// limit when this process lacks CAP_SYS_RESOURCE: crun sets them with
// setrlimit, which then cannot go above the inherited hard limit ("setrlimit
// RLIMIT_NOFILE: Operation not permitted"). Seen on the CI machines: root
// without CAP_SYS_RESOURCE, hard NOFILE 20000 against the spec's 1048576.
// gVisor is not affected (its sentry applies them inside).
func clampRlimits(s *specs.Spec) {
	if s.Process == nil || hasCap(unix.CAP_SYS_RESOURCE) {
		return
	}
	for i, rl := range s.Process.Rlimits {
		res, ok := rlimitResources[rl.Type]
		if !ok {
			continue
		}
		var cur unix.Rlimit
		if unix.Getrlimit(res, &cur) != nil {
			continue
		}
		if rl.Hard > cur.Max {
			s.Process.Rlimits[i].Hard = cur.Max
		}
		if s.Process.Rlimits[i].Soft > s.Process.Rlimits[i].Hard {
			s.Process.Rlimits[i].Soft = s.Process.Rlimits[i].Hard
		}
	}
}

var rlimitResources = map[string]int{
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC,
	"RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK,
	"RLIMIT_STACK": unix.RLIMIT_STACK, "RLIMIT_AS": unix.RLIMIT_AS,
	"RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_DATA": unix.RLIMIT_DATA,
}

// hasCap reports whether this process has capability c in its effective set.
func hasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}
