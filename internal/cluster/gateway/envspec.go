package gateway

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// An environment definition in cluster mode is an Environment object's
// spec. What the spec has no field for is refused, naming cluster mode,
// rather than dropped: a start command, an egress policy. A
// client-run setup (setup_hash) is built through BeginBuild (envlease.go).
// A step that writes a file becomes a shell command that writes it
// (spec.setup holds commands): printf with the content escaped in its
// format, so any image with a POSIX shell runs it, and read back as the
// write step it came from.

// Bounds of a definition in an object (the CRD's, checked first so the
// error is the caller's; the total keeps the object well under etcd's
// request limit).
const (
	maxSetupSteps  = 64
	maxSetupStep   = 65536
	maxSetupTotal  = 1 << 20
	maxCwd         = 4096
	maxEnvName     = 50
	maxPoolSize    = 32
	maxWritePath   = 4096
	defaultWriteMd = 0o644
)

// specOf is the Environment spec of a definition, checked.
func specOf(d *v1.EnvironmentDefinition) (fbv1.EnvironmentSpec, error) {
	var spec fbv1.EnvironmentSpec
	if d == nil {
		return spec, fmt.Errorf("an environment definition is required: %w", errdefs.ErrInvalidArgument)
	}
	if err := validName("environment", d.Name); err != nil {
		return spec, err
	}
	switch {
	case d.PoolSize < 0 || d.PoolSize > maxPoolSize:
		return spec, fmt.Errorf("pool size %d: want 0 to %d: %w", d.PoolSize, maxPoolSize, errdefs.ErrInvalidArgument)
	case d.Start != nil:
		return spec, fmt.Errorf("environment %s: a start command is not available in cluster mode (forkbox serve --gateway): the Environment object's snapshot is a filesystem checkpoint: %w", d.Name, errdefs.ErrInvalidArgument)
	case d.Egress != "":
		return spec, fmt.Errorf("environment %s: an environment's egress policy is not available in cluster mode (forkbox serve --gateway): give it to each sandbox of the environment (overrides.egress): %w", d.Name, errdefs.ErrInvalidArgument)
	case len(d.SetupHash) > 128:
		return spec, fmt.Errorf("setup hash of %d bytes: at most 128: %w", len(d.SetupHash), errdefs.ErrInvalidArgument)
	case d.SetupHash != "" && len(d.Steps) > 0:
		return spec, fmt.Errorf("environment %s: a client-run setup (setup_hash) with steps is not available in cluster mode (forkbox serve --gateway): give steps or a setup function, not both: %w", d.Name, errdefs.ErrInvalidArgument)
	case d.MaxAgeSeconds < 0:
		return spec, fmt.Errorf("max age %ds is negative: %w", d.MaxAgeSeconds, errdefs.ErrInvalidArgument)
	}
	if d.Image == "" {
		return spec, fmt.Errorf("an image is required: %w", errdefs.ErrInvalidArgument)
	}
	if len(d.Image) > 1024 {
		return spec, fmt.Errorf("image reference of %d bytes: at most 1024: %w", len(d.Image), errdefs.ErrInvalidArgument)
	}
	if len(d.Cwd) > maxCwd {
		return spec, fmt.Errorf("cwd of %d bytes: at most %d: %w", len(d.Cwd), maxCwd, errdefs.ErrInvalidArgument)
	}
	rt, err := runtimeOf(d.Runtime)
	if err != nil {
		return spec, err
	}
	spec = fbv1.EnvironmentSpec{Image: d.Image, Runtime: rt, WorkingDir: d.Cwd, SetupHash: d.SetupHash, PoolSize: d.PoolSize}
	if spec.Resources, err = resourcesOf(d.Resources); err != nil {
		return spec, err
	}
	if spec.Env, err = envList(d.Env); err != nil {
		return spec, err
	}
	if d.MaxAgeSeconds > 0 {
		if d.MaxAgeSeconds > int64(100*365*24*time.Hour/time.Second) {
			return spec, fmt.Errorf("max age %ds: at most 100 years: %w", d.MaxAgeSeconds, errdefs.ErrInvalidArgument)
		}
		spec.MaxAge = &metav1.Duration{Duration: time.Duration(d.MaxAgeSeconds) * time.Second}
	}
	if spec.Setup, err = setupOf(d.Steps); err != nil {
		return spec, err
	}
	return spec, nil
}

// setupOf is the shell commands of steps, bounded.
func setupOf(steps []*v1.SetupStep) ([]string, error) {
	if len(steps) > maxSetupSteps {
		return nil, fmt.Errorf("%d setup steps: at most %d in cluster mode: %w", len(steps), maxSetupSteps, errdefs.ErrResourceExhausted)
	}
	var out []string
	total := 0
	for i, st := range steps {
		if st == nil || (st.Run == "") == (st.WritePath == "") {
			return nil, fmt.Errorf("step %d: give a command (run) or a file (write_path), one of them: %w", i+1, errdefs.ErrInvalidArgument)
		}
		cmd := st.Run
		if st.WritePath != "" {
			var err error
			if cmd, err = writeCommand(st.WritePath, st.WriteContent, st.WriteMode); err != nil {
				return nil, fmt.Errorf("step %d: %w", i+1, err)
			}
		}
		if len(cmd) > maxSetupStep {
			return nil, fmt.Errorf("step %d is %d bytes as a shell command: at most %d in cluster mode (a written file's content counts up to 4 times): %w",
				i+1, len(cmd), maxSetupStep, errdefs.ErrResourceExhausted)
		}
		if total += len(cmd); total > maxSetupTotal {
			return nil, fmt.Errorf("setup steps of more than %d bytes: at most that in cluster mode: %w", maxSetupTotal, errdefs.ErrResourceExhausted)
		}
		out = append(out, cmd)
	}
	return out, nil
}

