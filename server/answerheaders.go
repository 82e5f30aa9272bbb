package server

import (
	"net/http"
	"sync/atomic"
	"time"
)

// The fast call's answer headers, set without what net/http would spend
// per answer: Header.Set's new []string and canonical key, and the Date
// that net/http formats for every answer that has none. net/http only
// reads the values, so one slice serves every answer.

// jsonContentType is the Content-Type of a fast call's answer.
var jsonContentType = []string{"application/json"}

// httpDate is the Date header's value for now, as net/http writes it,
// formatted once a second rather than per answer.
func httpDate(now time.Time) []string {
	if d := lastDate.Load(); d != nil && d.sec == now.Unix() {
		return d.v
	}
	d := &dateValue{sec: now.Unix(), v: []string{now.UTC().Format(http.TimeFormat)}}
	lastDate.Store(d)
	return d.v
}

type dateValue struct {
	sec int64
	v   []string
}

var lastDate atomic.Pointer[dateValue]

// setJSONAnswer sets a fast call's answer headers: Content-Type, and
// Date from now, the call's end (a clock reading fewer per call), or the
// clock's when now is zero.
func setJSONAnswer(h http.Header, now time.Time) {
	if now.IsZero() {
		now = time.Now()
	}
	h["Content-Type"] = jsonContentType
	h["Date"] = httpDate(now)
}
