package config

import (
	"slices"

	"github.com/capgate/capgate/tool"
)

// Discovery is [discovery]: how MCP callers find tools in a large catalog.
type Discovery struct {
	// Mode is "list" (tools/list lists every tool a caller may see),
	// "search" (it lists the pinned tools, search_tools and call_tool) or
	// "auto" (search for a caller that sees more than threshold tools).
	Mode string `toml:"mode"` // default "list"
	// Threshold is auto mode's: search above this many visible tools.
	Threshold int `toml:"threshold"` // default 40
	// Pinned are tool ids listed in every mode.
	Pinned []string `toml:"pinned"`
}

// Discovery modes.
const (
	DiscoveryList   = "list"
	DiscoverySearch = "search"
	DiscoveryAuto   = "auto"
	// DefaultDiscoveryThreshold is auto mode's default threshold.
	DefaultDiscoveryThreshold = 40
)

func (d *Discovery) applyDefaults() {
	if d.Mode == "" {
		d.Mode = DiscoveryList
	}
	if d.Threshold == 0 {
		d.Threshold = DefaultDiscoveryThreshold
	}
}

func (d *Discovery) validate(fail func(key, format string, args ...any)) {
	if !slices.Contains([]string{DiscoveryList, DiscoverySearch, DiscoveryAuto}, d.Mode) {
		fail("discovery.mode", "%q: want \"list\", \"search\" or \"auto\"%s", d.Mode,
			didYouMean(d.Mode, []string{DiscoveryList, DiscoverySearch, DiscoveryAuto}))
	}
	if d.Threshold < 0 {
		fail("discovery.threshold", "%d: want a number of tools, 0 or more", d.Threshold)
	}
	for i, id := range d.Pinned {
		if _, _, _, err := tool.ParseID(id); err != nil {
			fail("discovery.pinned", "entry %d: %v", i+1, err)
		}
	}
}
