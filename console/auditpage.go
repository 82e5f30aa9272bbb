package console

import (
	"net/http"
	"net/url"
	"strconv"
)

// auditPageSize is how many records the audit page shows at once.
const auditPageSize = 100

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	f := filterFrom(r)
	recs, total, err := c.audit.query(f, auditPageSize)
	data := map[string]any{"Records": recs, "Total": total, "F": f}
	if err != nil {
		data["Error"] = "the audit log: " + err.Error()
	}
	if len(recs) == auditPageSize {
		q := r.URL.Query()
		q.Set("before", strconv.FormatUint(recs[len(recs)-1].Seq, 10))
		data["Older"] = (&url.URL{Path: "/audit", RawQuery: q.Encode()}).String()
	}
	c.render(w, r, "audit", v, data)
}

func (c *Console) auditRecord(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil {
		http.Error(w, "400 a record is named by its seq, a number", http.StatusBadRequest)
		return
	}
	line, err := c.audit.line(seq)
	if err != nil {
		w.WriteHeader(http.StatusNotFound)
		c.render(w, r, "record", v, map[string]any{"Seq": seq, "Error": "no record with that seq in the current log file"})
		return
	}
	c.render(w, r, "record", v, map[string]any{"Seq": seq, "JSON": pretty(line)})
}

func (c *Console) auditVerify(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	data := map[string]any{}
	if c.opts.Verify == nil {
		data["Report"], data["OK"] = "no audit log to verify", false
	} else {
		data["Report"], data["OK"] = c.opts.Verify()
	}
	c.render(w, r, "verify", v, data)
}
