// Package mount performs the mounts that storage describes: it is the only
// package in forkbox that mounts or unmounts a file system into the
// daemon's view of the host (a sandbox's rootfs overlay, image layers,
// the btrfs state file) and the only one that reads /proc/thread-self/mountinfo
// to find what is mounted below the state directory.
//
// Storage packages (the snapshotter, the image store) describe mounts as
// data, a []Mount, and hand them to the caller; the caller performs them
// with All and undoes them with Unmount.
//
// Two packages call mount(2) themselves, for namespace plumbing rather than
// storage, and stay out of this package on purpose:
//
//   - internal/network (netns.go) bind-mounts a network namespace's
//     /proc/self/task/<tid>/ns/net file onto <run dir>/netns/<id> to keep the
//     namespace alive without a process, makes that directory a shared
//     mount point (as `ip netns` does for /run/netns) so the bind mounts
//     propagate into runtimes' mount namespaces, and unmounts both on
//     teardown. The bind must be made from the thread that unshared the
//     namespace, inside network's locked-thread goroutine.
//   - internal/runtime/crun (cgroupmode.go) starts crun on hybrid cgroup
//     hosts from a thread that has unshared a private mount namespace, in
//     which it makes / private and detaches the empty cgroup2 hierarchy so
//     crun sees pure cgroup v1. Those calls change only that throwaway
//     namespace, never the host's.
//
// Neither mounts a file system that storage describes; anything new that
// does belongs here.
package mount
