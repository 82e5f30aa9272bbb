package server

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	mcpsrc "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

// The resources, resource templates and prompts of upstream MCP servers
// are served next to the tools, gated like them: seeing or reading a
// resource needs rye.fetch.knowledge.mcp.<source>.<uri dotted>, seeing or
// getting a prompt rye.fetch.directive.mcp.<source>.<name>. Resource URIs
// pass unchanged; prompts get exposed names as tools do. Completions go
// to the upstream that owns the prompt or template.

// upstream is one MCP source as the relay knows it.
type upstream struct {
	src    *mcpsrc.Source
	prefix string
}

// relay holds what the upstreams serve now.
type relay struct {
	ups []upstream

	mu        sync.Mutex
	resources map[string]*upstream // uri → owner
	templates map[string]*upstream // uri template → owner
	prompts   map[string]relayedPrompt
	skills    []mcpserver.ServerPrompt          // skills served as prompts (see skill.go)
	subs      map[string]map[string]*subscriber // uri → session id → who
	upSubs    map[string]bool                   // uris subscribed upstream
}

type relayedPrompt struct {
	up   *upstream
	name string // the upstream's name
	id   string // the directive id the gate checks
}

type subscriber struct {
	caller *router.Caller
	// deliver takes the updates of a 2026-07-28 listen's subscription
	// (tasklisten.go); a 2025-11-25 session's go by its session id.
	deliver func(uri string)
}

// knowledgeID is the item id of an upstream resource.
func knowledgeID(source, uri string) string { return "mcp:" + source + ":" + uri }

// directiveID is the item id of an upstream prompt.
func directiveID(source, name string) string { return "mcp:" + source + ":" + name }

// startRelay finds the MCP sources and keeps their resources and prompts
// registered, refreshing on their list_changed notifications. A reload
// calls it again with the new registry: the new upstreams replace the
// old, and URIs that sessions subscribed are subscribed upstream again.
func (m *MCP) startRelay(reg *registry.Registry) {
	var ups []upstream
	for _, s := range reg.Sources() {
		src, ok := s.(*mcpsrc.Source)
		if !ok {
			continue
		}
		ups = append(ups, upstream{src: src, prefix: reg.Prefix(registry.SourceKey(s))})
	}
	for i := range ups {
		up := &ups[i]
		up.src.OnChange(func() { go m.syncRelay() })
		up.src.OnNotification(func(method string, params json.RawMessage) {
			switch method {
			case "notifications/resources/list_changed", "notifications/prompts/list_changed":
				go m.syncRelay()
			case "notifications/resources/updated":
				m.resourceUpdated(up, params)
			}
		})
	}
	m.relay.mu.Lock()
	m.relay.ups = ups
	var subscribed []string
	for uri, sessions := range m.relay.subs {
		if len(sessions) > 0 {
			subscribed = append(subscribed, uri)
		}
	}
	m.relay.upSubs = map[string]bool{}
	m.relay.mu.Unlock()
	m.syncRelay()
	for _, uri := range subscribed {
		m.subscribeUpstream(context.Background(), uri)
	}
}

// syncRelay lists every upstream's resources, templates and prompts and
// registers them, replacing the last set.
func (m *MCP) syncRelay() {
	ctx := context.Background()
	var (
		resources []mcpserver.ServerResource
		templates []mcpserver.ServerResourceTemplate
		prompts   []mcpserver.ServerPrompt
		owners    = map[string]*upstream{}
		towners   = map[string]*upstream{}
		pmap      = map[string]relayedPrompt{}
	)
	m.relay.mu.Lock()
	ups := m.relay.ups
	m.relay.mu.Unlock()
	for i := range ups {
		up := &ups[i]
		l := up.src.Lists(ctx)
		for _, r := range l.Resources {
			if _, dup := owners[r.URI]; dup {
				continue // the first source to serve a URI keeps it
			}
			owners[r.URI] = up
			resources = append(resources, mcpserver.ServerResource{Resource: r, Handler: m.readResource(up)})
		}
		for _, t := range l.Templates {
			raw := t.URITemplate.Raw()
			if _, dup := towners[raw]; dup {
				continue
			}
			towners[raw] = up
			h := m.readResource(up)
			templates = append(templates, mcpserver.ServerResourceTemplate{Template: t, Handler: mcpserver.ResourceTemplateHandlerFunc(h)})
		}
		for _, p := range l.Prompts {
			exposed := registry.ExposedName(up.prefix, p.Name)
			if _, dup := pmap[exposed]; dup {
				continue
			}
			rp := relayedPrompt{up: up, name: p.Name, id: directiveID(up.src.ID(), p.Name)}
			pmap[exposed] = rp
			p.Name = exposed
			prompts = append(prompts, mcpserver.ServerPrompt{Prompt: p, Handler: m.getPrompt(rp)})
		}
	}
	m.relay.mu.Lock()
	defer m.relay.mu.Unlock()
	m.relay.resources, m.relay.templates, m.relay.prompts = owners, towners, pmap
	m.srv.SetResources(resources...)
	m.srv.SetResourceTemplates(templates...)
	m.srv.SetPrompts(append(prompts, m.relay.skills...)...)
}

