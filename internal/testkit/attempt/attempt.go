// Package attempt is what the hostile test tools try (the hostile
// command, the MCP and bridge fixtures): one attempt such as read=PATH or
// tcp=ADDR, and whether the kernel let it happen.
package attempt

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// readWait is how long a connection that was let through waits for the
// test's greeting: a deadline, not a measure (2 s was too short on a loaded
// machine, and a timeout reads as "denied").
const readWait = 15 * time.Second

// Try makes one attempt, "kind=arg" (write=PATH, writetmp=, read=PATH,
// fd=N, tcp=ADDR, udp=ADDR, unix=PATH or @ABSTRACT, vsock=, sockets=N, spawn=PROGRAM,
// env=NAME, parentenv, caps, id, status, signal=PID), and says "ok <detail>" or "denied <error>". caps
// is ok only when the process holds a capability in any set, the
// bounding set included.
func Try(a string) string {
	kind, arg, _ := strings.Cut(a, "=")
	detail, err := attempt(kind, arg)
	if err != nil {
		return fmt.Sprintf("denied %v", err)
	}
	return "ok " + detail
}

func attempt(kind, arg string) (string, error) {
	switch kind {
	case "write":
		return "", os.WriteFile(arg, []byte("hostile"), 0o644)
	case "writetmp": // into $TMPDIR, the tool's private temp dir
		return os.TempDir(), os.WriteFile(filepath.Join(os.TempDir(), "scratch"), []byte("hostile"), 0o644)
	case "read":
		b, err := os.ReadFile(arg)
		return strings.TrimSpace(string(b)), err
	case "fd": // read from descriptor N, left open by whoever started capgate
		n, err := strconv.Atoi(arg)
		if err != nil {
			return "", err
		}
		b := make([]byte, 64)
		k, err := os.NewFile(uintptr(n), "inherited").Read(b)
		return strings.TrimSpace(string(b[:k])), err
	case "tcp":
		c, err := net.DialTimeout("tcp", arg, 2*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(readWait))
		b := make([]byte, 16)
		n, err := c.Read(b)
		return string(b[:n]), err
	case "udp":
		c, err := net.Dial("udp", arg)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_, err = c.Write([]byte("hostile"))
		return "", err
	case "unix": // connect to a Unix socket: a path, or @name for an abstract one
		if strings.HasPrefix(arg, "@") {
			arg = "\x00" + arg[1:]
		}
		c, err := net.DialTimeout("unix", arg, 2*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(readWait))
		b := make([]byte, 16)
		n, err := c.Read(b)
		return string(b[:n]), err
	case "sockets": // N AF_UNIX socket() calls, each refused or closed: what a refused syscall costs
		n, _ := strconv.Atoi(arg)
		refused := 0
		for range n {
			fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
			if err != nil {
				refused++
				continue
			}
			syscall.Close(fd)
		}
		return fmt.Sprintf("%d refused", refused), nil
	case "vsock": // open an AF_VSOCK socket (family 40)
		fd, err := syscall.Socket(40, syscall.SOCK_STREAM, 0)
		if err != nil {
			return "", err
		}
		syscall.Close(fd)
		return "", nil
	case "parentenv": // the environment of the process that started this one
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", os.Getppid()))
		return strings.ReplaceAll(string(b), "\x00", " "), err
	case "caps":
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return "", err
		}
		var held []string
		for _, line := range strings.Split(string(b), "\n") {
			name, v, ok := strings.Cut(line, ":\t")
			if ok && strings.HasPrefix(name, "Cap") && strings.Trim(v, "0") != "" {
				held = append(held, name+"="+v)
			}
		}
		if len(held) == 0 {
			return "", fmt.Errorf("no capabilities")
		}
		return strings.Join(held, " "), nil
	case "spawn":
		return "", exec.Command(arg).Run()
	case "env":
		v, ok := os.LookupEnv(arg)
		if !ok {
			return "", fmt.Errorf("unset")
		}
		return v, nil
	case "id":
		return fmt.Sprintf("uid=%d", os.Getuid()), nil
	case "status": // what the kernel says confines this process
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return "", err
		}
		var fields []string
		for _, line := range strings.Split(string(b), "\n") {
			name, v, ok := strings.Cut(line, ":")
			switch name {
			case "Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "Seccomp_filters", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb":
				if ok {
					fields = append(fields, name+"="+strings.Join(strings.Fields(v), ","))
				}
			}
		}
		return strings.Join(fields, " "), nil
	case "signal": // signal 0 (no signal, the permission check alone) to process PID
		pid, err := strconv.Atoi(arg)
		if err != nil {
			return "", err
		}
		return "", signal0(pid)
	}
	return "", fmt.Errorf("unknown attempt %q", kind)
}
