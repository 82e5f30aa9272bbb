package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/capgate/capgate/internal/proc"
	"github.com/capgate/capgate/sandbox"
	"github.com/mark3labs/mcp-go/client/transport"
)

// startStdio starts a stdio upstream itself, rather than letting mcp-go's
// transport do it, so that the transport reads the upstream's stdout
// through a limitReader: mcp-go reads a whole line before anyone can look
// at it, and one unbounded line would be held whole. A line over the
// limit trips g and kills the upstream at once; the stream is out of step
// from there, so the caller starts a new connection (see restart).
// It starts through the sandbox launcher when conf guarantees anything.
func startStdio(ctx context.Context, command string, env, args []string, cwd string, limit int64, g *guard, conf sandbox.Confinement, stderr io.Writer) (*transport.Stdio, error) {
	cmd, cleanup, err := conf.Command(ctx, append([]string{command}, args...), cwd, env, nil)
	if err != nil {
		return nil, err
	}
	// Its own process group, so ending it ends what it started too.
	proc.NewGroup(cmd)
	cmd.Cancel = func() error { return proc.KillGroup(cmd.Process) }
	cmd.WaitDelay = time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	// stderr is kept as a tail, for a start that fails (stderrTail).
	cmd.Stderr = stderr
	if err := proc.Start(cmd); err != nil {
		cleanup()
		return nil, fmt.Errorf("start %s: %w", command, err)
	}
	kill := func() { _ = proc.KillGroup(cmd.Process) }
	out := &limitReader{r: stdout, max: limit, frame: frameLine, over: func() { kill(); g.trip() }}
	in := &stdioInput{WriteCloser: stdin, cmd: cmd, kill: kill, cleanup: cleanup}
	return transport.NewIO(out, in, nil), nil
}

// stdioInput is the upstream's stdin; closing it ends the upstream: EOF
// first, as MCP's stdio shutdown asks, then SIGKILL if it lingers.
type stdioInput struct {
	io.WriteCloser
	cmd     *exec.Cmd
	kill    func()
	cleanup func() // the launcher's private temp dir
}

func (in *stdioInput) Close() error {
	err := in.WriteCloser.Close()
	done := make(chan error, 1)
	go func() { done <- in.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		in.kill()
		<-done
	}
	in.cleanup()
	if errors.Is(err, io.ErrClosedPipe) {
		err = nil
	}
	return err
}
