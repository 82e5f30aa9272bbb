package harden

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/capgate/capgate/tool"
)

func TestCredentialKey(t *testing.T) {
	for _, k := range []string{"access_token", "accessToken", "ACCESS_TOKEN", "access-token", "Access Token",
		"cookieJar", "clientSecret", "proxy-authorization", "Proxy-Authorization", "X-Api-Key", "set-cookie",
		"private_key", "PASSWORD", "dbPassword", "jwt", "github_access_token", "webhook.secret", "APIKey", "aws_secret_access_key",
		// issue 24: a bare token, plurals, separators inside a word, confusable letters
		"token", "Token", "secretKey", "credentials", "google_credentials", "access_tokens", "pass_word", "p-a-s-s-w-o-r-d",
		"p\u0430ssword", "\u0430ccess_token", "\u0410PI_KEY", "ｐａｓｓｗｏｒｄ", "master_p\u0430ssword"} {
		if !CredentialKey(k) {
			t.Errorf("%q is not read as a credential key", k)
		}
	}
	for _, k := range []string{"nextPageToken", "input_tokens", "tokens", "tokens_used", "key", "id", "password_policy", "aws_access_key_id",
		"cookie_policy", "secretary_name", "passage", "credential_id", "token_type", "csrf_token", "p\u0430ssage", "имя"} {
		if CredentialKey(k) {
			t.Errorf("%q is read as a credential key", k)
		}
	}
}

func TestJSON(t *testing.T) {
	deep := strings.Repeat(`{"a":`, MaxDepth+2) + `{"access_token":"s3cr3t"}` + strings.Repeat(`}`, MaxDepth+2)
	shallow := strings.Repeat(`{"a":`, 10) + `{"accessToken":"s3cr3t"}` + strings.Repeat(`}`, 10)
	inString, _ := json.Marshal(map[string]string{"text": `result: {"clientSecret": "s3cr3t"} done`})
	for _, tc := range []struct {
		doc, finding string
	}{
		{`{"user":{"accessToken":"s3cr3t"}}`, "(accessToken)"},
		{`[{"X-Api-Key":"s3cr3t"}]`, "(X-Api-Key)"},
		{`{"acc\u0065ss_token":"s3cr3t"}`, "(access_token)"},
		{shallow, "(accessToken)"},
		{deep, "nested deeper than 64"},
		{`{"type":"text","text":"{\"refresh_token\":\"s3cr3t\"}"}`, "(refresh_token)"},
		{string(inString), "(clientSecret)"},
		{`{"text":"-----BEGIN RSA PRIVATE KEY-----\nMIIE..."}`, "PEM private key"},
		{`{"text":"use Authorization: Bearer abcdef0123456789abcdef please"}`, "bearer token"},
		{`{"text":"ghp_0123456789abcdefghijklmnopqrstuvwxyz"}`, "GitHub token"},
		{`{"text":"AKIAIOSFODNN7EXAMPLE"}`, "AWS access key id"},
		{`{"text":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.sig"}`, "JSON Web Token"},
		{`{"password": "abc`, "not valid JSON"},
		// issue 24
		{`{"token":"s3cr3t"}`, "(token)"},
		{`{"secretKey":"s3cr3t"}`, "(secretKey)"},
		{`{"credentials":{"user":"u","pw":"s3cr3t"}}`, "(credentials)"},
		{`{"access_tokens":["s3cr3t"]}`, "(access_tokens)"},
		{`{"pass_word":"s3cr3t"}`, "(pass_word)"},
		{`{"pаssword":"s3cr3t"}`, "(pаssword)"},
		{`{"pаssword":"s3cr3t"}`, "(pаssword)"},
		{`{"env":[{"name":"HOME","value":"/root"},{"name":"DB_PASSWORD","value":"s3cr3t"}]}`, "(DB_PASSWORD)"},
		{`{"Tags":[{"Key":"api_key","Value":"s3cr3t"}]}`, "(api_key)"},
		{`{"text":"app token xapp-1-A0123456789-0123456789012-abcdefs3cr3t"}`, "Slack token"},
		{`{"text":"ya29.a0AfH6SMBs3cr3tXXXXXXXXXXXXXXXXXXXX"}`, "Google OAuth token"},
		{`{"text":"sk_test_4eC39HqLyjWDarjtT1zdp7dc"}`, "Stripe secret key"},
		{`{"text":"rk_test_4eC39HqLyjWDarjtT1zdp7dc"}`, "Stripe secret key"},
		{`{"url":"https://x.test/cb?id_token=eyJhbGciOiJIUzI1NiJ9%2EeyJzdWIiOiJhbGljZSJ9%2Esig"}`, "JSON Web Token, percent-encoded"},
		{`{"url":"https://x.test/cb?t=%65%79%4AhbGciOiJIUzI1NiJ9%252EeyJzdWIiOiJhbGljZSJ9%252Esig&bad=%zz"}`, "JSON Web Token, percent-encoded"},
	} {
		f, ok := JSON([]byte(tc.doc))
		if !ok || !strings.Contains(f, tc.finding) || strings.Contains(f, "s3cr3t") {
			t.Errorf("%.60s: %q %v, want %q", tc.doc, f, ok, tc.finding)
		}
	}
	for _, doc := range []string{
		`{"nextPageToken":"abc","input_tokens":12,"items":[]}`,
		`{"hasPassword":true,"secret":false}`,
		`{"text":"the access_token parameter is required; pass a Bearer token"}`,
		`{"text":"Asia/Tokyo"}`,
		// issue 24: ordinary words and counts survive
		`{"usage":{"tokens_used":1532,"input_tokens":12,"tokens":40},"passage":"The pass word is spoken at the gate."}`,
		`{"token":3,"page":{"name":"credentials page","value":"see the docs"}}`,
		`{"name":"HOME","value":"/root"}`,
		`{"text":"Привет, мир: пароль не нужен"}`,
		`{"url":"https://example.test/search?q=a%20b%2Fc"}`,
		`{"text":"task_test_runner and desk_live_view"}`,
		strings.Repeat(`[`, 200) + strings.Repeat(`]`, 200),
	} {
		if f, ok := JSON([]byte(doc)); ok {
			t.Errorf("%.60s withheld: %s", doc, f)
		}
	}
}

func TestMessage(t *testing.T) {
	for _, m := range []string{"login failed: password=hunter2", "bad client_secret: s3cr3t-value", `upstream said {"api_key":"s3cr3t"}`,
		"Authorization: Bearer abcdef0123456789abcdef"} {
		f, ok := Message(m)
		if !ok || strings.Contains(f, "hunter2") || strings.Contains(f, "s3cr3t") {
			t.Errorf("%q: %q %v", m, f, ok)
		}
	}
	for _, m := range []string{"daily quota exceeded", "missing access_token", "token: null"} {
		if f, ok := Message(m); ok {
			t.Errorf("%q withheld: %s", m, f)
		}
	}
	err := CheckMessage("bridge gog", "password=hunter2")
	if tool.ErrorCode(err) != tool.CodeInvalidOutput || strings.Contains(tool.ErrorMessage(err), "hunter2") ||
		!strings.Contains(tool.ErrorMessage(err), "(password)") {
		t.Errorf("CheckMessage: %v", err)
	}
}
