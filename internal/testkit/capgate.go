package testkit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/proc"
	"github.com/capgate/capgate/token"
)

// CapgatePkg is the import path of the capgate command.
const CapgatePkg = "github.com/capgate/capgate/cmd/capgate"

// DefaultSecret is the token secret StartCapgate gives serve when
// Capgate.Secret is empty.
const DefaultSecret = "testkit-token-secret-value-5c1d8e"

// Capgate configures StartCapgate: one `capgate serve` on its own temp dir.
type Capgate struct {
	// Config is capgate.toml after the [server] table, which StartCapgate
	// writes: listen on a free loopback port, data_dir "data", the socket.
	Config string
	// Server is more lines of the [server] table (public_url = ...).
	Server string
	// Socket serves the capability RPC on Dir/rpc.sock too; without it
	// socket = "-".
	Socket bool
	// Secret is the token secret serve reads from $CAPGATE_TOKEN_SECRET and
	// Token mints with; empty is DefaultSecret.
	Secret string
	// NoSecret leaves $CAPGATE_TOKEN_SECRET to Env (a test of where serve
	// finds its key); Token then mints with Secret all the same.
	NoSecret bool
	// Addr is the host:port serve listens on; empty: a free loopback port.
	// Known before serve starts, it can go into Config (advertise_url).
	// Better, leave it empty and write AddrHere where Config or Server
	// needs it: a port taken before serve binds it is then chosen again.
	Addr string
	// DataDir is the data_dir serve uses; empty: "data" in its temp dir.
	// Two serves given one share their store, as replicas do.
	DataDir string
	Env     []string // added to serve's environment, after the secret
	Args    []string // serve's flags after --config
	// Wrap starts serve through this command (argv, serve's after it):
	// NoLandlock, say.
	Wrap []string
	// User runs serve as this user, unprivileged, in Dir, which the
	// caller makes and the user owns; the built binaries become readable
	// by all. Dir "" is a temp dir of the test's.
	User *User
	Dir  string
}

// User is a user to run as, by numeric ids.
type User struct{ Uid, Gid int }

// Served is a running `capgate serve` that StartCapgate started.
type Served struct {
	Bin        string // the capgate binary
	Dir        string // the temp dir holding the config and data_dir "data"
	ConfigPath string
	Addr       string // host:port serve listens on
	URL        string // "http://" + Addr
	Socket     string // the Unix socket, or "" without Capgate.Socket
	Secret     string // the token secret (the text given to serve)
	Banner     string // serve's stdout up to its "a dev token" line
	Cmd        *exec.Cmd

	logs func() string
}

// pickAddr is where StartCapgate listens when the test names no address:
// FreeAddr, or a test's stand-in that hands out a taken one.
var pickAddr = FreeAddr

