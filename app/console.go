package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/console"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
	"github.com/capgate/capgate/upstreamauth"
)

// consoleApprovals gives the console the store's approvals.
type consoleApprovals struct{ st *store.Store }

func (c consoleApprovals) Live(ctx context.Context) ([]console.Approval, error) {
	list, err := c.st.Approvals(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]console.Approval, len(list))
	for i, a := range list {
		out[i] = console.Approval{ID: a.ID, Sub: a.Sub, ToolID: a.ToolID, CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt,
			Input: a.Input, InputSize: a.InputSize, Approved: a.Approved(), Denied: a.Denied(),
			ApprovedBy: a.ApprovedBy, DeniedBy: a.DeniedBy, Note: a.Note}
	}
	return out, nil
}

func (c consoleApprovals) Approve(ctx context.Context, id, by, note string) error {
	_, err := c.st.ApproveNote(ctx, id, by, note)
	return err
}

func (c consoleApprovals) Deny(ctx context.Context, id, by, note string) error {
	_, err := c.st.Deny(ctx, id, by, note)
	return err
}

// consoleAccounts gives the console the broker's linked accounts.
type consoleAccounts struct{ b *upstreamauth.Broker }

func (c consoleAccounts) List(ctx context.Context) ([]console.Account, error) {
	list, err := c.b.AllLinked(ctx, 1000)
	if err != nil {
		return nil, err
	}
	out := make([]console.Account, len(list))
	for i, l := range list {
		out[i] = console.Account{Sub: l.Sub, Server: l.Server, Issuer: l.Account.Account, Expires: l.Expiry}
	}
	return out, nil
}

func (c consoleAccounts) Revoke(ctx context.Context, sub, server string) error {
	_, err := c.b.Revoke(ctx, sub, server)
	return err
}

// consolePins lets the console review and pin quarantined tools: the
// pinned definition from capgate.lock's sidecar, the new one from the
// catalog, and a pin written to capgate.lock and applied at once.
type consolePins struct{ a *App }

func (p consolePins) Review(id string) (pinned, now json.RawMessage, nowHash string, ok bool) {
	reg := p.a.Server.Registry()
	snap := reg.Snapshot()
	if snap == nil {
		return nil, nil, "", false
	}
	d, ok := snap.Lookup(id)
	if !ok || d.Quarantined == "" {
		return nil, nil, "", false
	}
	now, _ = snap.Definition(id)
	_, pinned, _ = reg.Pinned(id)
	return pinned, now, d.DefinitionHash, true
}

