package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/buildinfo"
	"github.com/capgate/capgate/internal/testkit"
)

// TestVersionFromBuildInfo builds capgate from this checkout as a user
// would (go build, VCS stamping on) and checks that `capgate version`,
// `--version` and `version --json` name the commit it was built from, the
// dirty flag git would give, and the Go that built it: all read from the
// binary's build info, none written by hand.
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", args...).Output()
		return strings.TrimSpace(string(out)), err
	}
	head, err := git("rev-parse", "HEAD")
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("not a git checkout (git rev-parse HEAD: %v)", err)
		}
		t.Fatalf("CI runs from a clone, yet git rev-parse HEAD fails: %v", err)
	}
	gitDir, _ := git("rev-parse", "--absolute-git-dir")
	common, _ := git("rev-parse", "--path-format=absolute", "--git-common-dir")
	status, err := git("status", "--porcelain")
	if err != nil {
		t.Fatal(err)
	}
	dirtyKnown := true
	// What go build stamps besides the packages: the commit, the tags it
	// derives a version from, whether the tree is modified, and whether
	// this is a linked worktree (where it stamps nothing).
	tags, _ := git("describe", "--tags", "--long", "--always")
	stamp := fmt.Sprintf("%s %s %v %v", head, tags, status != "", gitDir != common)
	bin := testkit.BuildStamped(t, testkit.CapgatePkg, stamp, t.TempDir())
	if after, _ := git("status", "--porcelain"); after != status {
		dirtyKnown = false
		t.Log("the working tree changed during the build; not checking the dirty flag")
	}
	runBin := func(args ...string) string {
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			t.Fatalf("capgate %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	var in buildinfo.Info
	if err := json.Unmarshal([]byte(runBin("version", "--json")), &in); err != nil {
		t.Fatalf("version --json: %v", err)
	}
	if gitDir != common {
		// A linked worktree (.git is a file): go build records no VCS
		// information there, and capgate must say so, not make one up.
		if in.Revision != "" || in.Version != "(devel)" {
			t.Errorf("built in a git worktree, where go records no VCS info, yet version --json says %+v", in)
		}
		if text := runBin("version"); !strings.Contains(text, "revision  unknown (not recorded") {
			t.Errorf("capgate version does not say the revision is unknown:\n%s", text)
		}
		t.Skip("a linked git worktree: go build records no VCS information; the revision checks run in a plain clone")
	}
	if in.Revision != head {
		t.Errorf("revision %q, want HEAD %s", in.Revision, head)
	}
	if dirtyKnown && in.Modified != (status != "") {
		t.Errorf("modified %v, yet git status --porcelain says %q", in.Modified, status)
	}
	// go build derives a pseudo-version from the commit (or a tag's name).
	if !strings.HasPrefix(in.Version, "v") || (!strings.Contains(in.Version, head[:12]) && !strings.HasPrefix(in.Version, "v1")) {
		t.Errorf("version %q is neither a tag nor a pseudo-version of %s", in.Version, head[:12])
	}
	if strings.HasSuffix(in.Version, "+dirty") != in.Modified {
		t.Errorf("version %q and modified %v disagree", in.Version, in.Modified)
	}
	if in.GoVersion != runtime.Version() || in.Platform != runtime.GOOS+"/"+runtime.GOARCH || in.Time == "" {
		t.Errorf("version --json %+v: want go %s on %s/%s and a commit time", in, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	text := runBin("version")
	if flag := runBin("--version"); flag != text {
		t.Errorf("--version %q, version %q", flag, text)
	}
	for _, p := range []string{"capgate " + in.Version + "\n", "revision  " + head, "go        " + runtime.Version()} {
		if !strings.Contains(text, p) {
			t.Errorf("capgate version lacks %q:\n%s", p, text)
		}
	}
}
