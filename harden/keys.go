package harden

import (
	"regexp"
)

// NormalizeKey folds a key's spellings into one: lower case, with every
// byte that is not a letter or digit dropped. accessToken, access-token,
// ACCESS_TOKEN and "Access Token" all read "accesstoken"; dropping the
// separators makes splitting camelCase unnecessary.
func NormalizeKey(k string) string {
	return string(appendNormal(make([]byte, 0, len(k)), k))
}

func appendNormal(dst []byte, k string) []byte {
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case 'A' <= c && c <= 'Z':
			dst = append(dst, c+'a'-'A')
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
			dst = append(dst, c)
		}
	}
	return dst
}

// exactKeys are credentials only as the whole key. A bare "token" is not
// among them: it is as often a page or CSRF token, and a real one is
// usually caught by its format (tokenFormats).
var exactKeys = map[string]bool{"jwt": true, "bearer": true}

// suffixKeys are credentials however they are prefixed: github_access_token,
// X-Api-Key, dbPassword, Proxy-Authorization, webhook_secret.
var suffixKeys = []string{
	"accesstoken", "refreshtoken", "idtoken", "authtoken", "sessiontoken", "bearertoken",
	"apitoken", "oauthtoken", "securitytoken", "secret", "apikey", "privatekey", "accesskey",
	"password", "passwd", "passphrase", "cookie", "cookies", "cookiejar", "authorization",
}

// CredentialKey reports whether a key names a credential, however it is
// spelled (see NormalizeKey).
func CredentialKey(k string) bool {
	var buf [64]byte // most keys fold on the stack
	n := appendNormal(buf[:0], k)
	if exactKeys[string(n)] {
		return true
	}
	for _, s := range suffixKeys {
		if len(n) >= len(s) && string(n[len(n)-len(s):]) == s {
			return true
		}
	}
	return false
}

// tokenFormats are credentials recognisable in plain text. Only formats
// specific enough that prose does not match them are here: text is
// withheld on a match, and a false positive costs a tool's answer.
var tokenFormats = []struct {
	name string
	re   *regexp.Regexp
}{
	{"a PEM private key", regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----`)},
	{"a bearer token", regexp.MustCompile(`(?i)\bbearer\s+[A-Za-z0-9\-._~+/]*[0-9][A-Za-z0-9\-._~+/]*`)},
	{"a GitHub token", regexp.MustCompile(`\b(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})`)},
	{"an AWS access key id", regexp.MustCompile(`\b(AKIA|ASIA)[0-9A-Z]{16}\b`)},
	{"a Slack token", regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`)},
	{"a JSON Web Token", regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.`)},
	{"a Stripe secret key", regexp.MustCompile(`\b[sr]k_live_[A-Za-z0-9]{16,}`)},
	{"a Google API key", regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{35}`)},
}

// tokenFormat names the first token format s holds.
func tokenFormat(s string) (string, bool) {
	for _, f := range tokenFormats {
		if m := f.re.FindString(s); m != "" && (f.name != "a bearer token" || len(m) >= len("bearer ")+16) {
			return f.name, true
		}
	}
	return "", false
}
