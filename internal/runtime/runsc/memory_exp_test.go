package runsc

import (
	"context"
	"os"
	"strconv"
	"path/filepath"
	"testing"
	"time"
)

const mfCounter = `exec 3>>/root/held.log; i=0; while true; do i=$((i+1)); echo $i >&3; echo $i > /root/counter; echo "tick=$i host=$(hostname)"; sleep 0.05; done`

func TestExpRootfs(t *testing.T) {
	requireRunsc(t)
	tmp := t.TempDir()
	rt, err := New(Options{Root: filepath.Join(tmp, "state"), LogDir: filepath.Join(tmp, "logs")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	srcRoot := filepath.Join(tmp, "src", "rootfs")
	busyboxRootfs(t, srcRoot)
	src := mfBundle(t, rt, filepath.Join(tmp, "src"), srcRoot, "srchost", testNetns(t), []string{"/bin/sh", "-c", mfCounter})
	if err := rt.Run(ctx, src.id, src.bundle); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	img := filepath.Join(tmp, "img")
	t0 := time.Now()
	if err := rt.Checkpoint(ctx, src.id, img); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint %v", time.Since(t0))
	st, err := rt.State(ctx, src.id)
	t.Logf("source after checkpoint: %+v %v", st, err)
	at := lastInt(filepath.Join(srcRoot, "root/counter"))
	t.Logf("counter file at checkpoint=%d held=%d log=%d", at, lastInt(filepath.Join(srcRoot, "root/held.log")), lastInt(filepath.Join(src.bundle, "stdio.log")))
	ents, _ := os.ReadDir(img)
	for _, e := range ents {
		fi, _ := e.Info()
		t.Logf("image %s %d", e.Name(), fi.Size())
	}
	var kids []*mfBox
	for i, h := range []string{"kid1", "kid2"} {
		d := filepath.Join(tmp, h)
		os.MkdirAll(d, 0o755)
		copyTree(t, srcRoot, filepath.Join(d, "rootfs"))
		hn := h
		if i == 1 {
			hn = "srchost"
		}
		k := mfBundle(t, rt, d, filepath.Join(d, "rootfs"), hn, testNetns(t), []string{"/bin/sh", "-c", mfCounter})
		t0 := time.Now()
		if err := rt.Restore(ctx, k.id, k.bundle, img); err != nil {
			t.Fatalf("restore %s: %v", h, err)
		}
		t.Logf("restore %s %v", h, time.Since(t0))
		kids = append(kids, k)
	}
	// restore source under same id
	if err := rt.Delete(ctx, src.id, true); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := rt.Restore(ctx, src.id, src.bundle, img); err != nil {
		t.Fatalf("restore src: %v", err)
	}
	t.Logf("restore src same id %v", time.Since(t0))
	time.Sleep(time.Second)
	for _, b := range append(kids, src) {
		log, _ := os.ReadFile(filepath.Join(b.bundle, "stdio.log"))
		if len(log) > 300 {
			log = log[len(log)-300:]
		}
		t.Logf("%s: counter=%d held=%d log tail=%q", b.rootfs, lastInt(filepath.Join(b.rootfs, "root/counter")), lastInt(filepath.Join(b.rootfs, "root/held.log")), log)
	}
}

func TestExpAlive(t *testing.T) {
	requireRunsc(t)
	tmp := t.TempDir()
	rt, _ := New(Options{Root: filepath.Join(tmp, "state"), LogDir: filepath.Join(tmp, "logs")})
	ctx := context.Background()
	srcRoot := filepath.Join(tmp, "src", "rootfs")
	busyboxRootfs(t, srcRoot)
	src := mfBundle(t, rt, filepath.Join(tmp, "src"), srcRoot, "srchost", testNetns(t), []string{"/bin/sh", "-c", mfCounter})
	rt.Run(ctx, src.id, src.bundle)
	time.Sleep(500 * time.Millisecond)
	st, _ := rt.State(ctx, src.id)
	t.Logf("before: %+v procs=%d", st, len(hostProcsWith(src.id)))
	img := filepath.Join(tmp, "img")
	if err := rt.Checkpoint(ctx, src.id, img); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		st, err := rt.State(ctx, src.id)
		b, perr := os.ReadFile("/proc/" + itoa(st.Pid) + "/stat")
		t.Logf("after %d: %+v %v stat=%.60s %v procs=%v", i, st, err, b, perr, hostProcsWith(src.id))
		time.Sleep(200 * time.Millisecond)
	}
	d := filepath.Join(tmp, "k")
	os.MkdirAll(d, 0o755)
	copyTree(t, srcRoot, filepath.Join(d, "rootfs"))
	k := mfBundle(t, rt, d, filepath.Join(d, "rootfs"), "kid1", testNetns(t), []string{"/bin/sh", "-c", mfCounter})
	if err := rt.Restore(ctx, k.id, k.bundle, img); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	log, _ := os.ReadFile(filepath.Join(k.bundle, "stdio.log"))
	t.Logf("kid log head %.200q", log)
	log, _ = os.ReadFile(filepath.Join(src.bundle, "stdio.log"))
	t.Logf("src log tail %q", log[len(log)-60:])
}

func itoa(i int) string { return strconv.Itoa(i) }
