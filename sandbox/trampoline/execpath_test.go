//go:build linux

package trampoline

import (
	"path/filepath"
	"testing"
)

// TestExecPathIsRelUnderWd: execPath, written without path/filepath (which
// would init late), gives what filepath.Rel gave: the program relative to
// the working directory when it is below it, else its path as it is.
func TestExecPathIsRelUnderWd(t *testing.T) {
	want := func(prog, wd string) string {
		if wd == "" || !filepath.IsAbs(prog) || !under(filepath.Clean(prog), wd) {
			return prog
		}
		rel, err := filepath.Rel(wd, prog)
		if err != nil {
			return prog
		}
		return "./" + rel
	}
	for _, c := range []struct{ prog, wd string }{
		{"/root/pack/tool.sh", "/root/pack"},
		{"/root/pack/bin/tool", "/root/pack"},
		{"/root/pack//bin/./tool", "/root/pack"},
		{"/root/pack/../other/tool", "/root/pack"},
		{"/root/packed/tool", "/root/pack"},
		{"/usr/bin/python3", "/root/pack"},
		{"/usr/bin/python3", "/"},
		{"/root/pack", "/root/pack"},
		{"relative/tool", "/root/pack"},
		{"/root/pack/tool", ""},
	} {
		got := Plan{Path: c.prog}.execPath(c.wd)
		if w := want(c.prog, c.wd); got != w {
			t.Errorf("execPath(%q) in %q = %q, filepath.Rel gives %q", c.prog, c.wd, got, w)
		}
	}
}
