// Command mkimage writes an offline busybox image (from Debian's
// busybox-static) as an oci-archive or docker-archive tarball, for the demo
// and for trying forkbox without a registry.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/forkbox/forkbox/internal/testimage"
)

func main() {
	out := flag.String("o", "busybox.tar", "output file")
	ref := flag.String("ref", "forkbox.local/busybox:latest", "image name in the archive")
	format := flag.String("format", "oci", "oci or docker")
	flag.Parse()
	img, err := testimage.Busybox()
	if err == nil {
		if *format == "docker" {
			err = testimage.WriteDockerArchive(img, *ref, *out)
		} else {
			err = testimage.WriteOCIArchive(img, *ref, *out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}
