package ext

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/capgate/capgate/tool/sourcetest"
)

// TestContract runs the conformance pack (testdata/contract) through the
// contract every source honours.
func TestContract(t *testing.T) {
	sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
		// wait outlasts the cancel the contract makes, well under Timeout.
		p, err := Load("testdata/contract/conformance", Options{MaxOutput: 1000, Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return sourcetest.Harness{
			Source: p,
			Echo:   "echo",
			EchoInput: func(s string) json.RawMessage {
				b, _ := json.Marshal(map[string]string{"msg": s})
				return b
			},
			Fail:    sourcetest.Case{Tool: "fail"},
			Slow:    sourcetest.Case{Tool: "wait"},
			Big:     sourcetest.Case{Tool: "bigjson"},
			Environ: sourcetest.Case{Tool: "environ"},
		}
	})
}
