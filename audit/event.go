// Package audit writes capgate's audit log: one JSON object per line per
// event, hash-chained so that an edited, removed, inserted or reordered line
// is detected by Verify.
//
// # Line format
//
// Every line has the same fixed key order. It starts with the trace's
// keys, in the trace's order, which mean on every line what they mean on
// a capability_check (a guarantee checked: a tool refused something it is
// guaranteed not to do):
//
//	type, tool_name, runner, resolved_source, capability, allowed,
//	guarantee_source, reason, protocol_version
//
// runner is local or service, resolved_source installed_pack or binding,
// capability a guarantee's capability (network, filesystem_write,
// subprocess, ...), guarantee_source tool, pack, user or policy, reason
// guarantee_blocked, protocol_version the number 1. Then capgate's:
//
//	time, seq, replica, sub, chat_id, chat_type, tool, kind, protocol,
//	required, layer, explanation, capability_id, decision, gate, code,
//	duration_ms, input_sha256, request_id, approval_id, flow_id,
//	account_ref, guarantees, detail, prev
//
// kind is the tool's source kind (ext, bridge, mcp), protocol the caller's
// (mcp/2025-11-25, capability-rpc), required, layer and explanation a grant_check's
// capability string, the grant layer that decided and why; capability_id
// an auth flow's capability (gog.email); guarantees the tool's effective
// guarantees as a JSON object (tool.Guarantees).
//
// Empty strings, a zero duration and a zero protocol_version are left
// out. type, time, seq and prev are always written; allowed is always
// written on a capability_check line and on other lines only when true.
// time is RFC 3339 with nanoseconds, in UTC; seq is the 1-based line
// number in the file; duration_ms has three decimals.
//
// # Chain
//
// prev is the hex SHA-256 of the previous line's bytes, without its newline;
// the first line of a file has 64 zeros. Because the chain alone cannot show
// that the last lines were cut off, the log also keeps a sidecar,
// <path>.head, holding {"seq":N,"hash":"…"} of the last line it made
// durable, replaced atomically after every group commit. VerifyFile checks
// the file against it.
//
// The chain is keyless: it shows accidental damage and naive edits, not a
// rewrite of the whole file and its sidecar by someone who can write both.
// Copy the head hash elsewhere to anchor it.
//
// # Writing
//
// Log never waits for the disk in the normal course: it encodes the event
// and queues it. A writer goroutine gives queued lines their seq and prev at
// most FlushInterval after the first of them arrived (at once when MaxBatch
// wait); an I/O goroutine writes them and fsyncs once per group, then
// replaces the sidecar. Flush and Close return once what was logged before
// them is on disk. A failed write is cut back off the file and tried again,
// byte for byte; if the disk falls MaxPending events behind, Log waits
// rather than drop records. Events logged after Close are dropped and
// counted (Dropped).
//
// # Admission
//
// Disk space is kept allocated ahead of the file's end (Options.Reserve),
// and every queued record is promised part of it. The router admits a
// call (Admit) only when its records' worst case fits in what is not yet
// promised, so a disk that fills cannot lose the record of a call that
// ran; see admit.go. While the log is unhealthy, a record no Ticket
// covers and no reserved space is left for is counted (Unrecorded)
// rather than queued.
//
// Several Logs, in one process or several, may share a file: each group
// commit holds an exclusive flock(2) on it, and lines are chained to
// whatever the file ends with at that moment. VerifyFile and TailFile take
// a shared flock for an instant, to read the file as of a moment between
// commits.
//
// Records never carry tokens, secrets or credential values: Event has no
// field for them, and callers must not put them in Detail or Reason.
package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
	"unicode/utf8"
)

