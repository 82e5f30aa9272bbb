package app

import (
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/toolsearch"
)

// DiscoveryOf is [discovery] as the front door takes it.
func DiscoveryOf(d config.Discovery) toolsearch.Discovery {
	return toolsearch.Discovery{Mode: toolsearch.Mode(d.Mode), Threshold: d.Threshold, Pinned: d.Pinned}
}