func protocolOf(ctx context.Context) string {
	if info := mcpserver.RequestProtocolInfoFromContext(ctx); info != nil && info.ProtocolVersion != "" {
		return "mcp/" + info.ProtocolVersion
	}
	// A request in a 2025-11-25 session: the version the session agreed.
	if s, ok := mcpserver.ClientSessionFromContext(ctx).(interface{ ProtocolVersion() string }); ok && s.ProtocolVersion() != "" {
		return "mcp/" + s.ProtocolVersion()
	}
	return "mcp"
}

// readResource gates a read and forwards it to the upstream.
func (m *MCP) readResource(up *upstream) mcpserver.ResourceHandlerFunc {
	return func(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		uri := req.Params.URI
		if err := m.rt().Fetch(CallerFrom(ctx), permissions.Knowledge, knowledgeID(up.src.ID(), uri), "resource "+uri, protocolOf(ctx)); err != nil {
			return nil, errors.New(tool.ErrorMessage(err))
		}
		contents, err := up.src.ReadResource(ctx, uri)
		passUpstream(ctx, err)
		return contents, err
	}
}

// getPrompt gates a prompts/get and forwards it under the upstream's name.
// An upstream that needs input first (SEP-2322) gets its rounds: its input
// requests go to the client as they came, its requestState goes sealed
// for the caller and this prompt (prompt.go), and the client's answers
// come back with the upstream's state as it sent it. mcp-go plays the
// rounds with a 2025-11-25 client as requests of its own.
func (m *MCP) getPrompt(rp relayedPrompt) mcpserver.PromptHandlerFunc {
	return func(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		c := CallerFrom(ctx)
		if err := m.rt().Fetch(c, permissions.Directive, rp.id, "prompt "+req.Params.Name, protocolOf(ctx)); err != nil {
			return nil, errors.New(tool.ErrorMessage(err))
		}
		round := req.Params.MultiRoundTripParams
		if round.RequestState != "" {
			up, err := m.openPromptState(ctx, c, rp.id, round.RequestState)
			if err != nil {
				return nil, errors.New(tool.ErrorMessage(err))
			}
			round.RequestState = up
		}
		res, err := rp.up.src.GetPrompt(mcpconv.WithAskable(ctx), rp.name, req.Params.Arguments, round)
		passUpstream(ctx, err)
		if err != nil || !res.NeedsInput() || res.RequestState == "" {
			return res, err
		}
		if res.RequestState, err = m.sealPromptState(c, rp.id, res.RequestState); err != nil {
			return nil, err
		}
		return res, nil
	}
}

func (m *MCP) filterPrompts(ctx context.Context, prompts []mcp.Prompt) []mcp.Prompt {
	c := CallerFrom(ctx)
	sampling, _ := clientSampling(ctx)
	m.relay.mu.Lock()
	defer m.relay.mu.Unlock()
	out := prompts[:0:0]
	for _, p := range prompts {
		id := p.Name // a skill's directive id is its name
		if rp, ok := m.relay.prompts[p.Name]; ok {
			id = rp.id
		} else if !sampling {
			p.Description = withoutUseSkill(p.Description)
		}
		if m.rt().May(c, permissions.Fetch, permissions.Directive, id) {
			out = append(out, p)
		}
	}
	return out
}

