package httpadmit

import (
	"maps"
	"testing"
)

// TestBearerChallenge reads the auth-params of Bearer challenges only:
// tokens, quoted strings with escapes and commas, names lower-cased.
func TestBearerChallenge(t *testing.T) {
	got := BearerChallenge([]string{
		`Basic realm="not this one"`,
		`Bearer resource_metadata="http://h/.well-known/oauth-protected-resource/mcp", Error=invalid_token, error_description="say \"no\", twice"`,
	})
	want := map[string]string{"resource_metadata": "http://h/.well-known/oauth-protected-resource/mcp", "error": "invalid_token", "error_description": `say "no", twice`}
	if !maps.Equal(got, want) {
		t.Errorf("BearerChallenge:\n got %q\nwant %q", got, want)
	}
	if got := BearerChallenge([]string{"Bearer"}); len(got) != 0 {
		t.Errorf("a bare Bearer challenge: %q", got)
	}
}
