package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/internal/pidlock"
)

// A running serve reloads its config on SIGHUP, on `capgate reload`
// (which finds serve's pid in its data dir and sends it SIGHUP: no token
// and no admin endpoint) and, with [server] watch_config, when the config
// or a file it names changes.

// pidFile is where serve writes its pid, in its data dir.
const pidFile = "capgate.pid"

func newReloadCmd() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Make a running capgate serve reload its config",
		Long: `reload checks the config as "capgate config check" does and, when it is usable,
sends SIGHUP to the capgate serve whose data dir the config names (its pid is
in <data_dir>/capgate.pid). serve then rebuilds policy, grants, sources,
overrides and skills; sessions and calls in flight survive. serve's log says
whether the reload was applied, and names the keys that need a restart
(listen, socket, data_dir, audit, auth keys).

Exit status: 0 sent, 1 no running serve, 2 the config is not usable.`,
		Example: `  capgate reload --config capgate.toml`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, problems := checkConfig(configPath)
			if len(problems) > 0 {
				if jsonOutput(cmd) {
					return usageError("%s is not usable; serve keeps its running config: %s", configPath, strings.Join(problems, "; "))
				}
				for _, p := range problems {
					fmt.Fprintln(cmd.ErrOrStderr(), p)
				}
				return &exitError{code: exitUsage, err: fmt.Errorf("%s is not usable; serve keeps its running config", configPath)}
			}
			pid, err := servePid(cfg.Server)
			if err != nil {
				return &exitError{code: exitDenied, err: err}
			}
			p, _ := os.FindProcess(pid)
			if err := p.Signal(syscall.SIGHUP); err != nil {
				return &exitError{code: exitDenied, err: fmt.Errorf("signal capgate serve (pid %d): %w", pid, err)}
			}
			if jsonOutput(cmd) {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"pid": pid, "signal": "SIGHUP"})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sent SIGHUP to capgate serve (pid %d); its log says whether the reload was applied\n", pid)
			return nil
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "capgate.toml", "the config of the running capgate serve")
	cmd.Flags().Bool("json", false, `print one JSON object on stdout: {"pid","signal"}`)
	return cmd
}

// pidPath is where the serve of server writes its pid, in its data dir:
// capgate.pid, or capgate-<replica_id>.pid for a named replica, so that
// replicas may share one data dir (and its SQLite store) on one machine.
func pidPath(server config.Server) string {
	if server.ReplicaID != "" {
		return filepath.Join(server.DataDir, "capgate-"+server.ReplicaID+".pid")
	}
	return filepath.Join(server.DataDir, pidFile)
}

// servePid is the pid of the capgate serve running on server's data dir.
// A pid file a crashed serve left behind is refused, not signalled: its
// pid may be another process's by now.
func servePid(server config.Server) (int, error) {
	dataDir, path := server.DataDir, pidPath(server)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("no capgate serve is running on %s (no %s)", dataDir, path)
	}
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s: not a pid", path)
	}
	if runtime.GOOS == "linux" {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !slices.Contains(strings.Split(string(cmdline), "\x00"), "serve") {
			return 0, fmt.Errorf("no capgate serve is running on %s (%s names pid %d, which is not one)", dataDir, path, pid)
		}
	}
	return pid, nil
}

// holdDataDir locks server's data dir for this serve (pidlock on its pid
// file, which then names this process) before anything in it is opened: a
// second serve on the same data dir is refused with the holder's pid and
// touches none of the first one's files. The returned func removes the pid
// file and drops the lock.
func holdDataDir(server config.Server) (release func(), err error) {
	if err := os.MkdirAll(server.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("server.data_dir: %w", err)
	}
	l, err := pidlock.Acquire(pidPath(server))
	if errors.Is(err, pidlock.ErrHeld) {
		return nil, fmt.Errorf("server.data_dir %s is in use by another capgate serve: %w; stop it, or give this one another data_dir (or replica_id)", server.DataDir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("server.data_dir: %w", err)
	}
	return l.Release, nil
}

// reloads reloads srv's config on SIGHUP and, when watch, whenever the
// config or a file it names changes, until ctx ends. SIGHUP is caught
// from its return on (its default would end serve).
func reloads(ctx context.Context, logger *slog.Logger, srv *app.App, configPath string, flagDirs []string, watch bool) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	var changed <-chan struct{}
	if watch {
		changed = watchFiles(ctx, watchedFiles(configPath), 500*time.Millisecond)
	}
	go reloadLoop(ctx, logger, srv, configPath, flagDirs, hup, changed)
}

