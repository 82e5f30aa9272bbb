package toolsearch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/capgate/capgate"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// corpusSource is one corpus server as a tool source; it runs nothing.
type corpusSource struct {
	id    string
	tools []*tool.Descriptor
}

func (s *corpusSource) ID() string      { return s.id }
func (s *corpusSource) Kind() tool.Kind { return tool.KindMCP }
func (s *corpusSource) List(context.Context) ([]*tool.Descriptor, error) {
	out := make([]*tool.Descriptor, len(s.tools))
	for i, d := range s.tools {
		out[i] = d.Clone()
	}
	return out, nil
}
func (s *corpusSource) Call(context.Context, tool.Call) (*tool.Result, error) {
	return nil, tool.Errorf(tool.CodeBackendUnavailable, "not run in this test")
}

// TestSearchFindsOnlyCallable is the property that a caller never finds a
// tool it could not call, over random grant sets: for random grants
// (execute and fetch-only, per server, per tool, by pattern), acknowledged
// tiers, chat types, tool risks, chat policies and hidden tools, every
// tool a search returns passes the router's own decision (a planning call)
// at every gate that depends on who calls what: resolve, capability, the
// acknowledge tier (an approval-gated tool is findable: the operator
// approves call by call) and the chat policy. And a tool the caller may
// call all the same is findable by its own name.
func TestSearchFindsOnlyCallable(t *testing.T) {
	all, _ := loadCorpus(t)
	qs := loadQueries(t, all)
	rng := rand.New(rand.NewPCG(29, 1))
	levels := []risk.Level{risk.Low, risk.Med, risk.High, risk.Critical}
	bySource := map[string][]*tool.Descriptor{}
	overrides := map[string]registry.Override{}
	for _, d := range all {
		d = d.Clone()
		d.Risk.Level = levels[rng.IntN(len(levels))]
		switch rng.IntN(10) {
		case 0:
			d.AllowedChatTypes = []string{"group"}
		case 1:
			d.Sensitive = true // private chats only
		case 2:
			overrides[d.ID] = registry.Override{Hidden: true}
		}
		bySource[d.Source] = append(bySource[d.Source], d)
	}
	var sources []tool.Source
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for k := range bySource {
			if !yield(k) {
				return
			}
		}
	}) {
		sources = append(sources, &corpusSource{id: id, tools: bySource[id]})
	}
	ctx := context.Background()
	reg, err := registry.New(ctx, sources, registry.Options{Overrides: overrides})
	if err != nil {
		t.Fatal(err)
	}
	snap := reg.Snapshot()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "data"), store.Options{Key: make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	table, err := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("toolsearch-property-secret-0123456789")
	verifier, err := token.NewVerifier(token.Options{Secret: secret, Audience: "capgate"})
	if err != nil {
		t.Fatal(err)
	}
	var x Indexes
	defer x.Close()

	servers := slices.Collect(func(yield func(string) bool) {
		for _, s := range sources {
			if !yield(s.ID()) {
				return
			}
		}
	})
	pick := func() string { return servers[rng.IntN(len(servers))] }
	found, checked := 0, 0
	for round := range 40 {
		var grants []string
		for range 1 + rng.IntN(6) {
			switch rng.IntN(5) {
			case 0:
				grants = append(grants, "rye.execute.tool.mcp."+pick()+".*")
			case 1: // see, not call
				grants = append(grants, "rye.fetch.tool.mcp."+pick()+".*")
			case 2:
				d := all[rng.IntN(len(all))]
				grants = append(grants, "rye.execute.tool.mcp."+d.Source+"."+d.Name)
			case 3:
				grants = append(grants, "rye.execute.tool.mcp."+pick()+".*get*")
			case 4:
				grants = append(grants, "rye.execute.tool.mcp.*")
			}
		}
		var acks []string
		if rng.IntN(2) == 0 {
			acks = []string{"elevated"}
		}
		rt, err := router.New(router.Options{Registry: reg, Verifier: verifier, Risk: table,
			Policy: router.Policy{Grants: grants, Acknowledge: acks}, State: st, Audit: audit.Discard, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		claims := token.Claims{Sub: fmt.Sprintf("caller-%d", round), ChatType: []string{"private", "group"}[rng.IntN(2)]}
		raw, err := token.Mint(secret, claims, token.MintOptions{Ash: true})
		if err != nil {
			t.Fatal(err)
		}
		c, err := rt.Authenticate(raw)
		if err != nil {
			t.Fatal(err)
		}
		allow := func(d *tool.Descriptor) bool { return rt.Reachable(c, d) }
		for _, q := range qs[:20] {
			hits, err := x.Search(snap, q.Query, MaxLimit, allow)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range hits {
				found++
				p, err := rt.Plan(ctx, c, router.Request{Tool: d.ExposedName, Input: []byte(`{}`), Protocol: "test"})
				if err != nil {
					t.Fatal(err)
				}
				if !callable(c, d, p) {
					t.Errorf("round %d, grants %v, acks %v, chat %s: %q found %s, which the router refuses: %+v",
						round, grants, acks, claims.ChatType, q.Query, d.ID, *p.Denial)
				}
			}
		}
		// And the converse, on a sample: a tool the router lets c call is
		// found when searched for by its name.
		for _, d := range snap.Tools[:60] {
			p, err := rt.Plan(ctx, c, router.Request{Tool: d.ExposedName, Input: []byte(`{}`), Protocol: "test"})
			if err != nil {
				t.Fatal(err)
			}
			if !callable(c, d, p) {
				continue
			}
			checked++
			hits, err := x.Search(snap, d.ExposedName, MaxLimit, allow)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(hits, d) {
				t.Errorf("round %d: %s may be called but a search for its name does not find it", round, d.ID)
			}
		}
	}
	if found == 0 || checked == 0 {
		t.Fatalf("the random grant sets found %d tools and allowed %d: the property was not exercised", found, checked)
	}
	t.Logf("%d hits checked against the router's decision, %d callable tools found by name", found, checked)
}

// callable reads the router's plan for c calling d: allowed, refused only
// for its input (the test sends {}), or waiting for an operator's
// approval — and then, since the plan stops at the tier gate, the chat
// gate that comes after it must admit c too.
func callable(c *router.Caller, d *tool.Descriptor, p *router.Plan) bool {
	switch {
	case p.Denial == nil || p.Denial.Gate == router.GateInput:
		return true
	case p.Denial.Code == tool.CodeApprovalRequired:
		return router.ChatRefusal(c, d) == nil
	}
	return false
}
