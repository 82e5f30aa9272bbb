package server

import (
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
)

// A reload (package app) builds a new router and registry from the config
// and swaps them in here, at one point: every request loads the parts
// once, when it starts, so a call runs to its end on the generation it
// began on, while mcp-go's server, its sessions and the listeners stay.

// parts are one generation of what the front door serves.
type parts struct {
	router   *router.Router
	registry *registry.Registry
}

func (m *MCP) rt() *router.Router      { return m.parts.Load().router }
func (m *MCP) reg() *registry.Registry { return m.parts.Load().registry }

// watch keeps the tool list in step with reg's catalog while reg is the
// registry of now (clients get tools/list_changed).
func (m *MCP) watch(reg *registry.Registry) {
	reg.Watch(func(s *registry.Snapshot) {
		if m.reg() == reg {
			m.sync(s)
		}
	})
	m.sync(reg.Snapshot())
}

// Router is the router requests are served by now.
func (s *Server) Router() *router.Router { return s.MCP.rt() }

// Registry is the catalog requests are served from now.
func (s *Server) Registry() *registry.Registry { return s.MCP.reg() }

// Swap makes rt and reg serve every request from now on: the tool list,
// the upstreams' resources and prompts, the capability RPC. Requests
// already running finish on the previous router and registry, which Swap
// returns for the caller to drain and close. Sessions are kept.
func (s *Server) Swap(rt *router.Router, reg *registry.Registry) (*router.Router, *registry.Registry) {
	old := s.MCP.parts.Swap(&parts{router: rt, registry: reg})
	s.MCP.watch(reg)
	s.MCP.startRelay(reg)
	return old.router, old.registry
}
