//go:build linux

package sandbox

import (
	"slices"
	"testing"
)

func TestFeaturesCheck(t *testing.T) {
	every := all()
	cases := []struct {
		name string
		f    Features
		want []Missing
	}{
		{"everything", Features{LandlockABI: 7, Seccomp: true, NetNS: true}, nil},
		{"network falls back to Landlock TCP and seccomp", Features{LandlockABI: 4, Seccomp: true}, nil},
		{"old Landlock and no netns", Features{LandlockABI: 3, Seccomp: true}, []Missing{
			{NoNetwork, "network namespaces, or Landlock ABI >= 4 with seccomp"}}},
		{"no seccomp", Features{LandlockABI: 7, NetNS: true}, []Missing{{NoSubprocess, "seccomp"}}},
		{"nothing", Features{}, []Missing{
			{NoFilesystemWrite, "Landlock"}, {NoFilesystemRead, "Landlock"},
			{NoNetwork, "network namespaces, or Landlock ABI >= 4 with seccomp"},
			{NoSubprocess, "seccomp"}, {NoEnvRead, "Landlock"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.f.Check(every); !slices.Equal(got, c.want) {
				t.Errorf("Check = %v, want %v", got, c.want)
			}
		})
	}
	if got := (Features{}).Check(Guarantees{}); len(got) != 0 {
		t.Errorf("no guarantees need nothing, got %v", got)
	}
}
