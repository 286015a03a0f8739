// Package memvault keeps memory images encrypted at rest. A memory image
// (a memory checkpoint, a hibernated sandbox) holds everything its
// processes held: tokens, keys, credentials read into memory. The vault is
// an ext4 filesystem in a loop-mounted image file whose images directory
// is under an fscrypt v2 policy (AES-256-XTS contents, AES-256-CTS names)
// with a master key the operator supplies: the kernel encrypts each block
// as it is written back and decrypts it as it is read, so what runsc
// writes and reads is unchanged, and data on the disk is ciphertext. The
// key lives in the kernel's keyring for the filesystem only while the
// vault is open; Close removes it.
//
// The page cache holds the plaintext of recently used images, as it holds
// the sandboxes' own memory: the vault protects a disk, a backup of the
// state directory or a stolen image file, not a root user of the running
// host.
package memvault

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/loopdev"
	"github.com/forkbox/forkbox/internal/mount"
)

// KeySize is the master key's size in bytes (fscrypt v2 derives the
// per-file keys from it).
const KeySize = 64

// DefaultSize is the image file's size when none is given: sparse, so it
// takes only what the images use.
const DefaultSize = 64 << 30

// imagesDir is the encrypted directory inside the vault's filesystem (its
// root holds lost+found, and a policy applies to an empty directory).
const imagesDir = "images"

// Vault is an open vault: Dir is where memory images go.
type Vault struct {
	Root  string // the ext4 filesystem's mount point
	Dir   string // the encrypted images directory in it
	keyID [unix.FSCRYPT_KEY_IDENTIFIER_SIZE]byte
}

// ReadKey reads a master key file: 64 bytes, raw or as 128 hex digits
// (a final newline allowed). A file others can read is refused.
func ReadKey(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("memory image key: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("memory image key %s: mode %v lets others read it (chmod 600): %w", path, st.Mode().Perm(), errdefs.ErrInvalidArgument)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("memory image key %s: owned by uid %d, not by the daemon's (%d), who could read it: %w", path, sys.Uid, os.Geteuid(), errdefs.ErrInvalidArgument)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("memory image key: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(b) == KeySize {
		return b, nil
	}
	defer clear(b)
	if h := bytes.TrimSpace(b); len(h) == 2*KeySize {
		k := make([]byte, KeySize)
		if _, err := hex.Decode(k, h); err == nil {
			return k, nil
		}
		clear(k)
	}
	return nil, fmt.Errorf("memory image key %s: want %d bytes (head -c %d /dev/urandom), or %d hex digits; it has %d bytes: %w",
		path, KeySize, KeySize, 2*KeySize, len(b), errdefs.ErrInvalidArgument)
}

// imagePath is the vault's image file for mount point root.
func imagePath(root string) string { return filepath.Clean(root) + ".img" }

