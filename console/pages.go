package console

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/tool"
)

// parsePages parses each page template with the layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"ago":    ago,
		"pretty": pretty,
		"rfc":    func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"join":   strings.Join,
		"list":   func(v ...string) []string { return v },
	}
	names, err := fs.Glob(assets, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New(base).Funcs(funcs).ParseFS(assets, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		pages[base] = t
	}
	return pages, nil
}

// render executes page with data for v (nil: not signed in). A fragment
// (the approvals list) is rendered without the layout.
func (c *Console) render(w http.ResponseWriter, r *http.Request, page string, v *visitor, data map[string]any) {
	if data == nil {
		data = map[string]any{}
	}
	data["V"] = v
	data["Page"] = page
	if v != nil {
		data["CSRF"] = v.CSRF
		data["CanAct"] = v.Role >= approver
	}
	t, name := c.pages[page], "layout"
	if page == "approvals_list" {
		t, name = c.pages["approvals"], "list"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, data); err != nil {
		c.opts.Logger.Error("console: render", "page", page, "err", err)
		http.Error(w, "500 render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(buf.Bytes())
}

func ago(t time.Time) string {
	d := time.Since(t).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	if s, ok := c.current(r); ok {
		v := &visitor{session: s, Role: c.opts.Roles.of(s.Sub, s.Claims)}
		if v.Role > nobody {
			http.Redirect(w, r, "/approvals", http.StatusSeeOther)
			return
		}
	}
	c.render(w, r, "signin", nil, map[string]any{"OIDC": c.opts.OIDC != nil, "Error": r.URL.Query().Get("error")})
}

// linkLogin signs in with a single-use link from `capgate console login`.
func (c *Console) linkLogin(w http.ResponseWriter, r *http.Request) {
	sub, err := c.takeLink(r.Context(), r.URL.Query().Get("t"))
	if err != nil {
		w.WriteHeader(http.StatusForbidden)
		c.render(w, r, "signin", nil, map[string]any{"OIDC": c.opts.OIDC != nil, "Error": err.Error()})
		return
	}
	c.opts.Record(audit.Event{Type: audit.TypeOperator, Sub: sub, Decision: "sign_in", Detail: "console sign-in link"})
	c.startSession(w, sub, nil)
	http.Redirect(w, r, "/approvals", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: c.opts.Secure, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// approvalView is one approval as a page shows it.
type approvalView struct {
	Approval
	Tool, Risk, Tier, Why string
	Sensitive             bool
	Input                 string // formatted, or withheld
	Truncated             bool
}

func (c *Console) approvalViews(r *http.Request, v *visitor) ([]approvalView, error) {
	list, err := c.opts.Approvals.Live(r.Context())
	if err != nil {
		return nil, err
	}
	tools := map[string]*tool.Descriptor{}
	for _, d := range c.opts.Catalog() {
		tools[d.ID] = d
	}
	out := make([]approvalView, 0, len(list))
	for _, a := range list {
		av := approvalView{Approval: a, Tool: a.ToolID, Risk: "unknown", Truncated: len(a.Input) < a.InputSize}
		if d, ok := tools[a.ToolID]; ok {
			av.Tool = d.ExposedName
			av.Risk = d.Risk.Level.String()
			av.Sensitive = d.Sensitive
			if c.opts.Tier != nil {
				av.Tier = c.opts.Tier(d.Risk.Level)
			}
		}
		av.Why = "the tool's risk tier needs an operator's approval of each call"
		if av.Tier != "" {
			av.Why = fmt.Sprintf("risk %s is tier %s, which needs an operator's approval of each call", av.Risk, av.Tier)
		}
		switch {
		case av.Sensitive && v.Role < approver:
			av.Input = fmt.Sprintf("(withheld: the tool is marked sensitive; %d bytes)", a.InputSize)
		default:
			av.Input = pretty(a.Input)
		}
		out = append(out, av)
	}
	return out, nil
}

func (c *Console) approvalsPage(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	list, err := c.approvalViews(r, v)
	// The stream starts from the queue as rendered: it sends nothing
	// until the queue changes, so an operator's half-typed note is not
	// swapped away just after the page loads.
	data := map[string]any{"Approvals": list, "Since": viewsFingerprint(list)}
	if err != nil {
		data["Error"] = "the store: " + err.Error()
		data["Since"] = ""
	}
	data["Shown"] = data["Since"]
	c.render(w, r, "approvals", v, data)
}

// approvalsList renders the queue for htmx to swap in, or, when the page
// already shows this queue (shown, its fingerprint, which the list carries
// and htmx sends back), answers 204, which htmx does not swap: an event
// that comes after the change it announces was already fetched (the list
// changed again between the event and the fetch) replaces nothing, so a
// half-typed note stays and a click meets the nodes it aimed at.
func (c *Console) approvalsList(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	list, err := c.approvalViews(r, v)
	data := map[string]any{"Approvals": list}
	if err != nil {
		data["Error"] = "the store: " + err.Error()
	} else {
		fp := viewsFingerprint(list)
		if r.Method == http.MethodGet && r.URL.Query().Get("shown") == fp {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		data["Shown"] = fp
	}
	c.render(w, r, "approvals_list", v, data)
}

// viewsFingerprint is the fingerprint of the approvals a page shows.
func viewsFingerprint(list []approvalView) string {
	shown := make([]Approval, len(list))
	for i, a := range list {
		shown[i] = a.Approval
	}
	return fingerprint(shown)
}

// approvalsEvents streams an "approvals" event when it starts and whenever
// the queue changes (server-sent events; the page's htmx then fetches the
// list again).
func (c *Console) approvalsEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "500 streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 2000\n\n")
	fl.Flush()
	last := r.URL.Query().Get("since")
	tick := time.NewTicker(c.opts.PollInterval)
	defer tick.Stop()
	for n := 0; ; n++ {
		// The first look is at once: what changed between the page's
		// rendering (since) and this stream's start is fetched then.
		if fp, err := c.queueFingerprint(r); err == nil && fp != last {
			fmt.Fprintf(w, "id: %d\nevent: approvals\ndata: %s\n\n", n, fp)
			fl.Flush()
			last = fp
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// queueFingerprint changes whenever an approval is added, decided or goes.
func (c *Console) queueFingerprint(r *http.Request) (string, error) {
	list, err := c.opts.Approvals.Live(r.Context())
	if err != nil {
		return "", err
	}
	return fingerprint(list), nil
}

// fingerprint names a queue's state: its approvals and their decisions.
func fingerprint(list []Approval) string {
	h := sha256.New()
	for _, a := range list {
		fmt.Fprintf(h, "%s %t %t\n", a.ID, a.Approved, a.Denied)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// decide approves or denies an approval, records who did and returns to the
// queue (or, for htmx, the new list).
func (c *Console) decide(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	id, action := r.PathValue("id"), r.PathValue("action")
	note := strings.TrimSpace(r.PostForm.Get("note"))
	if len(note) > 500 {
		note = note[:500]
	}
	var err error
	switch action {
	case "approve":
		err = c.opts.Approvals.Approve(r.Context(), id, v.Sub, note)
	case "deny":
		err = c.opts.Approvals.Deny(r.Context(), id, v.Sub, note)
	default:
		http.Error(w, "404 no such action", http.StatusNotFound)
		return
	}
	ev := audit.Event{Type: audit.TypeOperator, Sub: v.Sub, Decision: action, ApprovalID: id, Gate: "console"}
	if err != nil {
		ev.Code, ev.Detail = "refused", err.Error()
	}
	c.opts.Record(ev)
	if err != nil {
		w.WriteHeader(http.StatusConflict)
		list, _ := c.approvalViews(r, v)
		c.render(w, r, "approvals", v, map[string]any{"Approvals": list, "Error": err.Error()})
		return
	}
	if r.Header.Get("HX-Request") == "true" {
		c.approvalsList(w, r)
		return
	}
	http.Redirect(w, r, "/approvals", http.StatusSeeOther)
}

// toolView is one tool on the catalog page.
type toolView struct {
	*tool.Descriptor
	Effects    string
	Guarantees []guaranteeView
	Review     *review // a quarantined tool's changes, when pins are kept
}

type guaranteeView struct {
	Key, Source, Enforced string
}

func (c *Console) catalogPage(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	q := strings.ToLower(strings.TrimSpace(r.URL.Query().Get("q")))
	var list []toolView
	quarantined := 0
	for _, d := range c.opts.Catalog() {
		if q != "" && !strings.Contains(strings.ToLower(d.ID+" "+d.ExposedName+" "+d.Description), q) {
			continue
		}
		tv := toolView{Descriptor: d}
		var eff []string
		for _, e := range d.Risk.Effects {
			eff = append(eff, string(e))
		}
		tv.Effects = strings.Join(eff, ", ")
		if g := d.Guarantees; g != nil {
			for _, e := range g.Keys {
				enf := "enforced"
				if !e.Enforced {
					enf = "not enforced: " + e.Missing
				}
				tv.Guarantees = append(tv.Guarantees, guaranteeView{Key: e.Key, Source: e.Source, Enforced: enf})
			}
		}
		if d.Quarantined != "" {
			quarantined++
			if c.opts.Pins != nil {
				if pinned, now, hash, ok := c.opts.Pins.Review(d.ID); ok {
					tv.Review = reviewOf(d.ID, pinned, now, hash)
				}
			}
		}
		list = append(list, tv)
	}
	slices.SortFunc(list, func(a, b toolView) int {
		// Quarantined tools first, then by id.
		return cmp.Or(cmp.Compare(b.Quarantined, a.Quarantined), cmp.Compare(a.ID, b.ID))
	})
	c.render(w, r, "catalog", v, map[string]any{"Tools": list, "Q": q, "Quarantined": quarantined})
}

func (c *Console) accountsPage(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	data := map[string]any{"Enabled": c.opts.Accounts != nil}
	if c.opts.Accounts != nil {
		list, err := c.opts.Accounts.List(r.Context())
		data["Accounts"] = list
		if err != nil {
			data["Error"] = err.Error()
		}
	}
	c.render(w, r, "accounts", v, data)
}

func (c *Console) revokeAccount(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	if c.opts.Accounts == nil {
		http.Error(w, "404 no upstream needs a user's sign-in", http.StatusNotFound)
		return
	}
	sub, srv := r.PostForm.Get("sub"), r.PostForm.Get("server")
	err := c.opts.Accounts.Revoke(r.Context(), sub, srv)
	ev := audit.Event{Type: audit.TypeOperator, Sub: v.Sub, Decision: "revoke_account", Gate: "console",
		Detail: "account of " + sub + " on " + srv}
	if err != nil {
		ev.Code = "refused"
	}
	c.opts.Record(ev)
	if err != nil {
		http.Error(w, "409 "+err.Error(), http.StatusConflict)
		return
	}
	http.Redirect(w, r, "/accounts", http.StatusSeeOther)
}

func (c *Console) livePage(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	data := map[string]any{}
	if c.opts.Live != nil {
		l := c.opts.Live()
		slices.SortFunc(l.InFlight, func(a, b InFlight) int { return a.Started.Compare(b.Started) })
		data["Live"] = l
	}
	data["Chart"] = c.audit.perMinute(c.opts.Now(), 30)
	c.render(w, r, "live", v, data)
}
