// Command demo shows what forkbox saves: it prepares a sandbox once (a
// setup that does tens of seconds of real work), forks N children from it,
// runs a task in each, and compares the cost with N fresh setups.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/testimage"
)

// setup is the expensive, deterministic preparation: generate a dataset,
// index it, and build an archive of it.
const setup = `set -e
mkdir -p /data && cd /data
i=0; while [ $i -lt %d ]; do i=$((i+1)); head -c 65536 /dev/urandom > f$i; done
sha256sum f* > /index
tar cf - /data 2>/dev/null | gzip -6 > /data.tgz
echo "dataset: $(ls /data | wc -l) files, archive $(du -k /data.tgz | cut -f1) KiB"`

// task is one run: check a slice of the dataset against the index.
const task = `set -e
cd /data
grep " f%d[0-9]*$" /index | sha256sum -c - | grep -c OK > /result
echo "run %d: $(cat /result) files verified on $(hostname)"`

func main() {
	host := flag.String("host", os.Getenv("FORKBOX_HOST"), "daemon address (default: the local socket)")
	n := flag.Int("n", 5, "number of runs (forks)")
	files := flag.Int("files", 3000, "files in the dataset (64 KiB each)")
	runtime := flag.String("runtime", "", "runtime: gvisor or crun (default: the daemon's)")
	flag.Parse()
	c := &client.Client{}
	if strings.HasPrefix(*host, "unix://") {
		c.Socket = strings.TrimPrefix(*host, "unix://")
	} else if *host != "" {
		c.URL = *host
	}
	if err := run(context.Background(), c, *n, *files, *runtime); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v (%s)\n", err, errdefs.ClassName(err))
		os.Exit(1)
	}
}

func ensureImage(ctx context.Context, c *client.Client) (string, error) {
	const name = "forkbox.local/busybox:latest"
	imgs, err := c.ListImages(ctx)
	if err != nil {
		return "", err
	}
	for _, i := range imgs {
		if i.Name == name {
			return name, nil
		}
	}
	img, err := testimage.Busybox()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "forkbox-demo-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "busybox.tar")
	if err := testimage.WriteOCIArchive(img, name, path); err != nil {
		return "", err
	}
	im, err := c.ImportImage(ctx, path, "", nil)
	if err != nil {
		return "", err
	}
	return im.Name, nil
}

func step(format string, a ...any) { fmt.Printf("\033[1m==>\033[0m "+format+"\n", a...) }

func run(ctx context.Context, c *client.Client, n, files int, runtime string) error {
	image, err := ensureImage(ctx, c)
	if err != nil {
		return err
	}
	step("preparing the environment once: create a sandbox and run its setup (%d files)", files)
	t0 := time.Now()
	base, err := c.CreateSandbox(ctx, client.CreateOptions{Image: image, Name: "demo-base-" + fmt.Sprint(time.Now().Unix()),
		Runtime: runtime, Resources: client.Resources{CPU: "1", Memory: "1Gi"}})
	if err != nil {
		return err
	}
	defer base.Close(context.WithoutCancel(ctx))
	createDur := time.Since(t0)
	res, err := base.Exec(ctx, client.ExecOptions{Shell: fmt.Sprintf(setup, files), Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("setup failed with exit code %d", res.ExitCode)
	}
	setupDur := time.Since(t0)
	fmt.Printf("    create %s + setup %s = %s (%s runtime)\n", ms(createDur), ms(setupDur-createDur), ms(setupDur), base.Info.Runtime)

	step("forking %d children from the warm sandbox", n)
	t1 := time.Now()
	fr, err := base.Fork(ctx, client.ForkOptions{Tag: "warm", Count: n})
	if err != nil {
		return err
	}
	forkDur := time.Since(t1)
	kids := fr.Sandboxes()
	defer func() {
		for _, k := range kids {
			k.Close(context.WithoutCancel(ctx))
		}
	}()
	var starts []float64
	for i, ch := range fr.Children {
		if ch.Err != nil {
			return fmt.Errorf("child %d: %w", i, ch.Err)
		}
		starts = append(starts, ch.StartMS)
	}
	sort.Float64s(starts)
	fmt.Printf("    captured %s: source frozen %.1f ms (freeze + btrfs snapshot + thaw), after %.0f ms of writeback while it ran\n",
		fr.Captured, fr.CaptureMS, fr.FlushMS)
	fmt.Printf("    %d children ready in %s (per child: median %.0f ms)\n", len(kids), ms(forkDur), starts[len(starts)/2])

	step("running one task in each child, in parallel")
	t2 := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out strings.Builder
			r, err := k.Exec(ctx, client.ExecOptions{Shell: fmt.Sprintf(task, i+1, i+1), Stdout: &out, Stderr: &out})
			mu.Lock()
			defer mu.Unlock()
			fmt.Print("    " + out.String())
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("task %d exited %d", i+1, r.ExitCode)
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	runDur := time.Since(t2)

	with := setupDur + forkDur
	without := time.Duration(n) * setupDur
	fmt.Println()
	fmt.Printf("  %-44s %10s\n", "", "provisioning")
	fmt.Printf("  %-44s %10s\n", fmt.Sprintf("%d fresh setups (create + setup, each %s)", n, ms(setupDur)), ms(without))
	fmt.Printf("  %-44s %10s\n", "forkbox: one setup + one fork of "+fmt.Sprint(n), ms(with))
	fmt.Printf("  %-44s %10s  (%.1fx less)\n", "saved", ms(without-with), float64(without)/float64(with))
	fmt.Printf("  the %d tasks themselves took %s in parallel either way.\n", n, ms(runDur))
	fmt.Printf("  (fresh setups: %d x the setup measured above, not re-run)\n", n)
	return nil
}

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}
