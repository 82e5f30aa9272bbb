//go:build linux

package sandbox

import (
	"strings"
	"testing"
)

// TestAuditRecordsReachTheirLaunch: Landlock's records, as the kernel
// writes them (an access before its domain's record, a path in hex), reach
// the Denials of the launch whose tag the domain's maker took, and the
// error names the file and the declaration that would allow it.
func TestAuditRecordsReachTheirLaunch(t *testing.T) {
	w := &auditWatch{tags: map[string]*tagged{}, domains: map[string]*tagged{}, pending: map[string][]FileDenial{}}
	var d, other Denials
	w.tags["cg0011223344aa"] = &tagged{d: &d, done: make(chan struct{})}
	for _, r := range []struct {
		typ  uint16
		text string
	}{
		{auditLandlockAccess, `audit(1.5:26): domain=1b9 blockers=fs.read_file path="/sys/kernel/mm/transparent_hugepage/hpage_pmd_size" dev="sysfs" ino=3819`},
		{auditLandlockDomain, `audit(1.5:26): domain=1b9 status=allocated mode=enforcing pid=25896 uid=0 exe="/usr/bin/capgate" comm="cg0011223344aa"`},
		{auditLandlockAccess, `audit(1.6:27): domain=1b9 blockers=fs.write_file path=2F7372762F6F7574206469722F78 dev="vda" ino=1`},
		{auditLandlockAccess, `audit(1.6:28): domain=2c0 blockers=fs.read_file path="/etc/shadow" dev="vda" ino=2`},
		{auditLandlockDomain, `audit(1.7:29): domain=1b9 status=deallocated denials=2`},
	} {
		w.record(r.typ, r.text)
	}
	g, _ := Derive(Declared{Filesystem: "read"}, Overrides{}, Declared{})
	msg, hint := d.Explain(g, "bridge:gog", "capabilities of [capabilities.providers.gog]")
	if msg != "the kernel refused it writing /srv/out dir/x (fs.write_file)" ||
		hint != `declare filesystem: write with write_paths: ["/srv/out dir"] in capabilities of [capabilities.providers.gog]` {
		t.Errorf("msg %q\nhint %q", msg, hint)
	}
	if msg, _ := other.Explain(g, "", ""); msg != "" || strings.Contains(msg, "shadow") {
		t.Errorf("another domain's denial reached a launch: %q", msg)
	}
}
