package config

import "testing"

// TestHS256OffBy: serve's banner says which key turned HS256 off; an
// [auth.oidc] table is not called auth.jwks_file.
func TestHS256OffBy(t *testing.T) {
	no, yes := false, true
	for _, tc := range []struct {
		a    Auth
		want string
	}{
		{Auth{}, ""},
		{Auth{OIDC: &OIDC{Issuer: "https://id.example"}}, "auth.oidc"},
		{Auth{JWKSURL: "https://id.example/jwks"}, "auth.jwks_url"},
		{Auth{JWKSFile: "keys.json"}, "auth.jwks_file"},
		{Auth{AllowHS256: &no}, "auth.allow_hs256 = false"},
		{Auth{OIDC: &OIDC{Issuer: "https://id.example"}, AllowHS256: &yes}, ""},
	} {
		if got := tc.a.HS256OffBy(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.a, got, tc.want)
		}
	}
}
