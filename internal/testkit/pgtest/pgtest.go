// Package pgtest runs a real PostgreSQL (Debian's postgresql package) for
// tests: a throwaway cluster in a temporary directory, on a free port of
// 127.0.0.1, with a fresh database per test.
//
// Where PostgreSQL is not installed the tests that need it skip, except
// under CI (CI set in the environment), where they fail.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is one running PostgreSQL cluster.
type Server struct {
	dir  string // owns the cluster; removed by Stop
	port int
	// fileCopy: CREATE DATABASE copies template1's files (PostgreSQL 15
	// and later write it through the WAL by default, which costs twice the
	// CPU; their checkpoint is cheap here, without fsync).
	fileCopy bool
	cmd      *exec.Cmd
	done     chan struct{}
	n        atomic.Int64
	// adminConn, guarded by adminMu, creates the databases.
	adminMu   sync.Mutex
	adminConn *pgx.Conn

	stopOnce sync.Once
	stopErr  error
}

var (
	sharedMu sync.Mutex
	shared   *Server // set by Run
)

// Run runs m's tests with one shared server, started on first use and
// stopped when they end: call it from TestMain as os.Exit(pgtest.Run(m)).
// A test binary without it gets a server per Start.
func Run(m *testing.M) int {
	sharedMu.Lock()
	shared = &Server{} // started lazily by Start
	sharedMu.Unlock()
	code := m.Run()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared.cmd != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	shared = nil
	return code
}

// Start returns the URL of a new, empty database for tb: on the server
// Run started, or on one of tb's own.
func Start(tb testing.TB) string {
	tb.Helper()
	sharedMu.Lock()
	s := shared
	if s != nil && s.cmd == nil {
		if err := s.start(); err != nil {
			sharedMu.Unlock()
			unavailable(tb, err)
		}
	}
	sharedMu.Unlock()
	if s == nil {
		s = NewServer(tb)
	}
	return s.Database(tb)
}

// NewServer starts a server of tb's own, stopped at cleanup: for a test
// that stops it itself.
func NewServer(tb testing.TB) *Server {
	tb.Helper()
	s := &Server{}
	if err := s.start(); err != nil {
		unavailable(tb, err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// unavailable skips tb, or fails it under CI.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") != "" || !errors.Is(err, errAbsent) {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Skipf("pgtest: %v", err)
}

var errAbsent = errors.New("PostgreSQL is not installed (apt-get install postgresql)")

// binDir is the newest /usr/lib/postgresql/*/bin with initdb.
func binDir() (string, error) {
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		if p, err := exec.LookPath("initdb"); err == nil {
			return filepath.Dir(p), nil
		}
		return "", errAbsent
	}
	sort.Strings(found) // two-digit majors since 10 sort as numbers
	return filepath.Dir(found[len(found)-1]), nil
}

func (s *Server) start() error {
	bin, err := binDir()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "capgate-pgtest-")
	if err != nil {
		return err
	}
	s.dir = dir
	data := filepath.Join(dir, "data")
	uid, gid, err := asPostgres(nil)
	if err != nil {
		return err
	} else if uid >= 0 {
		// initdb refuses root: the cluster belongs to postgres.
		if err := os.Chown(dir, uid, gid); err != nil {
			return err
		}
	}
	if err := initCluster(bin, data, uid, gid); err != nil {
		os.RemoveAll(dir)
		return err
	}
	if s.port, err = freePort(); err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	// Durability is not under test: no fsync makes database creation fast.
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", fmt.Sprint(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off",
		"-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if _, _, err := asPostgres(s.cmd); err != nil {
		return err
	}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), s.url("postgres"))
		if err == nil {
			var version int // 0 if unread: CREATE DATABASE as it comes
			conn.QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int").Scan(&version)
			s.adminConn = conn // Database's, from here on
			s.fileCopy = version >= 150000
			return nil
		}
		select {
		case <-s.done:
			b, _ := os.ReadFile(log.Name())
			return fmt.Errorf("postgres exited at start: %s", strings.TrimSpace(string(b)))
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("postgres did not accept connections in 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Database creates a new, empty database and returns its URL.
func (s *Server) Database(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.n.Add(1))
	create := "CREATE DATABASE " + name
	if s.fileCopy {
		create += " STRATEGY = FILE_COPY"
	}
	if err := s.admin(create); err != nil {
		tb.Fatalf("pgtest: create database: %v", err)
	}
	return s.url(name)
}

// admin runs sql on the server's one connection to database postgres,
// connecting again when it broke (a test may end every connection). One
// connection serves every Database: a connection's backend costs about
// 60 ms of CPU here, about what the database it creates does.
func (s *Server) admin(sql string) error {
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	ctx := context.Background()
	for retried := false; ; retried = true {
		if s.adminConn == nil || s.adminConn.IsClosed() {
			conn, err := pgx.Connect(ctx, s.url("postgres"))
			if err != nil {
				return err
			}
			s.adminConn = conn
		}
		_, err := s.adminConn.Exec(ctx, sql)
		if err == nil || retried || !s.adminConn.IsClosed() {
			return err
		}
	}
}

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Stop stops the server (a fast shutdown) and removes its files.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.adminMu.Lock()
		if s.adminConn != nil {
			s.adminConn.Close(context.Background())
			s.adminConn = nil
		}
		s.adminMu.Unlock()
		if s.cmd != nil && s.cmd.Process != nil {
			s.cmd.Process.Signal(os.Interrupt) // SIGINT: fast shutdown
			select {
			case <-s.done:
			case <-time.After(20 * time.Second):
				s.cmd.Process.Kill()
				<-s.done
				s.stopErr = errors.New("pgtest: postgres did not stop in 20s; killed")
			}
		}
		if s.dir != "" {
			os.RemoveAll(s.dir)
		}
	})
	return s.stopErr
}

// freePort is a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