// reloadLoop reloads on each signal or change until ctx ends. SIGHUP
// stays caught after that, so one during the shutdown cannot cut it short.
func reloadLoop(ctx context.Context, logger *slog.Logger, srv *app.App, configPath string, flagDirs []string, hup chan os.Signal, changed <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			logger.Info("reload: SIGHUP", "config", configPath)
		case <-changed:
			logger.Info("reload: the config changed", "config", configPath)
		}
		reload(ctx, logger, srv, configPath, flagDirs)
	}
}

// reload applies the config at configPath to srv, or refuses it with
// every problem in the log, "file:line: key: problem", and keeps the
// running config.
func reload(ctx context.Context, logger *slog.Logger, srv *app.App, configPath string, flagDirs []string) {
	refuse := func(problem string) {
		logger.Error("reload refused; the running config keeps serving", "problem", problem)
	}
	cfg, _, problems := checkConfig(configPath)
	if len(problems) > 0 {
		for _, p := range problems {
			refuse(p)
		}
		return
	}
	dirs, err := skillDirs(cfg, flagDirs)
	if err != nil {
		refuse(err.Error())
		return
	}
	needs, err := srv.Reload(ctx, cfg, dirs)
	if err != nil {
		for _, l := range lines(err) {
			refuse(l)
		}
		return
	}
	for _, k := range needs {
		logger.Warn("reload: a change needs a restart; the running value stays", "key", k, "config", configPath)
	}
	logger.Info("reload applied", "config", configPath, "tools", len(srv.Registry.Snapshot().Tools))
}

// skillDirs are the installed skill directories: [skills] dirs, then the
// --skills-dir flags (later overrides earlier). Each must be there.
func skillDirs(cfg *config.Config, flagDirs []string) ([]string, error) {
	for _, d := range cfg.SkillDirs {
		// Named on purpose, so unlike a default directory it must be there.
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%s: skills.dirs: %s is not a directory", cfg.Path, d)
		}
	}
	for _, d := range flagDirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--skills-dir %s: not a directory", d)
		}
	}
	return append(slices.Clone(cfg.SkillDirs), flagDirs...), nil
}

// watched are the files whose change reloads: the config and the files
// it names that the reload reads again (the risk file, capgate.lock).
func watched(configPath string) []string {
	files := []string{configPath}
	if cfg, err := config.Load(configPath); err == nil {
		if cfg.Policy.RiskFile != "" {
			files = append(files, cfg.Policy.RiskFile)
		}
		files = append(files, app.LockPath(cfg))
	}
	return files
}

// watchedFiles is watched(configPath) for each poll: the config, which
// reads nothing but its own file and the environment, is loaded again only
// when that file's size or time changed, not on every poll.
func watchedFiles(configPath string) func() []string {
	var stamp string
	var files []string
	return func() []string {
		now := "-"
		if fi, err := os.Stat(configPath); err == nil {
			now = fmt.Sprintf("%d %d", fi.Size(), fi.ModTime().UnixNano())
		}
		if files == nil || now != stamp {
			stamp, files = now, watched(configPath)
		}
		return files
	}
}

// watchFiles polls files() every interval and sends on the returned
// channel when any of them changed (size, time, or coming or going), once
// the change has held still for an interval: an editor's save of several
// writes is one reload. Polling needs no dependency and sees a file an
// editor replaced by a rename as well as one it rewrote.
func watchFiles(ctx context.Context, files func() []string, interval time.Duration) <-chan struct{} {
	out := make(chan struct{}, 1)
	stamp := func() string {
		var b strings.Builder
		for _, f := range files() {
			if fi, err := os.Stat(f); err == nil {
				fmt.Fprintf(&b, "%s %d %d\n", f, fi.Size(), fi.ModTime().UnixNano())
			} else {
				fmt.Fprintf(&b, "%s -\n", f)
			}
		}
		return b.String()
	}
	last, pending := stamp(), false // what serve loaded
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := stamp()
			switch {
			case now != last:
				last, pending = now, true // wait for it to hold still
			case pending:
				pending = false
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}
