package sandbox

import (
	"fmt"
	"os/user"
	"strconv"
	"strings"
)

// DefaultRunAs is the user tools run as when capgate is root and
// [sandbox] run_as is unset.
const DefaultRunAs = "nobody"

// nobodyID is nobody's id where no user database names it.
const nobodyID = 65534

// Nobody is nobody by the conventional ids.
var Nobody = &User{UID: nobodyID, GID: nobodyID}

// String is u as run_as would name it.
func (u User) String() string { return fmt.Sprintf("%d:%d", u.UID, u.GID) }

// ParseUser reads [sandbox] run_as: a user name, a uid, or uid:gid. A
// name or bare uid takes the user's primary group.
func ParseUser(s string) (*User, error) {
	name, group, hasGroup := strings.Cut(s, ":")
	if name == "" {
		return nil, fmt.Errorf("%q: want a user name, a uid or uid:gid", s)
	}
	var u User
	if uid, err := strconv.Atoi(name); err == nil && uid >= 0 {
		u.UID, u.GID = uid, uid
		if pw, err := user.LookupId(name); err == nil {
			u.GID, _ = strconv.Atoi(pw.Gid)
		}
	} else {
		pw, err := user.Lookup(name)
		switch {
		case err != nil && name == DefaultRunAs:
			u.UID, u.GID = nobodyID, nobodyID
		case err != nil:
			return nil, fmt.Errorf("%q: no such user", name)
		default:
			u.UID, _ = strconv.Atoi(pw.Uid)
			u.GID, _ = strconv.Atoi(pw.Gid)
		}
	}
	if hasGroup {
		gid, err := strconv.Atoi(group)
		if err != nil || gid < 0 {
			g, lerr := user.LookupGroup(group)
			if lerr != nil {
				return nil, fmt.Errorf("%q: no such group %q", s, group)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
		u.GID = gid
	}
	return &u, nil
}
