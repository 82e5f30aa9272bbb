package bridge

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/tool/sourcetest"
)

// TestContract runs the fixture bridge through the contract every source
// honours. Its operations take what to do from their input.
func TestContract(t *testing.T) {
	bin := testkit.Build(t, testkit.BridgeFixture)
	sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
		p, err := New(Options{Namespace: "gog", Command: []string{bin}, Timeout: 20 * time.Second, Secret: secret, MaxOutput: 1000})
		if err != nil {
			t.Fatal(err)
		}
		const op = "calendar.list_events"
		return sourcetest.Harness{
			Source: p,
			Echo:   op, // answers with its params, input_data among them
			EchoInput: func(s string) json.RawMessage {
				b, _ := json.Marshal(map[string]string{"msg": s})
				return b
			},
			Fail:    sourcetest.Case{Tool: op, Input: json.RawMessage(`{"fail":true}`)},
			Slow:    sourcetest.Case{Tool: op, Input: json.RawMessage(`{"sleep_ms":15000}`)},
			Big:     sourcetest.Case{Tool: op, Input: json.RawMessage(`{"big_bytes":5000}`)},
			Environ: sourcetest.Case{Tool: op, Input: json.RawMessage(`{"environ":true}`)},
		}
	})
}
