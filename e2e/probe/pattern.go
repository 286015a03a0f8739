package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// pattern maps mb MiB of private anonymous memory in which every third
// page holds data derived from its index, the next one had a zero written
// to it, and the third was never touched, so a memory image holds data
// pages, zero pages and pages never allocated side by side. It writes
// "ready" to out, then on every SIGUSR1 checks each page against what it
// should hold and writes "check N ok" or "check N BAD page P" to out (a
// rename: a reader sees a whole line). N counts the checks, so a process
// restored from a memory image continues the source's count.
func pattern(mb int, out string) {
	page := os.Getpagesize()
	n := mb << 20
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pattern: mmap:", err)
		os.Exit(3)
	}
	for p := 0; p < n/page; p++ {
		pg := b[p*page : (p+1)*page]
		switch p % 3 {
		case 0:
			fill(pg, p)
		case 1:
			pg[page/2] = 0 // touched, still zero
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	writeLine(out, "ready")
	for check := 1; ; check++ {
		<-sig
		bad := -1
		want := make([]byte, page)
		for p := 0; p < n/page && bad < 0; p++ {
			clear(want)
			if p%3 == 0 {
				fill(want, p)
			}
			if string(b[p*page:(p+1)*page]) != string(want) {
				bad = p
			}
		}
		if bad >= 0 {
			writeLine(out, fmt.Sprintf("check %d BAD page %d", check, bad))
		} else {
			writeLine(out, fmt.Sprintf("check %d ok", check))
		}
	}
}

// fill writes page index p's data: no byte of it is zero.
func fill(pg []byte, p int) {
	x := uint64(p)*0x9E3779B97F4A7C15 | 1
	for i := 0; i+8 <= len(pg); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(pg[i:], x|0x0101010101010101)
	}
}

func writeLine(out, line string) {
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, []byte(line+"\n"), 0o644); err == nil {
		_ = os.Rename(tmp, out)
	}
}
