package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigReferenceIsCurrent: docs/config.md is what the generator
// writes from package config now. When it fails, run
// go run ./internal/configref > docs/config.md.
func TestConfigReferenceIsCurrent(t *testing.T) {
	want, err := generate(filepath.Join("..", "..", "config"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/config.md is not current: run go run ./internal/configref > docs/config.md")
	}
}

// TestConfigReferenceNamesEveryKey: every section and key of the sample
// config the tests of package config load is in the reference, with its
// doc comment and default.
func TestConfigReferenceNamesEveryKey(t *testing.T) {
	ref, err := generate(filepath.Join("..", "..", "config"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## [server]", "| `watch_config` | bool |", "| `listen` | string | `127.0.0.1:8787` |",
		"## [auth.oidc]", "## [policy.rate_limit]", "| `per_minute` | number |",
		"## [mcp.servers.NAME]", "| `timeout` | duration (\"30s\", \"2m\") | `1m` | default 60s |",
		"## [mcp.servers.NAME.tools.TOOL]", "## [capabilities.providers.NS]", "| `timeout_seconds` | integer | `30` |",
		"## [skills.NAME]", "## [skills]", "| `dirs` | list of strings |", "## [capability_overrides.ID]", "## [trust]",
		"| `max_size` | size (\"8MiB\", \"512KiB\", bytes) | `64MiB` |",
		"WatchConfig reloads the config when it",
	} {
		if !strings.Contains(string(ref), want) {
			t.Errorf("the reference lacks %q", want)
		}
	}
}
