package suggest

import "testing"

func TestNearest(t *testing.T) {
	known := []string{"listen", "data_dir", "socket", "max_sessions"}
	for _, c := range []struct{ in, want string }{
		{"listne", "listen"}, {"data-dir", "data_dir"}, {"Socket", "socket"},
		{"max_session", "max_sessions"}, {"port", ""}, {"", ""},
	} {
		if got := Nearest(c.in, known); got != c.want {
			t.Errorf("Nearest(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