// writeCommand is the shell command that writes content to path with
// mode (0: 0644), creating its directory, as a write step does.
func writeCommand(path string, content []byte, mode uint32) (string, error) {
	if len(path) > maxWritePath || strings.ContainsRune(path, 0) {
		return "", fmt.Errorf("write path of %d bytes: at most %d, without NUL: %w", len(path), maxWritePath, errdefs.ErrInvalidArgument)
	}
	if mode == 0 {
		mode = defaultWriteMd
	}
	if mode > 0o7777 {
		return "", fmt.Errorf("write mode %o: want permission bits (at most 07777): %w", mode, errdefs.ErrInvalidArgument)
	}
	return fmt.Sprintf(`p=%s; mkdir -p -- "$(dirname -- "$p")" && printf '%s' > "$p" && chmod %04o "$p"`, shellQuote(path), printfFormat(content), mode), nil
}

// writeRE matches exactly what writeCommand makes.
var writeRE = regexp.MustCompile(`^p=('(?:[^']|'\\'')*'); mkdir -p -- "\$\(dirname -- "\$p"\)" && printf '([^']*)' > "\$p" && chmod ([0-7]{4}) "\$p"$`)

// writeStep reads back the write step a command was made from.
func writeStep(cmd string) (*v1.SetupStep, bool) {
	m := writeRE.FindStringSubmatch(cmd)
	if m == nil {
		return nil, false
	}
	path, ok := shellUnquote(m[1])
	if !ok {
		return nil, false
	}
	content, ok := printfUnformat(m[2])
	if !ok {
		return nil, false
	}
	mode, _ := strconv.ParseUint(m[3], 8, 32)
	if mode == defaultWriteMd {
		mode = 0 // as it was given most often: the default
	}
	return &v1.SetupStep{WritePath: path, WriteContent: content, WriteMode: uint32(mode)}, true
}

// shellQuote quotes s for a POSIX shell: in single quotes, each quote
// in s closed, escaped and reopened.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellUnquote(q string) (string, bool) {
	if len(q) < 2 || q[0] != '\'' || q[len(q)-1] != '\'' {
		return "", false
	}
	return strings.ReplaceAll(q[1:len(q)-1], `'\''`, "'"), true
}

// printfFormat is a printf format that prints b exactly: printable ASCII
// as itself, but for \ and % (doubled) and ' (which ends the quoted
// format); every other byte as a three-digit octal escape.
func printfFormat(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		switch {
		case c == '\\':
			s.WriteString(`\\`)
		case c == '%':
			s.WriteString("%%")
		case c >= 0x20 && c < 0x7f && c != '\'':
			s.WriteByte(c)
		default:
			fmt.Fprintf(&s, `\%03o`, c)
		}
	}
	return s.String()
}

func printfUnformat(f string) ([]byte, bool) {
	var out []byte
	for i := 0; i < len(f); i++ {
		c := f[i]
		switch c {
		case '\\':
			if i+1 < len(f) && f[i+1] == '\\' {
				out = append(out, '\\')
				i++
				continue
			}
			if i+4 > len(f) {
				return nil, false
			}
			n, err := strconv.ParseUint(f[i+1:i+4], 8, 8)
			if err != nil {
				return nil, false
			}
			out = append(out, byte(n))
			i += 3
		case '%':
			if i+1 >= len(f) || f[i+1] != '%' {
				return nil, false
			}
			out = append(out, '%')
			i++
		default:
			out = append(out, c)
		}
	}
	return out, true
}

// definitionOf is the definition an Environment object holds.
func definitionOf(e *fbv1.Environment) *v1.EnvironmentDefinition {
	s := &e.Spec
	d := &v1.EnvironmentDefinition{Name: e.Name, Image: s.Image, Runtime: string(s.Runtime), Cwd: s.WorkingDir, SetupHash: s.SetupHash, PoolSize: s.PoolSize,
		Resources: &v1.Resources{Cpu: quantityString(s.Resources.CPU), Memory: quantityString(s.Resources.Memory), Disk: quantityString(s.Resources.Disk)}}
	if p := s.Resources.Pids; p != nil {
		d.Resources.Pids = *p
	}
	if len(s.Env) > 0 {
		d.Env = map[string]string{}
		for _, v := range s.Env {
			d.Env[v.Name] = v.Value
		}
	}
	if s.MaxAge != nil {
		d.MaxAgeSeconds = int64(s.MaxAge.Duration / time.Second)
	}
	for _, cmd := range s.Setup {
		if st, ok := writeStep(cmd); ok {
			d.Steps = append(d.Steps, st)
		} else {
			d.Steps = append(d.Steps, &v1.SetupStep{Run: cmd})
		}
	}
	return d
}
