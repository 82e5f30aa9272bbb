package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/authmcp"
)

// TestUpstreamOAuthReload: `capgate reload` gives the running serve's
// broker the new [mcp.servers] with auth. A server added with auth =
// "oauth" is served at once: its link (printed by the CLI) opens and
// completes on the serve, and the user's calls to it carry their own
// token; a server removed is no longer linked through links given before.
func TestUpstreamOAuthReload(t *testing.T) {
	t.Parallel()
	o := startOAuthServe(t)
	wiki := authmcp.Start(t, o.as.Issuer)
	bobTracker := linkRe.FindString(o.cli(t, "accounts", "link", "tracker", "--sub", "bob"))

	raw, err := os.ReadFile(o.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(raw), `"rye.execute.tool.mcp.tracker.*"]`, `"rye.execute.tool.mcp.tracker.*", "rye.execute.tool.mcp.wiki.*"]`, 1)
	cfg += fmt.Sprintf("\n[mcp.servers.wiki]\nurl = %q\nauth = \"oauth\"\n[mcp.servers.wiki.tools.whoami]\nrisk = \"LOW\"\n", wiki.URL)
	reload := func(cfg string, n int) {
		t.Helper()
		if err := os.WriteFile(o.ConfigPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		if out := o.cli(t, "reload"); !strings.Contains(out, "sent SIGHUP") {
			t.Fatalf("capgate reload: %s", out)
		}
		if !testkit.Poll(60*time.Second, func() bool { return strings.Count(o.Logs(), "reload applied") >= n }) {
			t.Fatalf("serve did not apply the reload:\n%s", o.Logs())
		}
	}
	reload(cfg, 1)

	link := linkRe.FindString(o.cli(t, "accounts", "link", "wiki", "--sub", "alice"))
	if status, page := o.as.Visit(t, "alice-upstream", link); status != 200 || !strings.Contains(page, "<b>alice</b> is now linked to account <b>alice-upstream</b> on <b>wiki</b>") {
		t.Fatalf("alice's wiki link on the reloaded serve: %d\n%s", status, page)
	}
	testkit.WaitFor(t, 30*time.Second, "alice's call to wiki", func() bool {
		who, _, _ := o.invokeCap(t, "alice", "mcp:wiki:whoami", "w1")
		return who == "alice-upstream"
	})
	if _, code, authURL := o.invokeCap(t, "bob", "mcp:wiki:whoami", "w2"); code != "capability_auth_required" || !linkRe.MatchString(authURL) {
		t.Errorf("bob, unlinked on wiki: %q %q", code, authURL)
	}

	// tracker removed: the link bob was given before leads nowhere.
	trackerAt := strings.Index(cfg, "[mcp.servers.tracker]")
	end := strings.Index(cfg[trackerAt:], "[mcp.servers.wiki]")
	if trackerAt < 0 || end < 0 {
		t.Fatalf("the config has no tracker before wiki:\n%s", cfg)
	}
	cfg = cfg[:trackerAt] + cfg[trackerAt+end:]
	cfg = strings.Replace(cfg, `"rye.execute.tool.mcp.tracker.*", `, "", 1)
	reload(cfg, 2)
	if status, page := o.as.Visit(t, "bob-upstream", bobTracker); status == 200 || strings.Contains(page, "is now linked") {
		t.Errorf("a tracker link after tracker was removed: %d\n%s", status, page)
	}
	if who, code, _ := o.invokeCap(t, "alice", "mcp:wiki:whoami", "w3"); who != "alice-upstream" {
		t.Errorf("alice on wiki after the second reload: %q %q", who, code)
	}
}
