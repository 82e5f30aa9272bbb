package config

import (
	"strings"
	"testing"
)

// Every capabilities table, override and the trust ceiling is checked at
// load, and an error names the file and the key as written.
func TestGuaranteeKeysAreChecked(t *testing.T) {
	ok := `
[mcp.servers.files]
command = "files-server"
capabilities = { filesystem = "none", network = "none" }

[capabilities.providers.gog]
command = ["gogcli", "bridge"]
capabilities = { subprocess = "none", secrets = ["GOG_TOKEN"] }

[capability_overrides."ext:tools:get"]
no_network = true
allow_unsafe_execution = true

[trust]
allowed_capabilities = { filesystem = "read" }
`
	c, err := parse(t, ok, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.MCP.Servers["files"].Capabilities["network"] != "none" || c.Capabilities.Providers["gog"].Capabilities["subprocess"] != "none" ||
		c.CapabilityOverrides["ext:tools:get"]["no_network"] != true || c.Trust.AllowedCapabilities["filesystem"] != "read" {
		t.Errorf("decoded %+v %+v %+v %+v", c.MCP.Servers["files"].Capabilities, c.Capabilities.Providers["gog"].Capabilities,
			c.CapabilityOverrides, c.Trust)
	}
	for _, tc := range []struct{ src, want string }{
		{"[mcp.servers.files]\ncommand = \"x\"\ncapabilities = { network = \"sometimes\" }\n",
			`capgate.toml: mcp.servers.files.capabilities.network: "sometimes" is not one of none|outbound`},
		{"[mcp.servers.web]\nurl = \"https://example.com/mcp\"\ncapabilities = { network = \"none\" }\n",
			"capgate.toml: mcp.servers.web.capabilities: a server reached by url"},
		{"[capabilities.providers.gog]\ncommand = [\"x\"]\ncapabilities = { disk = \"none\" }\n",
			`capgate.toml: capabilities.providers.gog.capabilities: unknown key "disk"`},
		{"[capability_overrides.\"ext:tools:get\"]\nno_network = \"yes\"\n",
			`capgate.toml: capability_overrides."ext:tools:get".no_network: want true or false`},
		{"[trust]\nallowed_capabilities = { env = \"all\" }\n",
			`capgate.toml: trust.allowed_capabilities.env: "all" is not one of none|read`},
	} {
		_, err := parse(t, tc.src, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.src, err, tc.want)
		}
	}
}
