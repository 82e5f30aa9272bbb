package server

import (
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/token"
)

// bothPaths is a capgate front door (the fast call takes what it can)
// and, over the same router, a handler that sends every request through
// mcp-go: the general path.
type bothPaths struct {
	s            *testServer
	front, mcpGo string
	tok          string
}

func openBothPaths(t testing.TB) *bothPaths {
	s, front := serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{fixtureServer(t)}},
		grants:   []string{"rye.fetch.tool.mcp.fx.*", "rye.execute.tool.mcp.fx.echo", "rye.execute.tool.mcp.fx.slow"},
	})
	hs := httptest.NewServer(s.handler(false))
	t.Cleanup(hs.Close)
	return &bothPaths{s: s, front: front, mcpGo: hs.URL, tok: mint(t, token.Claims{Sub: "fuzz"})}
}

// check posts body (a 2026-07-28 request, Mcp-Name mcpName) down both
// paths, requires the same answer, and says whether the fast call took it.
func (p *bothPaths) check(t *testing.T, mcpName, body string) bool {
	t.Helper()
	post := func(base string) (int, string, []byte) { return testkit.PostMCP(t, base, p.tok, mcpName, body) }
	before := p.s.MCP.fastCalls.Load()
	st, ct, b := post(p.front)
	fast := p.s.MCP.fastCalls.Load() != before
	alike(t, st, ct, b, post, p.mcpGo, fast)
	if t.Failed() {
		t.Logf("request (Mcp-Name %q, fast %v):\n%s", mcpName, fast, body)
	}
	return fast
}

