// Package proc runs one bounded subprocess: input on stdin, stdout capped,
// a tail of stderr kept, a deadline, and the whole process group killed
// when it ends. Extension packs and bridge providers both run this way;
// Env builds the environment of every subprocess capgate starts, stdio MCP
// upstreams included.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// Spec is one run.
type Spec struct {
	Argv      []string
	Dir       string
	Env       []string // the whole environment; nothing is inherited
	Stdin     []byte
	Timeout   time.Duration
	MaxOutput int64 // stdout cap in bytes
	// Launcher starts it confined (a sandbox.Confinement); nil starts it
	// directly. Protocol holds capgate's own "K=V" values for it, which
	// reach it whatever its env guarantees.
	Launcher Launcher
	Protocol []string
}

// Launcher builds the command that runs argv, ended when ctx is; cleanup
// is called once it has ended. sandbox.Confinement is one.
type Launcher interface {
	Command(ctx context.Context, argv []string, dir string, env, protocol []string) (cmd *exec.Cmd, cleanup func(), err error)
}

// StderrTail is how much of stderr errors keep.
const StderrTail = 2048

// Errors Run returns, to be matched with errors.Is or errors.As.
var (
	ErrTimeout        = errors.New("timed out")
	ErrCancelled      = errors.New("cancelled")
	ErrOutputTooLarge = errors.New("output too large")
	// ErrOutputHeld: the command exited, but its stdout or stderr stayed
	// open for outputWait after (a process it left behind holds them), so
	// its output may be cut short and is not used.
	ErrOutputHeld = errors.New("its output stayed open after it exited (a process it left behind holds it)")
)

// outputWait bounds how long Run reads a command's output after it exits
// or is killed: long enough for a loaded machine to drain a pipe (1 s was
// not, under -race at load 16), short enough that a tool which leaves a
// process holding its stdout fails soon.
const outputWait = 3 * time.Second

// ExitError is a run that ended with a non-zero status.
type ExitError struct {
	Status int
	// Stderr is the tail, trimmed. It is for the operator's log only: a
	// failing command may print its credentials, so Error leaves it out.
	Stderr string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("exited with status %d", e.Status)
}

// StartError is a command that could not be started.
type StartError struct{ Err error }

func (e *StartError) Error() string { return "could not start: " + e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// Run runs spec and returns its stdout and the tail of its stderr. It
// fails with ErrTimeout, ErrCancelled, ErrOutputTooLarge, ErrOutputHeld, *ExitError or
// *StartError (wrapping the launcher's refusal, such as
// *sandbox.UnenforceableError). Nothing the command started outlives Run.
func Run(ctx context.Context, spec Spec) (stdout []byte, stderr string, err error) {
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	env := spec.Env
	if env == nil {
		env = []string{} // nil would inherit ours, secrets and all
	}
	var cmd *exec.Cmd
	cleanup := func() {}
	if spec.Launcher != nil {
		var err error
		if cmd, cleanup, err = spec.Launcher.Command(ctx, spec.Argv, spec.Dir, env, spec.Protocol); err != nil {
			return nil, "", &StartError{Err: err}
		}
	} else {
		cmd = exec.CommandContext(ctx, spec.Argv[0], spec.Argv[1:]...)
		cmd.Dir, cmd.Env = spec.Dir, append(slices.Clip(env), spec.Protocol...) // never nil: env is not
	}
	defer cleanup()
	// The whole input is in place before the command starts: it never
	// runs on a part of it, whenever capgate stops.
	in, err := inputFile(spec.Stdin)
	if err != nil {
		return nil, "", &StartError{Err: err}
	}
	defer in.Close()
	cmd.Stdin = in
	// A command that writes past the cap is killed at once: its answer is
	// refused anyway, and draining it would keep it running to the timeout.
	out := &capped{max: spec.MaxOutput, full: func() { _ = KillGroup(cmd.Process) }}
	errTail := &tail{max: StderrTail}
	cmd.Stdout, cmd.Stderr = out, errTail
	// Its own process group, so a timeout kills what it started too.
	NewGroup(cmd)
	cmd.Cancel = func() error { return KillGroup(cmd.Process) }
	cmd.WaitDelay = outputWait

	runErr := Start(cmd)
	if runErr == nil {
		runErr = cmd.Wait()
	}
	if cmd.Process != nil {
		_ = KillGroup(cmd.Process)
	}
	stderr = strings.TrimSpace(string(errTail.buf))
	switch {
	case out.over:
		return nil, stderr, ErrOutputTooLarge
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, stderr, ErrTimeout
	case ctx.Err() != nil:
		return nil, stderr, ErrCancelled
	case errors.Is(runErr, exec.ErrWaitDelay):
		return nil, stderr, ErrOutputHeld
	case runErr != nil:
		var ee *exec.ExitError
		if errors.As(runErr, &ee) {
			return nil, stderr, &ExitError{Status: ee.ExitCode(), Stderr: stderr}
		}
		if u := errors.Unwrap(runErr); u != nil {
			runErr = u
		}
		return nil, stderr, &StartError{Err: runErr}
	}
	return out.buf.Bytes(), stderr, nil
}

// inputFile holds b whole, read from its start: an anonymous memory file
// where the kernel has one (handed to the command as its stdin itself),
// else a pipe fed by a goroutine.
func inputFile(b []byte) (io.ReadCloser, error) {
	if f, err := MemFile("capgate-input", b); err == nil {
		return f, nil
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// capped keeps up to max bytes; when more comes it calls full once and
// fails the write, which ends the copy from the command's stdout.
type capped struct {
	buf  bytes.Buffer
	max  int64
	over bool
	full func()
}

func (c *capped) Write(b []byte) (int, error) {
	if c.over {
		return 0, ErrOutputTooLarge
	}
	if room := c.max - int64(c.buf.Len()); int64(len(b)) > room {
		c.over = true
		c.full()
		return 0, ErrOutputTooLarge
	}
	return c.buf.Write(b)
}

// tail keeps the last max bytes written.
type tail struct {
	buf []byte
	max int
}

func (t *tail) Write(b []byte) (int, error) {
	t.buf = append(t.buf, b...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(b), nil
}

// BaseEnv is the one allow list of host variables every subprocess capgate
// starts gets, when set: enough to run ordinary programs (and Ash's Python
// providers), nothing secret. Anything more the operator names per source.
var BaseEnv = []string{"HOME", "LANG", "LC_ALL", "PATH", "PYTHONPATH", "TEMP", "TMP", "TMPDIR", "TZ", "USER"}

// Env builds the whole environment of a subprocess: the host's values of
// BaseEnv and of names (the operator's pass-through list), skipping unset
// ones, then the fixed "K=V" entries of extra. A later entry for a name
// replaces an earlier one. The result is never nil, since a nil
// exec.Cmd.Env would inherit capgate's whole environment, secrets and all.
func Env(lookup func(string) (string, bool), names []string, extra ...string) []string {
	out := make([]string, 0, len(BaseEnv)+len(names)+len(extra))
	at := map[string]int{} // name → index in out
	put := func(kv string) {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := at[name]; ok {
			out[i] = kv
			return
		}
		at[name] = len(out)
		out = append(out, kv)
	}
	for _, list := range [][]string{BaseEnv, names} {
		for _, n := range list {
			if v, ok := lookup(n); ok {
				put(n + "=" + v)
			}
		}
	}
	for _, kv := range extra {
		put(kv)
	}
	return out
}
