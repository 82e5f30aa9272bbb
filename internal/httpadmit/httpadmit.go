// Package httpadmit holds what every front-door route of capgate does to a
// request before its handler reads it: the bearer token from the header,
// and the body, read within a size and a time bound.
package httpadmit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

const (
	// MaxRequestBytes is the default bound of one request body.
	MaxRequestBytes = 8 << 20
	// bodyTimeout bounds reading one body. It is set when a handler starts
	// reading and cleared after, because a server-wide ReadTimeout would
	// also end the long-lived streams of GET /mcp.
	bodyTimeout = 30 * time.Second
	// knownMax is the largest announced length read into a buffer of
	// exactly that size; a larger body grows as it comes.
	knownMax = 64 << 10
)

// ReadBody reads r's body up to limit bytes within bodyTimeout. A body
// announced or found larger gets 413 and ok false, having read at most
// limit+1 bytes; so does one that cannot be read.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) (body []byte, ok bool) {
	if r.ContentLength > limit {
		tooLarge(w, limit)
		return nil, false
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyTimeout))
	defer rc.SetReadDeadline(time.Time{})
	n := r.ContentLength
	if n >= 0 && n <= knownMax {
		// A small body of known length (a call's, as a rule): net/http's
		// body ends after exactly n bytes, so they are read into a buffer
		// of that size, with no limit reader and no read to see the end
		// (TestReadBodyKnownLengthIsGeneral, BenchmarkReadBody).
		body := make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			unreadable(w, err)
			return nil, false
		}
		return body, true
	}
	// Unknown or large: grow as it comes, not as announced.
	buf := bytes.NewBuffer(make([]byte, 0, bytes.MinRead))
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		tooLarge(w, limit)
		return nil, false
	case err != nil:
		unreadable(w, err)
		return nil, false
	}
	return buf.Bytes(), true
}

func unreadable(w http.ResponseWriter, err error) {
	http.Error(w, "400 bad request: the body could not be read: "+err.Error(), http.StatusBadRequest)
}

func tooLarge(w http.ResponseWriter, limit int64) {
	w.Header().Set("Connection", "close")
	http.Error(w, fmt.Sprintf("413 request body too large: capgate takes at most %d bytes", limit), http.StatusRequestEntityTooLarge)
}

// Bearer is the token of r's "Authorization: Bearer" header.
func Bearer(r *http.Request) string { return BearerToken(r.Header.Get("Authorization")) }

// BearerToken is the token of an Authorization header value.
func BearerToken(h string) string {
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// BearerChallenge reads the auth-params of the Bearer challenges among
// WWW-Authenticate headers (RFC 6750 §3): name=value or name="quoted
// value" pairs separated by commas; names lower-cased.
func BearerChallenge(headers []string) map[string]string {
	out := map[string]string{}
	for _, h := range headers {
		scheme, rest, _ := strings.Cut(strings.TrimSpace(h), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			continue
		}
		for rest = strings.TrimSpace(rest); rest != ""; rest = strings.TrimLeft(strings.TrimSpace(rest), ",") {
			rest = strings.TrimSpace(rest)
			name, after, ok := strings.Cut(rest, "=")
			if !ok {
				break
			}
			name, after = strings.ToLower(strings.TrimSpace(name)), strings.TrimSpace(after)
			var value string
			if strings.HasPrefix(after, `"`) {
				var b strings.Builder
				i := 1
				for ; i < len(after) && after[i] != '"'; i++ {
					if after[i] == '\\' && i+1 < len(after) {
						i++
					}
					b.WriteByte(after[i])
				}
				value, rest = b.String(), after[min(i+1, len(after)):]
			} else {
				value, rest, _ = strings.Cut(after, ",")
				value = strings.TrimSpace(value)
			}
			out[name] = value
		}
	}
	return out
}
