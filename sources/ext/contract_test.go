package ext

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/capgate/capgate/tool/sourcetest"
)

// TestContract runs the tools.echo pack through the contract every source
// honours.
func TestContract(t *testing.T) {
	sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
		t.Setenv("PIDFILE", filepath.Join(t.TempDir(), "pid")) // slow records its child there
		p := discover(t, Options{MaxOutput: 1000, Env: []string{"PIDFILE"}})["tools.echo"]
		return sourcetest.Harness{
			Source: p,
			Echo:   "echo",
			EchoInput: func(s string) json.RawMessage {
				b, _ := json.Marshal(map[string]string{"msg": s})
				return b
			},
			Fail:    sourcetest.Case{Tool: "fail"},
			Slow:    sourcetest.Case{Tool: "slow"},
			Big:     sourcetest.Case{Tool: "big"},
			Environ: sourcetest.Case{Tool: "environ"},
		}
	})
}
