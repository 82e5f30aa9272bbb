package risk

import (
	"encoding/json"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestLevelOrderAndText(t *testing.T) {
	if !(Low < Med && Med < High && High < Critical) {
		t.Fatal("levels are not ordered LOW < MED < HIGH < CRITICAL")
	}
	for _, tt := range []struct {
		in   string
		want Level
	}{{"LOW", Low}, {"low", Low}, {"MED", Med}, {"medium", Med}, {" High ", High}, {"CRITICAL", Critical}} {
		got, err := ParseLevel(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	if _, err := ParseLevel("severe"); err == nil || !strings.Contains(err.Error(), "LOW, MED, HIGH, CRITICAL") {
		t.Errorf("ParseLevel(severe) error = %v", err)
	}
}

func TestLevelJSONAndYAML(t *testing.T) {
	type doc struct {
		Level   Level        `json:"level" yaml:"level"`
		Effects []SideEffect `json:"effects" yaml:"effects"`
	}
	in := doc{Level: High, Effects: []SideEffect{FSWrite, NetworkHTTP}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"level":"HIGH","effects":["fs.write","network.http"]}` {
		t.Errorf("json = %s", b)
	}
	var out doc
	if err := json.Unmarshal(b, &out); err != nil || out.Level != High || len(out.Effects) != 2 {
		t.Errorf("json round trip: %+v, %v", out, err)
	}
	y, err := yaml.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var outY doc
	if err := yaml.Unmarshal(y, &outY); err != nil || outY.Level != High || outY.Effects[0] != FSWrite {
		t.Errorf("yaml round trip of %s: %+v, %v", y, outY, err)
	}
	if err := yaml.Unmarshal([]byte("level: MEDIUM\n"), &outY); err != nil || outY.Level != Med {
		t.Errorf("yaml MEDIUM: %v, %v", outY.Level, err)
	}
	// Unknown values are errors in both encodings.
	if err := json.Unmarshal([]byte(`{"level":"SEVERE"}`), &out); err == nil {
		t.Error("json accepted level SEVERE")
	}
	if err := json.Unmarshal([]byte(`{"effects":["fs.wipe"]}`), &out); err == nil || !strings.Contains(err.Error(), "fs.wipe") {
		t.Errorf("json effects fs.wipe: %v", err)
	}
	if err := yaml.Unmarshal([]byte("effects: [net]\n"), &outY); err == nil || !strings.Contains(err.Error(), "valid side effects are") {
		t.Errorf("yaml effects net: %v", err)
	}
}

func TestSideEffects(t *testing.T) {
	if len(SideEffects) != 17 {
		t.Errorf("%d side effects, DESIGN.md names 17", len(SideEffects))
	}
	_, err := ParseSideEffects([]string{"fs.read", "fs.wipe"})
	if err == nil || !strings.Contains(err.Error(), "side_effects[1]") {
		t.Errorf("error %v does not name the position", err)
	}
	if !FSDelete.Writes() || FSRead.Writes() || NetworkHTTP.Writes() {
		t.Error("Writes misclassifies")
	}
}