// Event types.
const (
	TypeToolCall = "tool_call"
	// TypeCapabilityCheck is a guarantee checked, in the trace's schema.
	TypeCapabilityCheck = "capability_check"
	// TypeGrantCheck is a capability string checked against the caller's
	// grants.
	TypeGrantCheck   = "grant_check"
	TypeAuthBegin    = "auth_begin"
	TypeAuthComplete = "auth_complete"
	TypeApproval     = "approval"
	// TypePlan is a planning call's decision: the gates ran, nothing did.
	TypePlan = "plan"
	// TypeOperator is an operator's action in the console (sign-in,
	// approve, deny, revoke): Sub is the operator.
	TypeOperator = "operator_action"
	// TypeInvocationStart is a call admitted, before any gate: its
	// invocation's first record (AgentOS), the tool_call its last.
	TypeInvocationStart = "invocation_start"
	// TypeTask is a task method (tasks/get, tasks/update, tasks/cancel)
	// a caller sent for a task a call of Tool made (the MCP tasks
	// extension): Detail is the method, RequestID the call that made it.
	TypeTask = "task"
)

// Event is one audit record. Its fields are written in the order declared,
// with time, seq and prev placed as the package comment describes.
type Event struct {
	Type string

	// The trace's capability_check fields.
	ToolName, Runner, ResolvedSource, Capability string
	Allowed                                      bool
	GuaranteeSource, Reason                      string
	ProtocolVersion                              int // the trace schema's: 1

	// Time is when it happened; zero means when Log was called.
	Time time.Time
	// Replica is the replica that wrote the record; empty means the Log's
	// own (Options.Replica).
	Replica string

	Sub, ChatID, ChatType, Tool string
	Kind                        string // the tool's source kind
	Protocol                    string // the caller's: "mcp/2025-11-25", "capability-rpc"
	Via                         string // how the call was named: "call_tool" (tool search), or empty for directly
	// A grant_check's capability string, deciding layer and why.
	Required, Layer, Explanation string
	CapabilityID                 string // an auth flow's capability: gog.email
	Decision                     string // allow, deny or error
	Gate, Code                   string
	Duration                     time.Duration
	// InputSHA256 is HashInput of the call's input.
	InputSHA256, RequestID, ApprovalID, FlowID, AccountRef string
	// ClientInvocationID is the caller's own id for the call (AgentOS's
	// invocation_id), kept beside capgate's RequestID.
	ClientInvocationID string
	// Guarantees is the tool's effective guarantees, a JSON object
	// (tool.Guarantees marshalled), written as is.
	Guarantees string
	Detail     string // short, safe text
}

// Sink receives audit events. *Log is one; Discard drops them.
type Sink interface {
	Log(Event)
}

// Discard is a Sink that drops every event.
var Discard Sink = discard{}

type discard struct{}

func (discard) Log(Event) {}

// HashInput returns the hex SHA-256 of a call's input, as given.
func HashInput(raw []byte) string {
	sum := sha256.Sum256(raw)
	var h [2 * sha256.Size]byte // one allocation, where EncodeToString takes two
	hex.Encode(h[:], sum[:])
	return string(h[:])
}

// genesis is the prev of a file's first line.
const genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// A line is written in four parts: appendHead's bytes, seq, appendTail's
// bytes, then prev and the closing `"}`. Log encodes head and tail in the
// caller's goroutine; the writer adds seq and prev, which depend on order.

// appendHead appends a line's bytes up to seq's value: `{"type":…,"seq":`.
func appendHead(b []byte, e *Event) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, e.Type)
	b = appendField(b, `,"tool_name":`, e.ToolName)
	b = appendField(b, `,"runner":`, e.Runner)
	b = appendField(b, `,"resolved_source":`, e.ResolvedSource)
	b = appendField(b, `,"capability":`, e.Capability)
	if e.Allowed || e.Type == TypeCapabilityCheck {
		b = append(b, `,"allowed":`...)
		b = strconv.AppendBool(b, e.Allowed)
	}
	b = appendField(b, `,"guarantee_source":`, e.GuaranteeSource)
	b = appendField(b, `,"reason":`, e.Reason)
	if e.ProtocolVersion != 0 {
		b = append(b, `,"protocol_version":`...)
		b = strconv.AppendInt(b, int64(e.ProtocolVersion), 10)
	}
	b = append(b, `,"time":"`...)
	b = e.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, `","seq":`...)
}

