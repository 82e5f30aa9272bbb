// Package proc runs one bounded subprocess: input on stdin, stdout capped,
// a tail of stderr kept, a deadline, and the whole process group killed
// when it ends. Extension packs and bridge providers both run this way.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
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
}

// StderrTail is how much of stderr errors keep.
const StderrTail = 2048

// Errors Run returns, to be matched with errors.Is or errors.As.
var (
	ErrTimeout        = errors.New("timed out")
	ErrCancelled      = errors.New("cancelled")
	ErrOutputTooLarge = errors.New("output too large")
)

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
// fails with ErrTimeout, ErrCancelled, ErrOutputTooLarge, *ExitError or
// *StartError. Nothing the command started outlives Run.
func Run(ctx context.Context, spec Spec) (stdout []byte, stderr string, err error) {
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Dir
	cmd.Env = spec.Env
	if cmd.Env == nil {
		cmd.Env = []string{} // nil would inherit ours
	}
	cmd.Stdin = bytes.NewReader(spec.Stdin)
	out := &capped{max: spec.MaxOutput}
	errTail := &tail{max: StderrTail}
	cmd.Stdout, cmd.Stderr = out, errTail
	// Its own process group, so a timeout kills what it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second

	runErr := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	stderr = strings.TrimSpace(string(errTail.buf))
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, stderr, ErrTimeout
	case ctx.Err() != nil:
		return nil, stderr, ErrCancelled
	case out.over:
		return nil, stderr, ErrOutputTooLarge
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

// capped keeps up to max bytes and notes whether more came.
type capped struct {
	buf  bytes.Buffer
	max  int64
	over bool
}

func (c *capped) Write(b []byte) (int, error) {
	if room := c.max - int64(c.buf.Len()); int64(len(b)) > room {
		c.buf.Write(b[:max(room, 0)])
		c.over = true
		return len(b), nil // keep draining, so the command is not stuck on a full pipe
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

// Env builds an environment from the host's values of names, skipping
// unset ones, followed by extra "K=V" entries.
func Env(lookup func(string) (string, bool), names []string, extra ...string) []string {
	var out []string
	for _, n := range names {
		if v, ok := lookup(n); ok {
			out = append(out, n+"="+v)
		}
	}
	return append(out, extra...)
}
