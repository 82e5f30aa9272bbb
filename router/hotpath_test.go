package router

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// swapSource is an in-process source whose tools a test replaces.
type swapSource struct {
	mu    sync.Mutex
	tools []*tool.Descriptor
}

func (*swapSource) ID() string      { return "swap" }
func (*swapSource) Kind() tool.Kind { return tool.KindMCP }
func (s *swapSource) List(context.Context) ([]*tool.Descriptor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tools, nil
}
func (*swapSource) Call(_ context.Context, c tool.Call) (*tool.Result, error) {
	return tool.TextResult(c.Tool.ID), nil
}

func (s *swapSource) set(schema string, names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tools = nil
	for _, n := range names {
		s.tools = append(s.tools, &tool.Descriptor{ID: tool.ID(tool.KindMCP, "swap", n), Kind: tool.KindMCP, Source: "swap",
			Name: n, Available: true, InputSchema: json.RawMessage(schema), Risk: risk.Assessment{Level: risk.Low}})
	}
}

type recorder struct {
	mu     sync.Mutex
	events []audit.Event
}

func (r *recorder) Log(e audit.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// capabilities are the capability strings checked since the last call.
func (r *recorder) capabilities() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.Type == audit.TypeGrantCheck {
			out = append(out, e.Required)
		}
	}
	r.events = nil
	return out
}

// TestToolCapsFollowCatalog: the cached capability strings of tool ids
// stay right when the catalog changes under one exposed name: another id
// behind it, a replaced descriptor of the same id, a removed tool.
func TestToolCapsFollowCatalog(t *testing.T) {
	ctx := context.Background()
	src := &swapSource{}
	src.set(`{"type":"object"}`, "a")
	// Each id is exposed as "tool", so a client keeps calling one name.
	over := map[string]registry.Override{}
	for _, n := range []string{"a", "b", "c"} {
		over[tool.ID(tool.KindMCP, "swap", n)] = registry.Override{Name: "tool"}
	}
	reg, err := registry.New(ctx, []tool.Source{src}, registry.Options{Overrides: over})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	table, _ := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	rec := &recorder{}
	r, err := New(Options{Registry: reg, Risk: table, State: st, Audit: rec, Policy: Policy{Anonymous: &Subject{Sub: "anon",
		Grants: []string{"rye.execute.tool.mcp.swap.a", "rye.fetch.tool.mcp.swap.b", "rye.execute.tool.mcp.swap.c"}}}})
	if err != nil {
		t.Fatal(err)
	}
	c := r.Anonymous()
	call := func(input string) (string, error) {
		res, err := r.Call(ctx, c, Request{Tool: "tool", Input: json.RawMessage(input)})
		if err != nil {
			return "", err
		}
		return text(t, res), nil
	}
	swap := func(schema string, names ...string) {
		t.Helper()
		src.set(schema, names...)
		if err := reg.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}

	if got, err := call(`{}`); err != nil || got != "mcp:swap:a" {
		t.Fatalf("a: %q, %v", got, err)
	}
	if got := rec.capabilities(); len(got) != 1 || got[0] != "rye.execute.tool.mcp.swap.a" {
		t.Errorf("a checked %v", got)
	}

	// b behind the same name: visible (fetch) but not executable, and
	// checked as b, not as the a cached before.
	swap(`{"type":"object"}`, "b")
	_, err = call(`{}`)
	if te := denied(t, err, tool.CodePermissionDenied, GateCapability); te.Required != "rye.execute.tool.mcp.swap.b" {
		t.Errorf("b denied for %q", te.Required)
	}
	if got := rec.capabilities(); len(got) != 1 || got[0] != "rye.execute.tool.mcp.swap.b" {
		t.Errorf("b checked %v", got)
	}

	// c, then a again with a new descriptor: each is its own id.
	swap(`{"type":"object"}`, "c")
	if got, err := call(`{}`); err != nil || got != "mcp:swap:c" {
		t.Fatalf("c: %q, %v", got, err)
	}
	swap(`{"type":"object","required":["x"]}`, "a")
	_, err = call(`{}`)
	denied(t, err, tool.CodeInvalidInput, GateInput) // the new descriptor's schema
	if got, err := call(`{"x":1}`); err != nil || got != "mcp:swap:a" {
		t.Fatalf("a replaced: %q, %v", got, err)
	}
	if got := rec.capabilities(); strings.Join(got, " ") != "rye.execute.tool.mcp.swap.c rye.execute.tool.mcp.swap.a rye.execute.tool.mcp.swap.a" {
		t.Errorf("c, a, a checked %v", got)
	}

	// Gone: not found, though its strings may still be cached.
	swap(`{"type":"object"}`)
	_, err = call(`{}`)
	denied(t, err, tool.CodeNotFound, GateResolve)
	d := &tool.Descriptor{ID: "mcp:swap:a"}
	if !r.Visible(c, d) || r.Visible(c, &tool.Descriptor{ID: "mcp:swap:d"}) {
		t.Error("visibility follows the id")
	}
}

