package harden

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/capgate/capgate/tool"
)

// benchResults are a small clean result, a 4 KiB clean one, and one whose
// keys look suspect (so it is parsed and walked) but hold nothing.
func benchResults() map[string]*tool.Result {
	text := func(s string) json.RawMessage {
		b, _ := json.Marshal(map[string]string{"type": "text", "text": s})
		return b
	}
	return map[string]*tool.Result{
		"small":   {Content: []json.RawMessage{text("echo: hi")}, Structured: json.RawMessage(`{"message":"hi"}`)},
		"4KiB":    {Content: []json.RawMessage{text(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 92))}},
		"suspect": {Structured: json.RawMessage(`{"nextPageToken":"abc","input_tokens":12,"items":[{"id":1},{"id":2}]}`)},
	}
}

func BenchmarkResult(b *testing.B) {
	for name, res := range benchResults() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := Result(res); ok {
					b.Fatal("withheld")
				}
			}
		})
	}
}