// appendTail appends a line's bytes from after seq's value up to prev's
// value: `,"sub":…,"prev":"`.
func appendTail(b []byte, e *Event) []byte {
	b = appendField(b, `,"replica":`, e.Replica)
	b = appendField(b, `,"sub":`, e.Sub)
	b = appendField(b, `,"chat_id":`, e.ChatID)
	b = appendField(b, `,"chat_type":`, e.ChatType)
	b = appendField(b, `,"tool":`, e.Tool)
	b = appendField(b, `,"kind":`, e.Kind)
	b = appendField(b, `,"protocol":`, e.Protocol)
	b = appendField(b, `,"via":`, e.Via)
	b = appendField(b, `,"required":`, e.Required)
	b = appendField(b, `,"layer":`, e.Layer)
	b = appendField(b, `,"explanation":`, e.Explanation)
	b = appendField(b, `,"capability_id":`, e.CapabilityID)
	b = appendField(b, `,"decision":`, e.Decision)
	b = appendField(b, `,"gate":`, e.Gate)
	b = appendField(b, `,"code":`, e.Code)
	if e.Duration != 0 {
		b = append(b, `,"duration_ms":`...)
		b = strconv.AppendFloat(b, float64(e.Duration)/float64(time.Millisecond), 'f', 3, 64)
	}
	b = appendField(b, `,"input_sha256":`, e.InputSHA256)
	b = appendField(b, `,"request_id":`, e.RequestID)
	b = appendField(b, `,"client_invocation_id":`, e.ClientInvocationID)
	b = appendField(b, `,"approval_id":`, e.ApprovalID)
	b = appendField(b, `,"flow_id":`, e.FlowID)
	b = appendField(b, `,"account_ref":`, e.AccountRef)
	if e.Guarantees != "" {
		b = append(append(b, `,"guarantees":`...), e.Guarantees...)
	}
	b = appendField(b, `,"detail":`, e.Detail)
	return append(b, `,"prev":"`...)
}

// appendLine appends a whole line, without its newline, from its parts,
// and says where seq's digits are in the result.
func appendLine(b, head []byte, seq uint64, tail []byte, prev *[sha256.Size]byte) (_ []byte, seqStart, seqEnd int) {
	b = append(b, head...)
	seqStart = len(b)
	b = strconv.AppendUint(b, seq, 10)
	seqEnd = len(b)
	b = append(b, tail...)
	b = hex.AppendEncode(b, prev[:])
	return append(b, '"', '}'), seqStart, seqEnd
}

// appendField appends key and the string v, unless v is empty.
func appendField(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	return appendString(append(b, key...), v)
}

const hexDigits = "0123456789abcdef"

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plain8 reports whether none of the 8 bytes of s needs attention from
// appendString: each is printable ASCII other than '"' and '\\'.
func plain8(s string) bool {
	x := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
	ctl := (x - 0x20*ones) & ^x    // a byte below 0x20
	quote := (x ^ '"'*ones) - ones // a '"' byte
	quote &^= x ^ '"'*ones         //
	bs := (x ^ '\\'*ones) - ones   // a '\\' byte
	bs &^= x ^ '\\'*ones           //
	high := x | (x + ones)         // 0x7f and above; carries only out of bytes already flagged
	return (ctl|quote|bs|high)&highs == 0
}

// appendString appends s as a JSON string. Beyond what JSON requires it
// escapes DEL, the C1 controls and U+2028/U+2029, so that a line printed to
// a terminal cannot carry control sequences and no reader splits it; invalid
// UTF-8 becomes U+FFFD, as with encoding/json.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		// Skip 8 plain bytes at a time.
		for i+8 <= len(s) && plain8(s[i:i+8]) {
			i += 8
		}
		if i == len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != 0x7f {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r >= 0x80 && r <= 0x9f:
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