// Open mounts the vault at root (made, sparse at size bytes, and formatted
// the first time), adds key for its filesystem, and returns it with its
// images directory ready. A vault whose images were written under another
// key is FailedPrecondition, and stays mounted, locked.
func Open(ctx context.Context, root string, key []byte, size int64, log *slog.Logger) (*Vault, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("memory image key: %d bytes, want %d: %w", len(key), KeySize, errdefs.ErrInvalidArgument)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal)
	}
	mp, err := mount.IsMountPoint(root)
	if err != nil {
		return nil, err
	}
	if !mp {
		if err := mountImage(ctx, root, size, log); err != nil {
			return nil, err
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil || fs.Type != unix.EXT4_SUPER_MAGIC {
		return nil, fmt.Errorf("memory vault %s: mounted, but not the vault's ext4 (statfs: %v): %w", root, err, errdefs.ErrFailedPrecondition)
	}
	v := &Vault{Root: root, Dir: filepath.Join(root, imagesDir)}
	if v.keyID, err = addKey(root, key); err != nil {
		return nil, err
	}
	if err := v.ensurePolicy(); err != nil {
		// Not left in the kernel for a vault that was not opened.
		return nil, errors.Join(err, v.Close())
	}
	return v, nil
}

// mountImage attaches root's image file (made and formatted with the
// encrypt feature if it has no ext4 yet) and mounts it at root.
func mountImage(ctx context.Context, root string, size int64, log *slog.Logger) (retErr error) {
	if size <= 0 {
		size = DefaultSize
	}
	img := imagePath(root)
	created, err := loopdev.CreateImage(img, size, false, nil)
	if err != nil {
		return fmt.Errorf("memory vault: %w", err)
	}
	if created {
		defer func() {
			if retErr != nil {
				os.Remove(img)
			}
		}()
	}
	dev, devf, err := loopdev.Attach(ctx, img)
	if err != nil {
		return err
	}
	defer devf.Close() // the mount holds the device; AUTOCLEAR frees it at unmount
	// Formatted when it holds nothing yet: just made, or made before a
	// crash that came before its mkfs. One that cannot be read, or holds
	// something else, is never formatted over.
	blank, err := blankImage(img)
	if err != nil {
		return err
	}
	if blank {
		out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-O", "encrypt", "-E", "nodiscard", "-L", "forkbox-mem", dev).CombinedOutput()
		if err != nil {
			return fmt.Errorf("memory vault: mkfs.ext4 %s: %v: %s: %w", dev, err, bytes.TrimSpace(out), errdefs.ErrInternal)
		}
	}
	if err := mount.All(ctx, []mount.Mount{{Type: "ext4", Source: dev, Options: []string{"nosuid", "nodev", "noexec", "noatime"}}}, root); err != nil {
		return fmt.Errorf("memory vault: mount %s: %w", img, err)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		return fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal)
	}
	log.InfoContext(ctx, "mounted the encrypted memory image vault", slog.String("root", root), slog.String("image", img),
		slog.String("device", dev), slog.Bool("created", created))
	return nil
}

// blankImage reports whether image's first 64 KiB (ext4's superblock and
// group descriptors, other filesystems' headers) are all zeros: a file
// nothing was written to. A read that fails is an error, not blank.
func blankImage(image string) (bool, error) {
	f, err := os.Open(image)
	if err != nil {
		return false, fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal)
	}
	defer f.Close()
	b := make([]byte, 64<<10)
	if _, err := f.ReadAt(b, 0); err != nil {
		return false, fmt.Errorf("memory vault: read %s: %v: %w", image, err, errdefs.ErrInternal)
	}
	return !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }), nil
}

// addKey adds key to the filesystem at root and returns its identifier.
func addKey(root string, key []byte) (id [unix.FSCRYPT_KEY_IDENTIFIER_SIZE]byte, err error) {
	f, err := os.Open(root)
	if err != nil {
		return id, fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal)
	}
	defer f.Close()
	// struct fscrypt_add_key_arg, then the raw key (its flexible array).
	hdr := int(unsafe.Sizeof(unix.FscryptAddKeyArg{}))
	buf := make([]byte, hdr+len(key))
	arg := (*unix.FscryptAddKeyArg)(unsafe.Pointer(&buf[0]))
	arg.Key_spec.Type = unix.FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER
	arg.Raw_size = uint32(len(key))
	copy(buf[hdr:], key)
	defer clear(buf)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.FS_IOC_ADD_ENCRYPTION_KEY, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		return id, fmt.Errorf("memory vault: add the key (FS_IOC_ADD_ENCRYPTION_KEY; does the kernel have CONFIG_FS_ENCRYPTION?): %v: %w", errno, errdefs.ErrUnavailable)
	}
	copy(id[:], arg.Key_spec.U[:])
	return id, nil
}

// ensurePolicy makes the images directory under the key's policy, or
// checks that the one there is.
func (v *Vault) ensurePolicy() error {
	err := os.Mkdir(v.Dir, 0o700)
	switch {
	case err == nil:
		if err := setPolicy(v.Dir, v.keyID); err != nil {
			os.Remove(v.Dir)
			return err
		}
		return nil
	case !errors.Is(err, os.ErrExist):
		return fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal)
	}
	id, ok, err := policyKey(v.Dir)
	if err != nil {
		return err
	}
	if !ok {
		// A crash between its mkdir and its policy leaves it empty: it
		// takes the policy now. One that holds files was not ours.
		if ents, err := os.ReadDir(v.Dir); err != nil || len(ents) > 0 {
			return fmt.Errorf("memory vault: %s is not encrypted and not empty (%d entries, %v): %w", v.Dir, len(ents), err, errdefs.ErrFailedPrecondition)
		}
		return setPolicy(v.Dir, v.keyID)
	}
	if id != v.keyID {
		return fmt.Errorf("memory vault: the images in %s were written under another key (key %x, this one %x): %w",
			v.Dir, id[:4], v.keyID[:4], errdefs.ErrFailedPrecondition)
	}
	return nil
}

