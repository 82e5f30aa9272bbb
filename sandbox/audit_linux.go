//go:build linux

package sandbox

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Landlock logs each access it refuses a domain that asked for it to the
// kernel's audit (ABI 7): an AUDIT_LANDLOCK_ACCESS record naming the
// domain, what blocked the access and the path, and, at the domain's first
// denial, an AUDIT_LANDLOCK_DOMAIN record with the comm of the process
// that made the domain. The trampoline sets its comm to a tag of its own
// before it confines itself (plan.AuditTag), so capgate, reading audit as
// root, knows which launch each denial belongs to. Unprivileged, capgate
// cannot read audit: file denials then go unnamed.

const (
	auditGet              = 1000
	auditSet              = 1001
	auditUser             = 1107 // a message of a user process's own (SettleAudit's marker)
	auditLandlockAccess   = 1423
	auditLandlockDomain   = 1424
	auditStatusEnabled    = 1
	auditGroupReadlog     = 1
	auditSettle           = time.Second // a launch's records: the marker is back within a millisecond unless the machine is loaded
	auditStatusEnabledOff = 16 + 4      // offset of audit_status.enabled in a reply
)

// auditWatch routes Landlock's audit records to the launches they are of.
type auditWatch struct {
	mu      sync.Mutex
	tags    map[string]*tagged // by comm tag
	domains map[string]*tagged // by Landlock domain id
	pending map[string][]FileDenial
	marks   map[string]chan struct{} // SettleAudit's markers still on their way
}

type tagged struct {
	d         *Denials
	added     time.Time
	domain    string
	done      chan struct{} // closed when the domain is deallocated
	closeOnce sync.Once
	// live: a process that outlives calls (Denials.OnFile), watched until
	// ended (its launch's cleanup) and a while after.
	live  bool
	ended time.Time
}

var watching atomic.Pointer[auditWatch]

// WatchFileDenials has capgate read Landlock's audit records, so that the
// error of a call whose tool the kernel refused a file names the access
// and path. It needs root (CAP_AUDIT_READ, and CAP_AUDIT_CONTROL to read
// the audit status) and Landlock ABI 7. Kernel audit must be on: with
// enable, capgate turns it on when it is off (with no audit daemon, the
// kernel then also prints the records in its log). The error says why
// file denials will not be named.
func WatchFileDenials(enable bool) error {
	if watching.Load() != nil {
		return nil
	}
	if abi := probed().LandlockABI; abi < 7 {
		return fmt.Errorf("Landlock ABI %d logs no denials (7 does)", abi)
	}
	on, err := auditEnabled()
	if err != nil {
		return fmt.Errorf("reading the kernel audit status: %w", err)
	}
	if !on {
		if !enable {
			return errors.New("kernel audit is off ([sandbox] audit_file_denials = true lets capgate turn it on)")
		}
		if err := SetKernelAudit(true); err != nil {
			return fmt.Errorf("turning kernel audit on: %w", err)
		}
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_AUDIT)
	if err != nil {
		return err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: auditGroupReadlog}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("reading audit records: %w", err)
	}
	w := &auditWatch{tags: map[string]*tagged{}, domains: map[string]*tagged{}, pending: map[string][]FileDenial{},
		marks: map[string]chan struct{}{}}
	watching.Store(w)
	go w.read(fd)
	return nil
}

// auditRequest sends one audit request with payload and returns the
// reply's bytes (the ack's when there is no other).
func auditRequest(typ uint16, payload []byte) ([]byte, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_AUDIT)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	msg := make([]byte, 16+len(payload))
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	copy(msg[16:], payload)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		if n < 20 {
			return nil, errors.New("short audit reply")
		}
		switch binary.NativeEndian.Uint16(buf[4:]) {
		case unix.NLMSG_ERROR:
			if errno := int32(binary.NativeEndian.Uint32(buf[16:])); errno != 0 {
				return nil, unix.Errno(-errno)
			}
			if typ != auditGet {
				return buf[:n], nil
			}
		case typ:
			return buf[:n], nil
		}
	}
}

// KernelAuditOn reports whether kernel audit is on (root only).
func KernelAuditOn() (bool, error) { return auditEnabled() }

// SetKernelAudit turns kernel audit on or off (root only).
func SetKernelAudit(on bool) error {
	status := make([]byte, 40) // struct audit_status: mask, enabled, ...
	binary.NativeEndian.PutUint32(status[0:], auditStatusEnabled)
	if on {
		binary.NativeEndian.PutUint32(status[4:], 1)
	}
	_, err := auditRequest(auditSet, status)
	return err
}

func auditEnabled() (bool, error) {
	b, err := auditRequest(auditGet, nil)
	if err != nil {
		return false, err
	}
	if len(b) < auditStatusEnabledOff+4 {
		return false, errors.New("short audit status")
	}
	return binary.NativeEndian.Uint32(b[auditStatusEnabledOff:]) != 0, nil
}

// readLag, set by a test, runs before each record batch is taken: a
// reader lagging as on a loaded machine.
var readLag atomic.Pointer[func()]

func (w *auditWatch) read(fd int) {
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
				continue
			}
			return
		}
		if lag := readLag.Load(); lag != nil {
			(*lag)()
		}
		for b := buf[:n]; len(b) >= 16; {
			size := int(binary.NativeEndian.Uint32(b[0:]))
			if size < 16 || size > len(b) {
				break
			}
			w.record(binary.NativeEndian.Uint16(b[4:]), string(b[16:size]))
			b = b[min((size+3)&^3, len(b)):] // messages are 4-aligned; the last may not be padded
		}
	}
}

