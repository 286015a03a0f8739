// Command demo shows what forkbox saves: it defines an environment whose
// setup does tens of seconds of real work, builds it once, hands over N
// sandboxes forked from its warm snapshot, runs a task in each, and compares
// the cost with N fresh setups.
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
	name := fmt.Sprintf("demo-dataset-%d", time.Now().Unix())
	e := c.Environment(name, client.EnvironmentOptions{Image: image, Runtime: runtime,
		Resources: client.Resources{CPU: "1", Memory: "1Gi"},
		Setup:     []*client.SetupStep{client.Run(fmt.Sprintf(setup, files))}})
	defer c.DeleteEnvironment(context.WithoutCancel(ctx), name)

	step("building environment %q once: create a sandbox, run its setup (%d files), snapshot it", name, files)
	t0 := time.Now()
	info, err := e.Build(ctx, func(p *client.BuildProgress) {
		if p.Phase == "output" {
			os.Stdout.Write(p.Output)
		}
	})
	if err != nil {
		return err
	}
	buildDur := time.Since(t0)
	fmt.Printf("    built in %s: snapshot %s\n", ms(buildDur), info.Checkpoint)

	step("handing over %d sandboxes, each forked from the warm snapshot", n)
	t1 := time.Now()
	var kids []*client.EnvSandbox
	defer func() {
		for _, k := range kids {
			k.Close(context.WithoutCancel(ctx))
		}
	}()
	var forks []float64
	for i := 0; i < n; i++ {
		sb, err := e.Sandbox(ctx, client.Overrides{})
		if err != nil {
			return err
		}
		kids = append(kids, sb)
		forks = append(forks, sb.HandoverMS)
	}
	forkDur := time.Since(t1)
	sort.Float64s(forks)
	fmt.Printf("    %d sandboxes in %s (per fork: median %.0f ms, max %.0f ms), runtime %s\n",
		n, ms(forkDur), forks[len(forks)/2], forks[len(forks)-1], kids[0].Info.Runtime)

	step("running one task in each, in parallel")
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

	with := buildDur + forkDur
	without := time.Duration(n) * buildDur
	fmt.Println()
	fmt.Printf("  %-50s %10s\n", "", "provisioning")
	fmt.Printf("  %-50s %10s\n", fmt.Sprintf("%d fresh setups (each %s)", n, ms(buildDur)), ms(without))
	fmt.Printf("  %-50s %10s\n", fmt.Sprintf("forkbox: one build + %d forks (%.0f ms each)", n, forks[len(forks)/2]), ms(with))
	fmt.Printf("  %-50s %10s  (%.1fx less)\n", "saved", ms(without-with), float64(without)/float64(with))
	fmt.Printf("  the %d tasks themselves took %s in parallel either way.\n", n, ms(runDur))
	fmt.Printf("  (fresh setups: %d x the build measured above, not re-run)\n", n)
	return nil
}

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}
