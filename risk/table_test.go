package risk

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/capgate/capgate"
)

func defaultTable(t testing.TB) *Table {
	t.Helper()
	tb, err := ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestDefaultTableClassifies(t *testing.T) {
	tb := defaultTable(t)
	tests := []struct {
		grant, tier string
		policy      Policy
	}{
		{"rye.*", "unrestricted", Block},
		{"*", "unrestricted", Block},  // widened to rye.*
		{"r*", "unrestricted", Block}, // widened to rye.*
		{"rye.execute.*", "elevated", AcknowledgeRequired},
		{"rye.execute.tool.*", "elevated", AcknowledgeRequired},
		{"rye.execute.tool.mcp.*", "elevated", AcknowledgeRequired}, // every MCP tool
		{"rye.execute.tool.*.*.*", "elevated", AcknowledgeRequired}, // widened, not "scoped"
		{"rye.execute.tool.mcp.shell.run", "elevated", AcknowledgeRequired},
		{"rye.execute.tool.mcp.filesystem.*", "write", Allow},
		{"rye.execute.tool.mcp.filesystem.read_file", "write", Allow},
		{"rye.execute.tool.bridge.gog.email.*", "write", Allow},
		{"rye.execute.directive.deploy", "write", Allow},
		{"rye.execute.directive.*", "elevated", AcknowledgeRequired},
		{"rye.fetch.*", "safe", Allow},
		{"rye.fetch.tool.mcp.filesystem.*", "safe", Allow},
		{"rye.sign.directive.x", "safe", Allow},
	}
	for _, tt := range tests {
		c := tb.Classify(tt.grant)
		if !c.Classified || c.Tier.Name != tt.tier || c.Tier.Policy != tt.policy {
			t.Errorf("Classify(%s) = %s/%s via %q, want %s/%s", tt.grant, c.Tier.Name, c.Tier.Policy, c.Pattern, tt.tier, tt.policy)
		}
	}
	for l, want := range map[Level]string{Low: "safe", Med: "write", High: "elevated", Critical: "unrestricted"} {
		if tier, err := tb.ToolTier(l); err != nil || tier.Name != want {
			t.Errorf("ToolTier(%s) = %v, %v; want %s", l, tier.Name, err, want)
		}
	}
}

// TestRyeFormatLoadsUnchanged loads a file in the exact shape of Rye OS's
// own capability_risk.yaml and checks Rye's documented outcomes.
func TestRyeFormatLoadsUnchanged(t *testing.T) {
	tb, err := LoadTable("testdata/rye_format.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := tb.TierNames(); !reflect.DeepEqual(got, []string{"safe", "write", "elevated", "unrestricted"}) {
		t.Errorf("tiers %v", got)
	}
	for grant, tier := range map[string]string{
		"rye.*":                       "unrestricted",
		"rye.execute.*":               "elevated",
		"rye.execute.tool.rye.bash.*": "elevated",
		"rye.execute.tool.rye.file-system.fs_write": "write", // most dots wins over rye.execute.*
		"rye.execute.tool.other":                    "elevated",
		"rye.fetch.*":                               "safe",
	} {
		if c := tb.Classify(grant); c.Tier.Name != tier {
			t.Errorf("Classify(%s) = %q, want %q", grant, c.Tier.Name, tier)
		}
	}
	// Rye's file has no tool_levels: the defaults apply.
	if tier, _ := tb.ToolTier(High); tier.Name != "elevated" {
		t.Errorf("ToolTier(HIGH) = %s", tier.Name)
	}
}

func TestClassifyTiesGoToEarlierEntry(t *testing.T) {
	tb, err := ParseTable("t.yaml", []byte(`
risk_levels:
  a: {policy: allow}
  b: {policy: block}
classifications:
  - risk: b
    patterns: ["rye.execute.x.*"]
  - risk: a
    patterns: ["rye.execute.*.y"]
tool_levels: {LOW: a, MED: a, HIGH: b, CRITICAL: b}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c := tb.Classify("rye.execute.x.y"); c.Tier.Name != "b" {
		t.Errorf("tie went to %s, want the earlier entry b", c.Tier.Name)
	}
	if c := tb.Classify("rye.fetch.x"); c.Classified {
		t.Errorf("rye.fetch.x classified as %s, want unclassified", c.Tier.Name)
	}
}

func TestParseTableErrors(t *testing.T) {
	const good = "risk_levels:\n  safe: {policy: allow}\nclassifications: []\n"
	tests := []struct {
		src, want string
	}{
		{"", "r.yaml: empty file"},
		{"- a\n", "r.yaml:1: the file must be a mapping"},
		{good + "extra: 1\n", "r.yaml:4: extra: unknown key; valid keys are"},
		{"classifications: []\n", "r.yaml:1: risk_levels: required"},
		{"risk_levels:\n  safe: {policy: allow}\n", "classifications: required"},
		{"risk_levels:\n  safe: {policy: maybe}\nclassifications: []\n", "r.yaml:2: risk_levels.safe.policy: unknown policy \"maybe\""},
		{"risk_levels:\n  safe: {description: x}\nclassifications: []\n", "r.yaml:2: risk_levels.safe.policy: required"},
		{"risk_levels:\n  safe: {policy: allow, colour: red}\nclassifications: []\n", "risk_levels.safe.colour: unknown key"},
		{"risk_levels:\n  safe: {policy: allow}\nclassifications:\n  - risk: sfe\n    patterns: [rye.*]\n", "r.yaml:4: classifications[0].risk: unknown tier \"sfe\"; tiers are safe"},
		{"risk_levels:\n  safe: {policy: allow}\nclassifications:\n  - risk: safe\n", "classifications[0].patterns: required"},
		{"risk_levels:\n  safe: {policy: allow}\nclassifications:\n  - risk: safe\n    patterns: [\"rye. x\"]\n", "classifications[0].patterns[0]: grant \"rye. x\" contains white space"},
		{"risk_levels:\n  safe: {policy: allow}\nclassifications:\n  - {risk: safe, patterns: [a], why: x}\n", "classifications[0].why: unknown key"},
		{good, "tool_levels.MED: required: the default tier \"write\" is not in risk_levels"},
		{good + "tool_levels: {SEVERE: safe}\n", "tool_levels.SEVERE: unknown risk level"},
		{good + "tool_levels: {LOW: nope}\n", "tool_levels.LOW: unknown tier \"nope\""},
		{"risk_levels:\n  safe: {policy: allow}\n  safe: {policy: block}\nclassifications: []\n", "r.yaml:3:"},
	}
	for _, tt := range tests {
		_, err := ParseTable("r.yaml", []byte(tt.src))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q:\n error %v\n want %q", tt.src, err, tt.want)
		}
	}
}

func TestOperatorFileReplacesDefault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "risk.yaml")
	src := "risk_levels:\n  open: {policy: allow}\nclassifications:\n  - {risk: open, patterns: [\"rye.*\"]}\n" +
		"tool_levels: {LOW: open, MED: open, HIGH: open, CRITICAL: open}\n"
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	tb, err := LoadTable(path)
	if err != nil {
		t.Fatal(err)
	}
	if c := tb.Classify("rye.*"); c.Tier.Name != "open" || c.Tier.Policy != Allow {
		t.Errorf("operator file did not replace the default: %+v", c)
	}
	if _, ok := tb.Tier("unrestricted"); ok {
		t.Error("default tiers leaked into the operator's table")
	}
}

func TestEvaluate(t *testing.T) {
	tb := defaultTable(t)
	grants := []string{"rye.*", "rye.execute.tool.*", "rye.execute.tool.mcp.filesystem.*", "rye.fetch.*"}

	e, err := tb.Evaluate(grants, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Active(); !reflect.DeepEqual(got, grants[2:]) {
		t.Errorf("active = %v, want everything but rye.* and rye.execute.tool.*", got)
	}
	r := e.Grants[0]
	if r.Active || !strings.Contains(r.Refused, "acknowledge unrestricted") {
		t.Errorf("rye.* report %+v: want refused, naming the acknowledgement that allows it", r)
	}
	// Rye: without <acknowledge>, an elevated grant is denied, not warned about.
	if r := e.Grants[1]; r.Active || !strings.Contains(r.Refused, "needs acknowledgement: acknowledge elevated") {
		t.Errorf("rye.execute.tool.* report %+v: want refused, naming the acknowledgement that allows it", r)
	}
	if len(e.Grants[2].Warnings) != 0 {
		t.Errorf("scoped grant warnings %q, want none", e.Grants[2].Warnings)
	}
	if w := strings.Join(e.Grants[3].Warnings, "; "); !strings.Contains(w, "broad grant") {
		t.Errorf("rye.fetch.* warnings %q, want the broad-grant warning", w)
	}

	e, err = tb.Evaluate(grants, []string{"unrestricted", "elevated"})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Active()) != 4 {
		t.Errorf("with acknowledgements active = %v, want all", e.Active())
	}
	for _, g := range e.Grants[:2] {
		if !g.Acknowledged || strings.Contains(strings.Join(g.Warnings, ";"), "acknowledge") {
			t.Errorf("%s: acknowledged=%v warnings=%q", g.Grant, g.Acknowledged, g.Warnings)
		}
	}
	s, err := e.Set()
	if err != nil || !s.Allows("rye.execute.directive.x") {
		t.Errorf("set of acknowledged grants does not allow via rye.*: %v", err)
	}

	if _, err := tb.Evaluate(grants, []string{"elevatd"}); err == nil || !strings.Contains(err.Error(), "tiers are safe, write, elevated, unrestricted") {
		t.Errorf("unknown acknowledgement: %v", err)
	}
	e, _ = tb.Evaluate([]string{"*", "foo.bar"}, nil)
	if e.Grants[0].Active || !strings.Contains(strings.Join(e.Grants[0].Warnings, ";"), "classified as rye.*") {
		t.Errorf("* = %+v: want refused as rye.*", e.Grants[0])
	}
	if !strings.Contains(strings.Join(e.Grants[1].Warnings, ";"), "matches no capability string") {
		t.Errorf("foo.bar warnings %q", e.Grants[1].Warnings)
	}
}
