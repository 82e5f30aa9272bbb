package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestFromBuildInfo: the version, revision, time and dirty flag come from
// what the toolchain recorded, and a build that recorded none says so.
func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/capgate/capgate", Version: "v0.0.0-20261126232732-e258cab1d2f3+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "e258cab1d2f3aa00112233445566778899aabbcc"},
			{Key: "vcs.time", Value: "2026-11-26T23:27:32Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	in := FromBuildInfo(bi)
	want := Info{Version: "v0.0.0-20261126232732-e258cab1d2f3+dirty", Revision: "e258cab1d2f3aa00112233445566778899aabbcc",
		Time: "2026-11-26T23:27:32Z", Modified: true, GoVersion: "go1.26.8", Platform: "linux/arm64"}
	if in != want {
		t.Fatalf("FromBuildInfo:\n got %+v\nwant %+v", in, want)
	}
	s := in.String()
	for _, p := range []string{"capgate v0.0.0-20261126232732-e258cab1d2f3+dirty\n", "revision  e258cab1d2f3aa00112233445566778899aabbcc (modified)", "committed 2026-11-26T23:27:32Z", "go        go1.26.8 linux/arm64"} {
		if !strings.Contains(s, p) {
			t.Errorf("String() lacks %q:\n%s", p, s)
		}
	}

	none := FromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}})
	if none.Version != "(devel)" || none.Revision != "" || none.Modified {
		t.Errorf("a build without VCS info: %+v", none)
	}
	if s := none.String(); !strings.Contains(s, "revision  unknown (not recorded") {
		t.Errorf("a build without VCS info does not say its revision is unknown:\n%s", s)
	}
	if FromBuildInfo(nil).Version != "(devel)" {
		t.Error("no build info at all is not (devel)")
	}
}