// record takes one audit record's text.
func (w *auditWatch) record(typ uint16, text string) {
	if typ == auditUser {
		w.mark(text)
		return
	}
	if typ != auditLandlockAccess && typ != auditLandlockDomain {
		return
	}
	domain := field(text, "domain")
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case typ == auditLandlockAccess:
		f := FileDenial{Blockers: field(text, "blockers"), Path: field(text, "path")}
		if !strings.HasPrefix(f.Blockers, "fs.") || f.Path == "" {
			return
		}
		if t := w.domains[domain]; t != nil {
			t.d.addFile(f)
		} else if len(w.pending) < 1024 {
			w.pending[domain] = append(w.pending[domain], f)
		}
	case field(text, "status") == "allocated":
		t := w.tags[field(text, "comm")]
		pending := w.pending[domain]
		delete(w.pending, domain)
		if t == nil {
			return
		}
		t.domain = domain
		w.domains[domain] = t
		for _, f := range pending {
			t.d.addFile(f)
		}
	case field(text, "status") == "deallocated":
		if t := w.domains[domain]; t != nil {
			delete(w.domains, domain)
			t.closeOnce.Do(func() { close(t.done) })
		}
		delete(w.pending, domain)
	}
}

// field is the value of key in an audit record: quoted, hex (an
// untrusted string with odd bytes) or plain.
func field(text, key string) string {
	i := strings.Index(" "+text, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := text[i+len(key)+1:]
	if strings.HasPrefix(v, `"`) {
		if end := strings.IndexByte(v[1:], '"'); end >= 0 {
			return v[1 : 1+end]
		}
		return ""
	}
	if end := strings.IndexByte(v, ' '); end >= 0 {
		v = v[:end]
	}
	if key == "path" || key == "comm" {
		if b, err := hex.DecodeString(v); err == nil {
			return string(b)
		}
	}
	return v
}

// tag registers d for the next launch's denials and returns the comm tag
// its trampoline takes ("" when capgate reads no audit). d.settle waits
// for the last of them.
func watchTag(d *Denials) string {
	w := watching.Load()
	if w == nil || d == nil {
		return ""
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	tag := "cg" + hex.EncodeToString(b[:]) // within TASK_COMM_LEN (15 and a NUL)
	d.mu.Lock()
	live := d.onFile != nil
	d.mu.Unlock()
	t := &tagged{d: d, added: time.Now(), done: make(chan struct{}), live: live}
	w.mu.Lock()
	for k, old := range w.tags { // launches long done
		if !old.live && time.Since(old.added) > 10*time.Minute || old.live && !old.ended.IsZero() && time.Since(old.ended) > 10*time.Minute {
			delete(w.tags, k)
			delete(w.domains, old.domain)
		}
	}
	w.tags[tag] = t
	w.mu.Unlock()
	d.setSettle(func() {
		// The records reach capgate after the tool's syscalls returned.
		// The tool has exited, so all of them were queued before a marker
		// queued now: wait for the marker, or for its domain's end (logged
		// once it had denials), whichever comes first. (A fixed wait for
		// the domain's end made every failed call without a denial wait it
		// out, and missed records a loaded machine delivered later.)
		w.settle(t.done, auditSettle)
		w.mu.Lock()
		delete(w.tags, tag)
		w.mu.Unlock()
	})
	return tag
}

// endTag marks a live launch's process ended (its cleanup): its tag goes
// with the next launch after a while, as a per-call one does.
func endTag(tag string) {
	w := watching.Load()
	if w == nil || tag == "" {
		return
	}
	w.mu.Lock()
	if t := w.tags[tag]; t != nil {
		t.ended = time.Now()
	}
	w.mu.Unlock()
}

// SettleAudit returns once capgate has read every audit record the kernel
// queued before the call (or after timeout): the records of a long-lived
// process's denials arrive after its syscalls returned, and a call's
// error may only name those that happened during it. It queues a marker
// of its own (an AUDIT_USER message: root, as reading audit is) behind
// them and waits for it; the kernel delivers records in order. Where
// capgate reads no audit it returns at once. It reports whether the
// marker arrived.
func SettleAudit(timeout time.Duration) bool {
	w := watching.Load()
	if w == nil {
		return false
	}
	return w.settle(nil, timeout)
}

// settle queues a marker behind the records the kernel holds and waits
// for it, for done, or for timeout; it reports whether the marker or done
// came.
func (w *auditWatch) settle(done <-chan struct{}, timeout time.Duration) bool {
	var b [8]byte
	_, _ = rand.Read(b[:])
	key := "capgate-settle-" + hex.EncodeToString(b[:])
	ch := make(chan struct{})
	w.mu.Lock()
	w.marks[key] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.marks, key)
		w.mu.Unlock()
	}()
	if _, err := auditRequest(auditUser, append([]byte(key), 0)); err != nil {
		if done == nil {
			return false
		}
		ch = nil // no marker is coming: only done or the timeout
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-done:
		return true
	case <-timer.C:
		return false
	}
}

// mark takes a user message: a marker of SettleAudit's has arrived.
func (w *auditWatch) mark(text string) {
	i := strings.Index(text, "capgate-settle-")
	if i < 0 {
		return
	}
	key := text[i:min(i+len("capgate-settle-")+16, len(text))]
	w.mu.Lock()
	if ch := w.marks[key]; ch != nil {
		close(ch)
		delete(w.marks, key)
	}
	w.mu.Unlock()
}