// TestToolCapsBound: the cache forgets past its bound and still answers
// right.
func TestToolCapsBound(t *testing.T) {
	tc := newToolCaps()
	for i := range maxToolCaps + 100 {
		id := fmt.Sprintf("mcp:s%d:t/%d", i%7, i)
		cs := tc.get(id)
		if cs.fetch != permissions.Required(permissions.Fetch, permissions.Tool, id) ||
			cs.execute != permissions.Required(permissions.Execute, permissions.Tool, id) {
			t.Fatalf("%s: %+v", id, cs)
		}
	}
	if n := tc.m.Len(); n != maxToolCaps {
		t.Errorf("%d entries, bound %d", n, maxToolCaps)
	}
}

// TestSchemaEmptyVerdict: the verdict on an empty object, worked out when
// the schema compiles, is the one validating it gives.
func TestSchemaEmptyVerdict(t *testing.T) {
	sc := newSchemaCache()
	for _, schema := range []string{
		`{"type":"object"}`, `{"type":"object","properties":{"x":{"type":"string"}}}`,
		`{"type":"object","required":["x","y"]}`, `{"minProperties":1}`, `{"type":"array"}`, `{"not":{}}`,
		`{"allOf":[{"required":["a"]},{"anyOf":[{"required":["b"]},{"maxProperties":0}]}]}`, `{"type":5}`,
	} {
		d := &tool.Descriptor{ID: "mcp:s:t", InputSchema: json.RawMessage(schema)}
		for range 2 { // compiled, then cached
			got := sc.validate(d, map[string]any{})
			want := "<nil>"
			cs := compileSchema([]byte(schema))
			switch {
			case cs.err != nil:
				want = "mcp:s:t has an input schema that does not compile; no call is accepted"
			default:
				if err := cs.schema.Validate(map[string]any{}); err != nil {
					var problems []string
					leaves(err.(*jsonschema.ValidationError), &problems)
					want = "input is invalid: " + strings.Join(problems, "; ")
				}
			}
			msg := "<nil>"
			if got != nil {
				msg = got.(*tool.Error).Message
			}
			if msg != want {
				t.Errorf("%s: %q, want %q", schema, msg, want)
			}
		}
	}
}

// Two different lists of caps never share a cached intersection: a cap
// holding a NUL must not pass for the two caps around it.
func TestCapsCacheKeysAreUnambiguous(t *testing.T) {
	policy, err := permissions.NewSet("rye.*")
	if err != nil {
		t.Fatal(err)
	}
	table, err := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	if err != nil {
		t.Fatal(err)
	}
	c := newCapsCache()
	if s := c.intersect(table, []string{"rye.execute.tool.mcp.fs.a", "rye.execute.tool.mcp.fs.b"}, nil, policy); !s.Allows("rye.execute.tool.mcp.fs.a") {
		t.Fatal("two caps: rye.execute.tool.a refused")
	}
	if s := c.intersect(table, []string{"rye.execute.tool.mcp.fs.a\x00rye.execute.tool.mcp.fs.b"}, nil, policy); s.Allows("rye.execute.tool.mcp.fs.a") {
		t.Fatal("one cap with a NUL got the cached intersection of two caps")
	}
}