// filterResources and filterTemplates run after mcp-go builds a list page
// and keep what the caller may fetch.
func (m *MCP) filterResources(ctx context.Context, _ any, _ *mcp.ListResourcesRequest, res *mcp.ListResourcesResult) {
	c := CallerFrom(ctx)
	m.relay.mu.Lock()
	defer m.relay.mu.Unlock()
	out := res.Resources[:0]
	for _, r := range res.Resources {
		if up, ok := m.relay.resources[r.URI]; ok && m.rt().May(c, permissions.Fetch, permissions.Knowledge, knowledgeID(up.src.ID(), r.URI)) {
			out = append(out, r)
		}
	}
	res.Resources = out
}

func (m *MCP) filterTemplates(ctx context.Context, _ any, _ *mcp.ListResourceTemplatesRequest, res *mcp.ListResourceTemplatesResult) {
	c := CallerFrom(ctx)
	m.relay.mu.Lock()
	defer m.relay.mu.Unlock()
	out := res.ResourceTemplates[:0]
	for _, t := range res.ResourceTemplates {
		if t.URITemplate == nil {
			continue
		}
		raw := t.URITemplate.Raw()
		if up, ok := m.relay.templates[raw]; ok && m.rt().May(c, permissions.Fetch, permissions.Knowledge, knowledgeID(up.src.ID(), raw)) {
			out = append(out, t)
		}
	}
	res.ResourceTemplates = out
}

// CompletePromptArgument forwards completion/complete for a prompt
// argument to the prompt's upstream.
func (m *MCP) CompletePromptArgument(ctx context.Context, name string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	m.relay.mu.Lock()
	rp, ok := m.relay.prompts[name]
	m.relay.mu.Unlock()
	if !ok {
		return &mcp.Completion{Values: []string{}}, nil
	}
	if err := m.rt().Fetch(CallerFrom(ctx), permissions.Directive, rp.id, "prompt "+name, protocolOf(ctx)); err != nil {
		return nil, errors.New(tool.ErrorMessage(err))
	}
	return rp.up.src.Complete(ctx, map[string]any{"type": "ref/prompt", "name": rp.name}, arg, cc)
}

// CompleteResourceArgument forwards completion/complete for a resource
// template argument to the template's upstream.
func (m *MCP) CompleteResourceArgument(ctx context.Context, uri string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	m.relay.mu.Lock()
	up, ok := m.relay.templates[uri]
	if !ok {
		up, ok = m.relay.resources[uri]
	}
	m.relay.mu.Unlock()
	if !ok {
		return &mcp.Completion{Values: []string{}}, nil
	}
	if err := m.rt().Fetch(CallerFrom(ctx), permissions.Knowledge, knowledgeID(up.src.ID(), uri), "resource "+uri, protocolOf(ctx)); err != nil {
		return nil, errors.New(tool.ErrorMessage(err))
	}
	return up.src.Complete(ctx, map[string]any{"type": "ref/resource", "uri": uri}, arg, cc)
}

// subscribed records a client's subscription and subscribes upstream once
// per URI, so the upstream's updates can be passed on.
func (m *MCP) subscribed(ctx context.Context, _ any, req *mcp.SubscribeRequest, _ *mcp.EmptyResult) {
	session := mcpserver.ClientSessionFromContext(ctx)
	uri := req.Params.URI
	m.relay.mu.Lock()
	if _, ok := m.relay.resources[uri]; !ok || session == nil {
		m.relay.mu.Unlock()
		return
	}
	if m.relay.subs == nil {
		m.relay.subs, m.relay.upSubs = map[string]map[string]*subscriber{}, map[string]bool{}
	}
	if m.relay.subs[uri] == nil {
		m.relay.subs[uri] = map[string]*subscriber{}
	}
	m.relay.subs[uri][session.SessionID()] = &subscriber{caller: CallerFrom(ctx)}
	m.relay.mu.Unlock()
	m.subscribeUpstream(context.WithoutCancel(ctx), uri)
}

// subscribeUpstream subscribes uri at the upstream that serves it, once.
func (m *MCP) subscribeUpstream(ctx context.Context, uri string) {
	m.relay.mu.Lock()
	up, ok := m.relay.resources[uri]
	if !ok || m.relay.upSubs[uri] {
		m.relay.mu.Unlock()
		return
	}
	m.relay.upSubs[uri] = true
	m.relay.mu.Unlock()
	// A 2026-07-28 upstream hears of it in its listen stream's filter, a
	// 2025-11-25 one by resources/subscribe (Source.Subscribe).
	if err := up.src.Subscribe(ctx, uri); err != nil {
		m.relay.mu.Lock()
		delete(m.relay.upSubs, uri)
		m.relay.mu.Unlock()
	}
}

