// Package transfer ships checkpoints between forkbox nodes: the node that
// needs checkpoint X pulls it from a node holding a ready copy, naming the
// ancestors of X it already holds; the sender streams `btrfs send` of X's
// read-only subvolume (with -p the nearest of those ancestors it holds too,
// so only what changed since travels) and, for a memory checkpoint, the
// files of its memory image; the receiver runs `btrfs receive` and commits
// the result into its snapshot store and ledger as a read-only checkpoint.
// The checkpoint's image goes first when the receiver lacks it: its
// blobs, by digest, verified by the receiver's image store (images.go).
//
// Channel: HTTPS with mutual TLS between node agents, certificates pinned.
// Each node makes its own key pair and self-signed certificate once
// (Identity) and publishes the certificate where peers read it (in
// cluster mode: its ForkboxNode status, written through the API server,
// which authenticates the node's write); a server accepts only client
// certificates its Trust names, a client only the exact certificate it was
// given for the peer. No CA key lives on any node. Being trusted is not
// enough to be sent a checkpoint: the server asks its Grants (grants.go)
// whether the requesting node has a reason to hold it, and refuses others
// (PermissionDenied) before anything is sent. A request is identified,
// granted and its body read (bounded in time) before it takes one of the
// server's slots, of which one peer takes at most half (slots.go); the
// base of an incremental send is an ancestor of the checkpoint that the
// peer is granted too, never another checkpoint it names.
//
// The sender is untrusted by the receiver as much: the image it names is
// stored only by digest (image.Store.ImportFrom), and the ledger commits
// its record only if it names the image the pull ensured
// (Request.ImageDigest).
//
// One pull is one POST /v1/pull of a JSON Request; the response body is a
// sequence of frames (frames.go): a header, the send stream, the memory
// image's files, a trailer with the byte counts; or an error frame.
//
// What comes from another node is untrusted input, so the receiver
//   - bounds the whole pull in bytes (Limits.MaxBytes, and this node's
//     room: its free space less a reserve, Local.room) and time
//     (Limits.Timeout), and each wait for the sender's next bytes
//     (Limits.Idle), and the record and file count;
//   - refuses a subvolume UUID a checkpoint here already has (received or
//     captured): btrfs receive finds bases and clone sources by UUID;
//   - parses the send stream as it passes to btrfs receive (stream.go) and
//     refuses, before btrfs acts on it, a stream that carries another
//     subvolume than asked (name, UUID), a second subvolume, an incremental
//     base other than the ancestor agreed, clones from any other
//     subvolume, paths that leave the subvolume, paths through a symlink
//     (one the stream made or one the base holds) or writes, truncates,
//     chmods and clones that would follow one (streamlinks.go), device
//     nodes (but an overlay whiteout, char 0:0), or data after its end;
//     btrfs receive runs chrooted into the store's directory besides;
//   - checks after the receive that the subvolume is read-only with the
//     asked UUID as its received UUID, a snapshot of the agreed base's own
//     subvolume, and that the counts match the trailer; the snapshot store
//     takes it only with its layer's real directories on top
//     (storage.Store.Receive);
//   - never makes the received subvolume writable: children are writable
//     snapshots of it;
//   - leaves nothing on failure: the snapshot store's commit point is its
//     metadata (storage.Store.Receive deletes an uncommitted receive at
//     once, Open after a crash), memory files are staged in
//     <memroot>/.recv-* (removed on failure, and by the daemon's reconcile
//     after a crash, as no checkpoint has that name), and the ledger
//     record is written last.
package transfer