func (p consolePins) Pin(ctx context.Context, id, hash string) error {
	// One pin at a time: each rewrites the whole lock.
	p.a.pinMu.Lock()
	defer p.a.pinMu.Unlock()
	reg := p.a.Server.Registry()
	snap := reg.Snapshot()
	d, ok := snap.Lookup(id)
	switch {
	case !ok:
		return fmt.Errorf("no tool %q in the catalog", id)
	case d.Quarantined == "":
		return fmt.Errorf("%s is not quarantined: nothing to pin", id)
	case d.DefinitionHash != hash:
		return fmt.Errorf("the definition of %s changed again since it was reviewed (now %s): review it again", id, d.DefinitionHash)
	}
	path := LockPath(p.a.Config)
	lock, err := registry.ReadLock(path)
	if err != nil {
		return err
	}
	if lock == nil {
		lock = &registry.Lock{Pins: map[string]string{}, Defs: map[string]json.RawMessage{}}
	}
	def, _ := snap.Definition(id)
	lock.Pins[id], lock.Defs[hash] = hash, def
	if err := lock.Write(path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return reg.SetLock(ctx, lock)
}

// ConsoleURL is where operators reach the console: [console] url, else
// http://<listen>.
func ConsoleURL(cfg *config.Config) string {
	if u := cfg.Console.URL; u != "" {
		return strings.TrimSuffix(u, "/")
	}
	return "http://" + cfg.Console.Listen
}

// newConsole builds the operator console from [console]; nil when it is
// off.
func (a *App) newConsole(cfg *config.Config, table *risk.Table) (*console.Console, error) {
	cc := cfg.Console
	if cc.Listen == "" {
		return nil, nil
	}
	base := ConsoleURL(cfg)
	opts := console.Options{
		Approvals: consoleApprovals{a.Store},
		Catalog: func() []*tool.Descriptor {
			if s := a.Server.Registry().Snapshot(); s != nil {
				return s.Tools
			}
			return nil
		},
		Tier: func(level risk.Level) string {
			t, err := table.ToolTier(level)
			if err != nil {
				return ""
			}
			return t.Name
		},
		AuditPath: cfg.Audit.Path,
		Verify:    func() (string, bool) { return verifyReport(cfg.Audit.Path) },
		Live:      a.consoleLive,
		Roles:     console.Roles{Approvers: cc.Approvers, Viewers: cc.Viewers},
		Key:       a.reloader.master,
		Secure:    strings.HasPrefix(base, "https://"),
		ClaimOnce: a.Store.ClaimOnce,
		Record:    a.Audit.Log,
		Logger:    a.logger,
	}
	if a.Broker != nil {
		opts.Accounts = consoleAccounts{a.Broker}
	}
	opts.Pins = consolePins{a}
	if cc.ClientID != "" && cfg.Auth.OIDC != nil {
		opts.OIDC = &console.OIDC{Issuer: cfg.Auth.OIDC.Issuer, ClientID: cc.ClientID, RedirectURL: base + "/oidc/callback"}
		if cc.ClientSecretEnv != "" {
			opts.OIDC.ClientSecret = os.Getenv(cc.ClientSecretEnv)
		}
	}
	return console.New(opts)
}

// verifyReport says what `capgate audit verify` says of the log at path.
func verifyReport(path string) (string, bool) {
	rep, err := audit.VerifyFile(path)
	if err != nil {
		return err.Error(), false
	}
	s := fmt.Sprintf("%d lines intact; head %s", rep.Lines, rep.Head)
	if rep.Sidecar {
		s += "; agrees with its .head sidecar"
	} else {
		s += "; no .head sidecar: lines cut off the end would go unseen"
	}
	if rep.FirstSeq > 1 {
		s += fmt.Sprintf("; checked from seq %d (earlier files pruned)", rep.FirstSeq)
	}
	return s, true
}

// consoleLive is this replica's state for the console's live page.
func (a *App) consoleLive() console.Live {
	var l console.Live
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.ready(ctx); err != nil {
		l.Ready = err.Error()
	}
	for _, c := range a.inFlight.List() {
		l.InFlight = append(l.InFlight, console.InFlight{RequestID: c.RequestID, Sub: c.Sub, Tool: c.Tool,
			Protocol: c.Protocol, Started: c.Started})
	}
	if a.Server != nil && a.Server.MCP != nil {
		for _, s := range a.Server.MCP.SessionList() {
			l.Sessions = append(l.Sessions, console.Session{Sub: s.Sub, Protocol: s.Protocol, LastUsed: s.LastUsed})
		}
	}
	snap := a.Server.Registry().Snapshot()
	if snap == nil {
		l.Ready = "the catalog is not loaded yet"
		return l
	}
	by := map[string]*console.SourceState{}
	var order []string
	for _, d := range snap.Tools {
		key := string(d.Kind) + ":" + d.Source
		s, ok := by[key]
		if !ok {
			s = &console.SourceState{Key: key}
			by[key] = s
			order = append(order, key)
		}
		s.Tools++
		if d.Available {
			s.Up = true
		}
	}
	for _, k := range order {
		s := by[k]
		if !s.Up {
			s.Reason = "its last listing failed; its tools are marked unavailable"
		}
		l.Sources = append(l.Sources, *s)
	}
	return l
}

// ServeConsole serves the console on [console] listen until ctx ends; it
// returns the address it listens on once listening.
func (a *App) ServeConsole(ctx context.Context) (string, error) {
	if a.Console == nil {
		return "", errors.New("the console is off: set [console] listen")
	}
	ln, err := net.Listen("tcp", a.Config.Console.Listen)
	if err != nil {
		return "", fmt.Errorf("%s: console.listen: %w", a.Config.Path, err)
	}
	// Requests end with ctx, so that an open approvals stream does not
	// hold up the shutdown.
	hs := &http.Server{Handler: a.Console, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go hs.Serve(ln)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
	}()
	return ln.Addr().String(), nil
}
