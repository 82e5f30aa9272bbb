// Package buildinfo says which capgate this is, from what the Go toolchain
// recorded in the binary (runtime/debug): the module version, the VCS
// revision and whether the tree was modified. Nothing here is maintained
// by hand.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// Info is what `capgate version --json` prints.
type Info struct {
	// Version is the main module's version: a tag (v1.2.3), a
	// pseudo-version that go build derives from the VCS
	// (v0.0.0-20261126232732-e258cab1d2f3+dirty), or "(devel)" when the
	// build recorded none (go run, go test, -buildvcs=false).
	Version string `json:"version"`
	// Revision is the VCS commit the binary was built from; empty when
	// the build recorded none.
	Revision string `json:"revision,omitempty"`
	// Time is the commit's time (RFC 3339), as recorded.
	Time string `json:"time,omitempty"`
	// Modified: the working tree had changes not in Revision.
	Modified  bool   `json:"modified"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"` // GOOS/GOARCH
}

// Get reads the binary's build info once.
var Get = sync.OnceValue(func() Info {
	bi, _ := debug.ReadBuildInfo()
	return FromBuildInfo(bi)
})

// Version is Get().Version: what capgate calls itself in MCP serverInfo,
// traces and its banner.
func Version() string { return Get().Version }

// FromBuildInfo reads bi (nil: nothing recorded).
func FromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: "(devel)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		return in
	}
	if bi.Main.Version != "" {
		in.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
	var goos, goarch string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	if goos != "" && goarch != "" {
		in.Platform = goos + "/" + goarch
	}
	return in
}

// String is what `capgate version` and `capgate --version` print.
func (in Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "capgate %s\n", in.Version)
	switch {
	case in.Revision == "":
		// Say why, so nobody mistakes it for a released build.
		b.WriteString("  revision  unknown (not recorded: go run, -buildvcs=false, or not a plain git clone)\n")
	default:
		rev := in.Revision
		if in.Modified {
			rev += " (modified)"
		}
		fmt.Fprintf(&b, "  revision  %s\n", rev)
		if in.Time != "" {
			fmt.Fprintf(&b, "  committed %s\n", in.Time)
		}
	}
	fmt.Fprintf(&b, "  go        %s %s\n", in.GoVersion, in.Platform)
	return b.String()
}