func (m *MCP) unsubscribed(ctx context.Context, _ any, req *mcp.UnsubscribeRequest, _ *mcp.EmptyResult) {
	session := mcpserver.ClientSessionFromContext(ctx)
	if session == nil {
		return
	}
	m.unsubscribe(session.SessionID(), req.Params.URI)
}

// unsubscribeAll drops the subscriptions of a session that ended.
func (m *MCP) unsubscribeAll(sid string) {
	m.relay.mu.Lock()
	var uris []string
	for uri, sessions := range m.relay.subs {
		if _, ok := sessions[sid]; ok {
			uris = append(uris, uri)
		}
	}
	m.relay.mu.Unlock()
	for _, uri := range uris {
		m.unsubscribe(sid, uri)
	}
}

// unsubscribe drops session sid's subscription to uri, and the
// upstream's when it was the last.
func (m *MCP) unsubscribe(sid, uri string) {
	m.relay.mu.Lock()
	delete(m.relay.subs[uri], sid)
	up, owned := m.relay.resources[uri]
	last := len(m.relay.subs[uri]) == 0 && m.relay.upSubs[uri]
	if len(m.relay.subs[uri]) == 0 {
		delete(m.relay.subs, uri)
	}
	if last {
		delete(m.relay.upSubs, uri)
	}
	m.relay.mu.Unlock()
	if last && owned {
		_ = up.src.Unsubscribe(context.Background(), uri)
	}
}

// resourceUpdated passes an upstream's resources/updated to the sessions
// subscribed to that URI whose caller may still fetch it.
func (m *MCP) resourceUpdated(up *upstream, params json.RawMessage) {
	var p struct {
		URI string `json:"uri"`
	}
	if json.Unmarshal(params, &p) != nil || p.URI == "" {
		return
	}
	// Only the URI goes on, and only one fit for a caller.
	if raw, err := json.Marshal(p); err != nil {
		return
	} else if _, found := harden.JSON(raw); found {
		return
	}
	m.relay.mu.Lock()
	var sessions []string
	var listens []func(string)
	for sid, s := range m.relay.subs[p.URI] {
		if !m.rt().May(s.caller, permissions.Fetch, permissions.Knowledge, knowledgeID(up.src.ID(), p.URI)) {
			continue
		}
		if s.deliver != nil {
			listens = append(listens, s.deliver)
		} else {
			sessions = append(sessions, sid)
		}
	}
	m.relay.mu.Unlock()
	for _, sid := range sessions {
		_ = m.srv.SendNotificationToSpecificClient(sid, "notifications/resources/updated", map[string]any{"uri": p.URI})
	}
	for _, deliver := range listens {
		deliver(p.URI)
	}
}

// listenResources subscribes the listen key for c to the URIs of uris
// that capgate relays and c may read, as resources/subscribe does a
// session, and returns them (once each, in order); updates of them go to
// deliver, which must not block. A URI that is unknown and one c may not
// read are alike left out. unsubscribe(key, uri) ends each.
func (m *MCP) listenResources(ctx context.Context, key string, c *router.Caller, uris []string, deliver func(string)) []string {
	var agreed []string
	m.relay.mu.Lock()
	for _, uri := range uris {
		up, ok := m.relay.resources[uri]
		if !ok || slices.Contains(agreed, uri) || !m.rt().May(c, permissions.Fetch, permissions.Knowledge, knowledgeID(up.src.ID(), uri)) {
			continue
		}
		if m.relay.subs == nil {
			m.relay.subs, m.relay.upSubs = map[string]map[string]*subscriber{}, map[string]bool{}
		}
		if m.relay.subs[uri] == nil {
			m.relay.subs[uri] = map[string]*subscriber{}
		}
		m.relay.subs[uri][key] = &subscriber{caller: c, deliver: deliver}
		agreed = append(agreed, uri)
	}
	m.relay.mu.Unlock()
	for _, uri := range agreed {
		m.subscribeUpstream(context.WithoutCancel(ctx), uri)
	}
	return agreed
}