// randomCall is a tools/call as a client might send it, or nearly:
// members in any order and spacing, ids of every kind, names visible,
// hidden, unknown and escaped, arguments of every JSON kind, and now and
// then a member the fast call must leave to mcp-go (unknown at any level,
// a key in another case or twice, a progress token, a log level, a client
// that can be asked something, a task). It returns the Mcp-Name header
// to send with it, mostly the name.
func randomCall(r *rand.Rand) (mcpName, body string) {
	// Half the messages are clean: only the first two of each choice (both
	// plain) and nothing rare, so that the fast call is tried often.
	clean := r.IntN(2) == 0
	pick := func(xs ...string) string {
		if clean {
			return xs[r.IntN(2)]
		}
		return xs[r.IntN(len(xs))]
	}
	now := func(p float64) bool { return !clean && r.Float64() < p }
	sp := func() string { return pick("", " ", "", "", " ", "\n\t") }
	obj := func(members []string) string {
		r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		var b strings.Builder
		b.WriteString("{" + sp())
		for i, m := range members {
			if i > 0 {
				b.WriteString(sp() + "," + sp())
			}
			k, v, _ := strings.Cut(m, "\x00")
			b.WriteString(k + sp() + ":" + sp() + v)
		}
		return b.String() + sp() + "}"
	}
	name := pick("fx__echo", "fx__t_00", "fx__echo", "fx__echo", "fx__nope", "fx__slow")
	mcpName = name
	if now(0.05) {
		mcpName = "fx__t_00"
	}
	nameJSON := `"` + name + `"`
	if now(0.05) {
		nameJSON = `"fx\u005f_echo"`
	}
	var meta []string
	if !now(0.05) {
		meta = append(meta, `"io.modelcontextprotocol/protocolVersion"`+"\x00"+pick(`"2026-07-28"`, `"2026-07-28"`, `"2026-07-28"`, `"2026-07-28"`, `"2026-07-28"`, `"2025-11-25"`))
	}
	meta = append(meta, `"io.modelcontextprotocol/clientInfo"`+"\x00"+`{"name":"t","version":"1"}`)
	if !now(0.05) {
		meta = append(meta, `"io.modelcontextprotocol/clientCapabilities"`+"\x00"+
			pick("{}", "{}", "{}", "{}", "{}", "{}", "{}", "{}", `{"sampling":{}}`, `{"roots":{"listChanged":true}}`, `{"tasks":{}}`, `{"elicitation":null}`))
	}
	for _, rare := range []string{`"progressToken"` + "\x00" + `"p1"`, `"io.modelcontextprotocol/logLevel"` + "\x00" + `"debug"`,
		`"io.modelcontextprotocol/related-task"` + "\x00" + `{"taskId":"t1"}`, `"capgate/mode"` + "\x00" + `"plan"`} {
		if now(0.04) {
			meta = append(meta, rare)
		}
	}
	params := []string{`"name"` + "\x00" + nameJSON}
	if !now(0.15) {
		params = append(params, `"arguments"`+"\x00"+pick(`{"message":"hi"}`, `{}`, `{"message":"hi"}`, `{"message":"caf\u00e9 \"q\"\n"}`,
			`{"message":1}`, `{"nope":true}`, `[1]`, `null`, `"s"`, `{"message":"x","message":"y"}`))
	}
	if !now(0.05) {
		params = append(params, `"_meta"`+"\x00"+obj(meta))
	}
	for _, rare := range []string{`"task"` + "\x00" + `{"ttl":1000}`, `"newParam"` + "\x00" + `1`, `"requestState"` + "\x00" + `"s"`,
		`"Name"` + "\x00" + `"fx__t_00"`} {
		if now(0.03) {
			params = append(params, rare)
		}
	}
	top := []string{
		`"jsonrpc"` + "\x00" + pick(`"2.0"`, `"2.0"`, `"2.0"`, `"2.0"`, `"2.0"`, `"2.0"`, `"2.0"`, `"2.0"`, `"2.0"`, `"1.0"`),
		`"id"` + "\x00" + pick(`7`, `"abc"`, `7`, `7`, `"abc"`, `-3`, `0`, `1.5`, `"a\"b"`, `null`, `12345678901234567`, `"`+strings.Repeat("x", 70)+`"`),
		`"method"` + "\x00" + pick(`"tools/call"`, `"tools/call"`, `"tools/call"`, `"tools/call"`, `"tools/call"`, `"tools/call"`, `"tools/call"`, `"tools/call"`, `"tools/call"`, `"tools/list"`),
		`"params"` + "\x00" + obj(params),
	}
	for _, rare := range []string{`"extra"` + "\x00" + `true`, `"Method"` + "\x00" + `"tools/list"`, `"id"` + "\x00" + `8`} {
		if now(0.03) {
			top = append(top, rare)
		}
	}
	return mcpName, sp() + obj(top) + sp()
}

// Random tools/call messages, driven through both answer paths, get the
// same answer; the fast call took some of them and left others, so both
// sides of its eligibility were tried.
func TestFastCallRandomMatchesMCPGo(t *testing.T) {
	p := openBothPaths(t)
	r := rand.New(rand.NewPCG(26, 3))
	var fast, general int
	for i := range 150 {
		mcpName, body := randomCall(r)
		t.Run("", func(t *testing.T) {
			if p.check(t, mcpName, body) {
				fast++
			} else {
				general++
			}
		})
		if t.Failed() {
			t.Fatalf("message %d differs", i)
		}
	}
	if fast < 40 || general < 40 {
		t.Errorf("the fast call took %d messages and left %d: the generator no longer tries both", fast, general)
	}
}

// FuzzFastCallMatchesMCPGo is the same check for `go test -fuzz`, from
// generated seeds.
func FuzzFastCallMatchesMCPGo(f *testing.F) {
	r := rand.New(rand.NewPCG(26, 4))
	for range 10 {
		mcpName, body := randomCall(r)
		f.Add(mcpName, body)
	}
	p := openBothPaths(f)
	f.Fuzz(func(t *testing.T, mcpName, body string) {
		if strings.ContainsAny(mcpName, "\r\n\x00") {
			t.Skip("not a header value")
		}
		p.check(t, mcpName, body)
	})
}
