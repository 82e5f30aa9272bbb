package mcp

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// A confined stdio server's process outlives calls, so what its sandbox
// refuses it is not one call's the way an extension command's is. Where
// capgate reads the kernel's audit records (root), each file the kernel
// refuses the server is logged once, and named in the error of the call
// during which it happened when exactly one call to the server was in
// flight then (with two or more, which one caused it cannot be known: the
// log alone says it). Where capgate reads no audit, a failed call's error
// result is read as a refused file's report, checked against the
// server's sandbox rules as for a per-call tool's stderr. A server that
// fails to start says the same in the error its calls get.

// maxLoggedDenials bounds the distinct denials a process's log keeps
// track of, so a server probing many paths cannot grow it.
const maxLoggedDenials = 256

// settleTimeout bounds the wait for the audit records of a failed call.
const settleTimeout = time.Second

// procDenials are the denials of one stdio server process.
type procDenials struct {
	s *Source
	d *sandbox.Denials

	mu     sync.Mutex
	logged map[sandbox.FileDenial]bool
	keys   map[sandbox.Key]bool // the guarantees logged
	// calls are the calls in flight, each with its observer of denials
	// (the router's capability_check record; may be nil).
	calls map[*sandbox.Denials]func(string)
}

// watch has the newest process's confinement c report its denials: files
// (root audit) and, through seccomp user notification as for a per-call
// tool, each socket under no_network and new process under no_subprocess,
// which the kernel hands capgate as they happen: a call in flight then is
// the one that caused them, when it is the only one.
func (s *Source) watch(c sandbox.Confinement) sandbox.Confinement {
	p := &procDenials{s: s, d: new(sandbox.Denials), logged: map[sandbox.FileDenial]bool{}, keys: map[sandbox.Key]bool{},
		calls: map[*sandbox.Denials]func(string){}}
	p.d.OnFile(p.file)
	s.denied.Store(p)
	c.Files, c.Observe = p.d, p.observe
	return c
}

// observe takes one socket or process the kernel refused the server.
func (p *procDenials) observe(k sandbox.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	only := p.only()
	if only != nil {
		only.Observe(p.calls[only])(string(k))
	}
	if p.keys[k] {
		return
	}
	p.keys[k] = true
	one := p.d.ForCall()
	one.Observe(nil)(string(k))
	// Logged off the supervisor's goroutine: the server's syscall waits
	// until observe returns, and a write to the log may wait on its reader.
	go p.log(one, only != nil)
}

// only is the call in flight when there is exactly one (p.mu held).
func (p *procDenials) only() *sandbox.Denials {
	if len(p.calls) != 1 {
		return nil
	}
	for c := range p.calls {
		return c
	}
	return nil
}

// log says once what the sandbox refused the server (one), and whether a
// call's error names it.
func (p *procDenials) log(one *sandbox.Denials, named bool) {
	msg, hint := p.s.explain(one)
	p.s.opts.Logger.Warn("the sandbox refused an MCP server", "server", p.s.opts.Name, "denied", msg, "to_allow", hint,
		"call", map[bool]string{true: "named in the error of the call in flight", false: "not named in a call (none or several in flight)"}[named])
}

// file takes one denial the kernel recorded: logged once, and the call's
// when it is the only one in flight.
func (p *procDenials) file(f sandbox.FileDenial) {
	p.mu.Lock()
	only := p.only()
	if only != nil {
		only.AddFile(f)
	}
	if p.logged[f] || len(p.logged) >= maxLoggedDenials {
		p.mu.Unlock()
		return
	}
	p.logged[f] = true
	// Logged without p.mu, which observe takes while a server's
	// syscall waits.
	p.mu.Unlock()
	one := p.d.ForCall()
	one.AddFile(f)
	p.log(one, only != nil)
}

// enter registers a call in flight; leave takes it out once it has ended
// and adds what the sandbox refused during it to its failure.
func (p *procDenials) enter(denied func(string)) *sandbox.Denials {
	c := p.d.ForCall()
	p.mu.Lock()
	p.calls[c] = denied
	p.mu.Unlock()
	return c
}

func (p *procDenials) leave(c *sandbox.Denials, res *tool.Result, err error) (*tool.Result, error) {
	failed := err != nil || res != nil && res.IsError
	if failed && c.Audited() {
		// The records of the call's refusals were queued before the
		// server answered: wait for them before the call leaves.
		sandbox.SettleAudit(settleTimeout)
	}
	p.mu.Lock()
	delete(p.calls, c)
	p.mu.Unlock()
	if !failed {
		return res, err
	}
	if res != nil {
		c.Reported(resultText(res), "its error result")
	}
	msg, hint := p.s.explain(c)
	if msg == "" {
		return res, err
	}
	var te *tool.Error
	switch {
	case errors.As(err, &te):
		te.Message += "; " + msg
		if te.Hint == "" {
			te.Hint = hint
		}
	case err != nil:
		e := tool.Wrap(err, tool.CodeBackendUnavailable, "%v; %s", err, msg)
		e.Hint = hint
		return nil, e
	default:
		// The server's own error result stays whole; capgate's word
		// follows it, marked as capgate's.
		b, _ := json.Marshal(map[string]string{"type": "text", "text": "capgate: " + msg + "; to allow it: " + hint})
		out := *res
		out.Content = append(append([]json.RawMessage(nil), res.Content...), b)
		return &out, nil
	}
	return res, err
}

// resultText is the text of a result's text blocks.
func resultText(res *tool.Result) string {
	var b strings.Builder
	for _, c := range res.Content {
		var block struct{ Type, Text string }
		if json.Unmarshal(c, &block) == nil && block.Type == "text" {
			b.WriteString(block.Text)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// explain is d's message and hint for this server.
func (s *Source) explain(d *sandbox.Denials) (msg, hint string) {
	return d.Explain(s.opts.Confine.Guarantees, string(tool.KindMCP)+":"+s.opts.Name, "capabilities of [mcp.servers."+s.opts.Name+"]")
}

// denialNote is what the sandbox refused the newest process, for the error
// of a server that would not start: "; the kernel refused it ... (to allow
// it: ...)", or "".
func (s *Source) denialNote() string {
	p := s.denied.Load()
	if p == nil {
		return ""
	}
	if t := s.stderr.Load(); t != nil {
		p.d.Stderr(t.String())
	}
	msg, hint := s.explain(p.d)
	if msg == "" {
		return ""
	}
	return "; " + msg + " (to allow it: " + hint + ")"
}