// StartCapgate builds capgate once, writes the config into a temp dir,
// starts `capgate serve` in its own process group and waits for its banner.
// Cleanup kills the process group unless the test stopped serve.
func StartCapgate(tb testing.TB, c Capgate) *Served {
	tb.Helper()
	if testing.Short() {
		tb.Skip("runs capgate serve")
	}
	s := &Served{Bin: Build(tb, CapgatePkg), Dir: c.Dir, Addr: c.Addr, Secret: c.Secret}
	if s.Addr == "" {
		s.Addr = pickAddr(tb)
	}
	if s.Dir == "" {
		s.Dir = tb.TempDir()
		// A root serve runs its tools as nobody ([sandbox] run_as): they
		// must enter the test's temp dirs (this one's siblings hold its
		// packs and scripts), which the testing package makes 0700.
		if c.User == nil && os.Geteuid() == 0 {
			if err := os.Chmod(filepath.Dir(s.Dir), 0o755); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if s.Secret == "" {
		s.Secret = DefaultSecret
	}
	s.URL = "http://" + s.Addr
	s.ConfigPath = filepath.Join(s.Dir, "capgate.toml")
	socket := "-"
	if c.Socket {
		s.Socket = filepath.Join(s.Dir, "rpc.sock")
		socket = s.Socket
	}
	dataDir := c.DataDir
	if dataDir == "" {
		dataDir = "data"
	}
	writeConfig := func() {
		src := fmt.Sprintf("[server]\nlisten = %q\ndata_dir = %q\nsocket = %q\n%s\n%s", s.Addr, dataDir, socket, c.Server, c.Config)
		src = strings.ReplaceAll(src, AddrHere, s.Addr)
		if err := os.WriteFile(s.ConfigPath, []byte(src), 0o600); err != nil {
			tb.Fatal(err)
		}
		if u := c.User; u != nil {
			if err := errors.Join(os.Chown(s.ConfigPath, u.Uid, u.Gid), os.Chmod(filepath.Dir(s.Bin), 0o755)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	writeConfig()
	var env []string
	if !c.NoSecret {
		env = append(env, "CAPGATE_TOKEN_SECRET="+s.Secret)
	}
	env = append(env, c.Env...)
	bin, args := s.Bin, append([]string{"serve", "--config", s.ConfigPath}, c.Args...)
	if len(c.Wrap) > 0 {
		bin, args = c.Wrap[0], append(append(c.Wrap[1:len(c.Wrap):len(c.Wrap)], s.Bin), args...)
	}
	for tries := 1; ; tries++ {
		var err error
		s.Cmd, s.Banner, s.logs, err = launch(tb, bin, args, true, c.User, env...)
		if err == nil {
			return s
		}
		// FreeAddr's port was free a moment ago; beside parallel tests an
		// outgoing connection can take it before serve binds it. A port of
		// our choosing is chosen again; one the test chose is its own.
		// Up to 6 tries: 3 in a row were taken once (-parallel 8, load 25).
		if c.Addr == "" && tries < 6 && strings.Contains(err.Error(), fmt.Sprintf("listen = %q: the address is already in use", s.Addr)) {
			tb.Logf("capgate serve: %s was taken before it could listen; another port", s.Addr)
			s.Addr = pickAddr(tb)
			s.URL = "http://" + s.Addr
			writeConfig()
			continue
		}
		tb.Fatal(err)
	}
}

// AddrHere in Capgate.Config or Capgate.Server stands for the address
// serve listens on (Served.Addr), for a config that names it.
const AddrHere = "{{capgate_addr}}"

// Logs is what serve has logged (its stderr) so far.
func (s *Served) Logs() string { return s.logs() }

// Token mints an Ash context token for c with the key serve verifies with.
func (s *Served) Token(tb testing.TB, c token.Claims) string {
	tb.Helper()
	return Mint(tb, s.Secret, c)
}

// Mint mints an Ash context token for c, the secret read as serve reads
// $CAPGATE_TOKEN_SECRET (hex, base64url or text).
func Mint(tb testing.TB, secret string, c token.Claims) string {
	tb.Helper()
	raw, err := token.Mint(token.ParseSecret(secret), c, token.MintOptions{Ash: true})
	if err != nil {
		tb.Fatalf("mint a token for %q: %v", c.Sub, err)
	}
	return raw
}

// Stop sends serve SIGTERM and waits for it, up to stopWait; then it kills
// it and fails the test. It returns what Wait returned.
func (s *Served) Stop(tb testing.TB) error {
	tb.Helper()
	s.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.Cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(stopWait):
		tb.Errorf("capgate serve did not stop within %v of SIGTERM; killing it", stopWait)
		s.Kill()
		return <-done
	}
}

// stopWait is how long Stop waits for serve to exit: a deadline, not a
// measure. A serve stopping its 20 stdio upstreams beside the package's
// other tests on a loaded machine (load 20) took over 10 s.
const stopWait = 30 * time.Second

// Kill kills serve's process group: serve and any upstream it started.
func (s *Served) Kill() { proc.KillGroup(s.Cmd.Process) }
