package runsc

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkImagePageLoad is what a restore's page load costs the host, the
// two ways forkbox's runsc build can do it (scripts/gvisor/restore-pwrite.patch):
// 64 MiB of a memory image in the page cache read, 256 KB at a time, into a
// fresh memfd (a sandbox's memory file) through a shared mapping of it
// (upstream gVisor: each page faults in the kernel's copy and is zeroed
// first), or copied into the memfd with pwrite through a buffer. Run with
// `go test ./internal/runtime/runsc -run - -bench ImagePageLoad`.
func BenchmarkImagePageLoad(b *testing.B) {
	const size, chunk = 64 << 20, 256 << 10
	img := filepath.Join(b.TempDir(), "pages.img")
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(img, data, 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(img)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	src := int(f.Fd())
	memfd := func(b *testing.B) int {
		fd, err := unix.MemfdCreate("bench", unix.MFD_CLOEXEC)
		if err == nil {
			err = unix.Ftruncate(fd, size)
		}
		if err != nil {
			b.Fatal(err)
		}
		return fd
	}
	check := func(b *testing.B, fd int) {
		got := make([]byte, 4096)
		if _, err := unix.Pread(fd, got, size-4096); err != nil || got[17] != data[size-4096+17] {
			b.Fatalf("the memfd's last page is not the image's (%v)", err)
		}
		unix.Close(fd)
	}
	b.Run("mapping", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			fd := memfd(b)
			m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				b.Fatal(err)
			}
			for off := 0; off < size; off += chunk {
				if _, err := unix.Pread(src, m[off:off+chunk], int64(off)); err != nil {
					b.Fatal(err)
				}
			}
			unix.Munmap(m)
			check(b, fd)
		}
	})
	b.Run("pwrite", func(b *testing.B) {
		b.SetBytes(size)
		buf := make([]byte, chunk)
		for b.Loop() {
			fd := memfd(b)
			for off := 0; off < size; off += chunk {
				if _, err := unix.Pread(src, buf, int64(off)); err != nil {
					b.Fatal(err)
				}
				if _, err := unix.Pwrite(fd, buf, int64(off)); err != nil {
					b.Fatal(err)
				}
			}
			check(b, fd)
		}
	})
}
