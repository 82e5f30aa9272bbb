//go:build !unix

package sandbox

// Reach is nil off Unix, where tools run as capgate's own user.
func (u User) Reach(path string, exec bool) error { return nil }

// ReachFrom is nil off Unix, as Reach is.
func (u User) ReachFrom(base, path string, exec bool) error { return nil }