// setPolicy puts the empty directory dir under a v2 policy for key id.
func setPolicy(dir string, id [unix.FSCRYPT_KEY_IDENTIFIER_SIZE]byte) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal)
	}
	defer f.Close()
	p := unix.FscryptPolicyV2{
		Version:                   unix.FSCRYPT_POLICY_V2,
		Contents_encryption_mode:  unix.FSCRYPT_MODE_AES_256_XTS,
		Filenames_encryption_mode: unix.FSCRYPT_MODE_AES_256_CTS,
		Flags:                     unix.FSCRYPT_POLICY_FLAGS_PAD_32,
		Master_key_identifier:     id,
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.FS_IOC_SET_ENCRYPTION_POLICY, uintptr(unsafe.Pointer(&p))); errno != 0 {
		return fmt.Errorf("memory vault: set the encryption policy on %s: %v: %w", dir, errno, errdefs.ErrInternal)
	}
	return nil
}

// policyKey returns the key identifier of dir's policy (ok false: none).
func policyKey(dir string) (id [unix.FSCRYPT_KEY_IDENTIFIER_SIZE]byte, ok bool, err error) {
	f, err := os.Open(dir)
	if err != nil {
		return id, false, fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal)
	}
	defer f.Close()
	arg := unix.FscryptGetPolicyExArg{Size: uint64(len(unix.FscryptGetPolicyExArg{}.Policy))}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.FS_IOC_GET_ENCRYPTION_POLICY_EX, uintptr(unsafe.Pointer(&arg))); errno != 0 {
		if errno == unix.ENODATA {
			return id, false, nil
		}
		return id, false, fmt.Errorf("memory vault: read the policy of %s: %v: %w", dir, errno, errdefs.ErrInternal)
	}
	p := (*unix.FscryptPolicyV2)(unsafe.Pointer(&arg.Policy[0]))
	if p.Version != unix.FSCRYPT_POLICY_V2 {
		return id, false, fmt.Errorf("memory vault: %s has a v%d policy, want v2: %w", dir, p.Version, errdefs.ErrFailedPrecondition)
	}
	return p.Master_key_identifier, true, nil
}

// Close removes the key from the filesystem: images not open are locked
// (their names and contents unreadable) until the next Open; busy is true
// when some were open (they stay readable through those handles until
// they are closed). The vault stays mounted.
func (v *Vault) Close() error {
	_, err := v.close()
	return err
}

// CloseBusy is Close, and says whether files were open.
func (v *Vault) CloseBusy() (busy bool, err error) { return v.close() }

func (v *Vault) close() (bool, error) {
	f, err := os.Open(v.Root)
	if err != nil {
		return false, fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInternal)
	}
	defer f.Close()
	arg := unix.FscryptRemoveKeyArg{}
	arg.Key_spec.Type = unix.FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER
	copy(arg.Key_spec.U[:], v.keyID[:])
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.FS_IOC_REMOVE_ENCRYPTION_KEY, uintptr(unsafe.Pointer(&arg))); errno != 0 && errno != unix.ENOKEY {
		return false, fmt.Errorf("memory vault: remove the key: %v: %w", errno, errdefs.ErrInternal)
	}
	return arg.Removal_status_flags&unix.FSCRYPT_KEY_REMOVAL_STATUS_FLAG_FILES_BUSY != 0, nil
}

// Detach unmounts the vault at root and frees its loop device
// (loopdev.Release; the image file stays). Idempotent; a root without an
// image file is left alone.
func Detach(ctx context.Context, root string) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return fmt.Errorf("memory vault: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return loopdev.Release(ctx, root, imagePath(root))
}

// Exists reports whether a vault image file exists for mount point root.
func Exists(root string) bool {
	abs, err := filepath.Abs(root)
	if err != nil {
		return false
	}
	_, err = os.Stat(imagePath(abs))
	return err == nil
}
