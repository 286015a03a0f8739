// Package mount is the only package in forkbox that calls mount(2) and
// umount(2).
//
// Storage packages (the snapshotter, the image store) describe mounts as
// data, a []Mount, and hand them to the caller; the caller performs them with
// All and undoes them with Unmount. The package also reads
// /proc/self/mountinfo so the daemon can find what is mounted below its state
// directory when it reconciles or cleans up.
package mount
