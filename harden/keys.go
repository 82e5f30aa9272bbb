package harden

import (
	"regexp"
	"strings"
	"sync"

	"github.com/mtibben/confusables"
	"golang.org/x/text/unicode/norm"
)

// NormalizeKey folds a key's spellings into one: lower case, with every
// byte that is not a letter or digit dropped. accessToken, access-token,
// ACCESS_TOKEN and "Access Token" all read "accesstoken"; dropping the
// separators makes splitting camelCase unnecessary. A key with letters
// outside ASCII is first lowered, put in NFKC and mapped to its Unicode
// TR39 skeleton (github.com/mtibben/confusables: Unicode 13's
// confusables.txt), so that a Cyrillic "а" or a fullwidth "ａ" reads as
// "a": "pаssword" is "password". ASCII keys are not mapped ("passw0rd"
// stays itself): the skeleton is for letters from other scripts. The skeleton maps
// some ASCII too ("m" to "rn"), so such keys are matched against the
// skeletons of the credential words (skeletonKeys), never mixed.
func NormalizeKey(k string) string {
	if !isASCII(k) {
		return skeletonNormal(k)
	}
	return string(appendNormal(make([]byte, 0, len(k)), k))
}

// skeletonNormal is k lowered, in NFKC (fullwidth letters become ASCII),
// mapped to its skeleton, then folded.
func skeletonNormal(k string) string {
	return string(appendNormal(nil, confusables.Skeleton(norm.NFKC.String(strings.ToLower(k)))))
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

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// credentialWords says which keys are credentials.
type credentialWords struct {
	// exact are credentials only as the whole key: a bare "token" is one
	// (withheld unless it holds a boolean or a number: a count is no
	// credential), but "tokens", "tokens_used", "nextPageToken" and
	// "csrf_token" are not.
	exact map[string]bool
	// suffix are credentials however they are prefixed, and in the
	// plural: github_access_token, access_tokens, X-Api-Key, dbPassword,
	// Proxy-Authorization, webhook_secret, secretKey, credentials.
	suffix []string
}

var asciiKeys = credentialWords{
	exact: map[string]bool{"jwt": true, "bearer": true, "token": true},
	suffix: []string{
		"accesstoken", "refreshtoken", "idtoken", "authtoken", "sessiontoken", "bearertoken",
		"apitoken", "oauthtoken", "securitytoken", "secret", "apikey", "privatekey", "accesskey", "secretkey",
		"password", "passwd", "passphrase", "cookie", "cookies", "cookiejar", "authorization", "credential",
	},
}

// weakKeys are the exact keys under which a number is no credential.
var weakKeys = map[string]bool{"token": true}

// skeletonKeys are asciiKeys as NormalizeKey reads a non-ASCII key.
// This and tokenFormats are made on first use, not in every capgate
// start's package inits (the sandbox trampoline's included).
var skeletonKeys = sync.OnceValue(func() credentialWords {
	w := credentialWords{exact: map[string]bool{}}
	for k := range asciiKeys.exact {
		w.exact[skeletonNormal(k)] = true
	}
	for _, k := range asciiKeys.suffix {
		w.suffix = append(w.suffix, skeletonNormal(k))
	}
	return w
})

func (w credentialWords) match(n []byte) bool {
	if w.exact[string(n)] {
		return true
	}
	for _, s := range w.suffix {
		if hasSuffix(n, s) || len(n) > 0 && n[len(n)-1] == 's' && hasSuffix(n[:len(n)-1], s) {
			return true
		}
	}
	return false
}

func hasSuffix(n []byte, s string) bool {
	return len(n) >= len(s) && string(n[len(n)-len(s):]) == s
}

// CredentialKey reports whether a key names a credential, however it is
// spelled (see NormalizeKey).
func CredentialKey(k string) bool {
	if !isASCII(k) {
		return skeletonKeys().match([]byte(NormalizeKey(k)))
	}
	var buf [64]byte // most keys fold on the stack
	return asciiKeys.match(appendNormal(buf[:0], k))
}

// weakKey reports whether k is a credential key under which a number may
// pass (see weakKeys).
func weakKey(k string) bool {
	var buf [64]byte
	return isASCII(k) && weakKeys[string(appendNormal(buf[:0], k))]
}

// tokenFormats are credentials recognisable in plain text. Only formats
// specific enough that prose does not match them are here: text is
// withheld on a match, and a false positive costs a tool's answer.
type tokenFormatRe struct {
	name string
	re   *regexp.Regexp
}

var tokenFormats = sync.OnceValue(func() []tokenFormatRe {
	return []tokenFormatRe{
		{"a PEM private key", regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----`)},
		{"a bearer token", regexp.MustCompile(`(?i)\bbearer\s+[A-Za-z0-9\-._~+/]*[0-9][A-Za-z0-9\-._~+/]*`)},
		{"a GitHub token", regexp.MustCompile(`\b(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})`)},
		{"an AWS access key id", regexp.MustCompile(`\b(AKIA|ASIA)[0-9A-Z]{16}\b`)},
		{"a Slack token", regexp.MustCompile(`\b(xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[0-9]+-[A-Za-z0-9-]{10,})`)},
		{"a Google OAuth token", regexp.MustCompile(`\bya29\.[0-9A-Za-z_-]{24,}`)},
		{"a JSON Web Token", regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.`)},
		{"a Stripe secret key", regexp.MustCompile(`\b[sr]k_(live|test)_[A-Za-z0-9]{16,}`)},
		{"a Google API key", regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{35}`)},
	}
})

// tokenFormat names the first token format s holds.
func tokenFormat(s string) (string, bool) {
	for _, f := range tokenFormats() {
		if m := f.re.FindString(s); m != "" && (f.name != "a bearer token" || len(m) >= len("bearer ")+16) {
			return f.name, true
		}
	}
	return "", false
}
