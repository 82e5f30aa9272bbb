//go:build !unix

package attempt

import "errors"

func signal0(int) error { return errors.New("no kill(2) here") }
