package agent

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// How the agent applies the pids limit (Config.PidsLimit) between fork and
// exec. Go's ForkExec runs no code of ours in the child, so the child first
// execs a helper that sets RLIMIT_NPROC and then execs the command in place
// (same pid, process group, stdio).
//
// On amd64 the helper is a 200-byte static ELF program (no libc, no Go
// runtime; limitHelperCode below) that the agent writes at start into a
// sealed memfd: prctl(PR_SET_DUMPABLE, 0), prlimit64(0, RLIMIT_NPROC,
// {N, N}) with N built into the program, execve(argv[0], argv+1, envp);
// exit 126 if the limit cannot be set, 127 if the execve fails. Its execve
// costs well under a millisecond under gVisor; the agent's own Go binary in
// helper mode ("exec-limited N BIN ARGV...", the fallback on other
// architectures or where a memfd cannot be made) costs about 10 ms (the Go
// runtime's start). The memfd is reachable only through the agent's
// descriptor table (the agent is non-dumpable: no tenant opens /proc/1/fd),
// is close-on-exec (no command inherits it) and sealed against writes. The
// helper makes itself non-dumpable before it sets the limit, so a tenant
// cannot ptrace it in between; the command's execve makes it dumpable again.

// limitHelperCode is the helper's x86-64 machine code, loaded at
// limitHelperBase + len(header). Its last 8 bytes are N.
//
//	mov eax, 157 ; mov edi, 4 ; xor esi, esi ; syscall      prctl(PR_SET_DUMPABLE, 0)
//	mov rax, [rip+0x4b] ; push rax ; push rax                {N, N} on the stack
//	mov eax, 302 ; xor edi, edi ; mov esi, 6                 prlimit64(0, RLIMIT_NPROC,
//	mov rdx, rsp ; xor r10d, r10d ; syscall                            rsp, NULL)
//	test rax, rax ; jnz fail
//	mov rcx, [rsp+16] ; mov rdi, [rsp+24]                    argc; argv[0]
//	lea rsi, [rsp+32] ; lea rdx, [rsp+rcx*8+32]              argv+1; envp
//	mov eax, 59 ; syscall                                    execve
//	mov edi, 127 ; jmp out
//	fail: mov edi, 126
//	out: mov eax, 231 ; syscall                              exit_group
//	xchg ax, ax                                              (pad to 8)
//	limit: .quad N
var limitHelperCode = []byte{
	0xb8, 0x9d, 0x00, 0x00, 0x00, 0xbf, 0x04, 0x00, 0x00, 0x00, 0x31, 0xf6,
	0x0f, 0x05, 0x48, 0x8b, 0x05, 0x4b, 0x00, 0x00, 0x00, 0x50, 0x50, 0xb8,
	0x2e, 0x01, 0x00, 0x00, 0x31, 0xff, 0xbe, 0x06, 0x00, 0x00, 0x00, 0x48,
	0x89, 0xe2, 0x45, 0x31, 0xd2, 0x0f, 0x05, 0x48, 0x85, 0xc0, 0x75, 0x22,
	0x48, 0x8b, 0x4c, 0x24, 0x10, 0x48, 0x8b, 0x7c, 0x24, 0x18, 0x48, 0x8d,
	0x74, 0x24, 0x20, 0x48, 0x8d, 0x54, 0xcc, 0x20, 0xb8, 0x3b, 0x00, 0x00,
	0x00, 0x0f, 0x05, 0xbf, 0x7f, 0x00, 0x00, 0x00, 0xeb, 0x05, 0xbf, 0x7e,
	0x00, 0x00, 0x00, 0xb8, 0xe7, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x66, 0x90,
	0, 0, 0, 0, 0, 0, 0, 0, // N
}

const (
	limitHelperBase = 0x400000
	elfHeaderLen    = 64
	progHeaderLen   = 56
)

// limitHelperELF returns the helper program with limit n built in: an
// ELF64 executable of one read+execute PT_LOAD segment, the whole file.
func limitHelperELF(n uint64) []byte {
	code := append([]byte(nil), limitHelperCode...)
	binary.LittleEndian.PutUint64(code[len(code)-8:], n)
	size := uint64(elfHeaderLen + progHeaderLen + len(code))
	b := make([]byte, 0, size)
	le := binary.LittleEndian
	b = append(b, 0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* LE */, 1 /* version */, 0 /* SYSV */, 0, 0, 0, 0, 0, 0, 0, 0)
	b = le.AppendUint16(b, 2)    // ET_EXEC
	b = le.AppendUint16(b, 0x3e) // EM_X86_64
	b = le.AppendUint32(b, 1)
	b = le.AppendUint64(b, limitHelperBase+elfHeaderLen+progHeaderLen) // entry
	b = le.AppendUint64(b, elfHeaderLen)                               // phoff
	b = le.AppendUint64(b, 0)                                          // shoff
	b = le.AppendUint32(b, 0)                                          // flags
	b = le.AppendUint16(b, elfHeaderLen)
	b = le.AppendUint16(b, progHeaderLen)
	b = le.AppendUint16(b, 1) // phnum
	b = le.AppendUint16(b, 0) // shentsize
	b = le.AppendUint16(b, 0) // shnum
	b = le.AppendUint16(b, 0) // shstrndx
	b = le.AppendUint32(b, 1) // PT_LOAD
	b = le.AppendUint32(b, 5) // PF_R|PF_X
	b = le.AppendUint64(b, 0) // offset
	b = le.AppendUint64(b, limitHelperBase)
	b = le.AppendUint64(b, limitHelperBase)
	b = le.AppendUint64(b, size) // filesz
	b = le.AppendUint64(b, size) // memsz
	b = le.AppendUint64(b, 0x1000)
	return append(b, code...)
}

// limitHelper is the helper of one agent: an executable path valid in the
// agent's children until their execve.
type limitHelper struct {
	f    *os.File
	path string
}

// newLimitHelper writes the helper for limit n into a sealed memfd.
func newLimitHelper(n int64) (*limitHelper, error) {
	if !limitHelperNative {
		return nil, fmt.Errorf("pids limit helper: no native helper for this architecture: %w", errdefs.ErrNotImplemented)
	}
	const flags = unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate("forkbox-limit", flags|unix.MFD_EXEC)
	if err == unix.EINVAL { // kernels (and sentries) without MFD_EXEC
		fd, err = unix.MemfdCreate("forkbox-limit", flags)
	}
	if err != nil {
		return nil, osErr("memfd_create", "pids limit helper", err)
	}
	f := os.NewFile(uintptr(fd), "forkbox-limit")
	if _, err := f.Write(limitHelperELF(uint64(n))); err != nil {
		f.Close()
		return nil, osErr("write", "pids limit helper", err)
	}
	if err := unix.Fchmod(fd, 0o500); err != nil {
		f.Close()
		return nil, osErr("chmod", "pids limit helper", err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, osErr("seal", "pids limit helper", err)
	}
	return &limitHelper{f: f, path: "/proc/self/fd/" + strconv.Itoa(fd)}, nil
}

// argv returns what the child execs instead of bin with argv: the helper,
// which sets the limit and execs bin with argv.
func (h *limitHelper) argv(bin string, argv []string) (string, []string) {
	return h.path, append([]string{bin}, argv...)
}
