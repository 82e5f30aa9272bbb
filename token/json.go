package token

import (
	"math"
	"strconv"
	"strings"
)

// maxNumericDate bounds a NumericDate (seconds since 1970): about year 33658.
const maxNumericDate = 1e12

// jsonSeconds decodes a NumericDate: an integer or a fraction of seconds
// since 1970. ok is false for anything else.
func jsonSeconds(val string) (sec, nsec int64, ok bool) {
	if val == "" || (val[0] != '-' && (val[0] < '0' || val[0] > '9')) {
		return 0, 0, false
	}
	if strings.IndexAny(val, ".eE") < 0 {
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n > maxNumericDate || n < -maxNumericDate {
			return 0, 0, false
		}
		return n, 0, true
	}
	f, err := strconv.ParseFloat(val, 64)
	if err != nil || math.IsNaN(f) || f > maxNumericDate || f < -maxNumericDate {
		return 0, 0, false
	}
	whole, frac := math.Modf(f)
	return int64(whole), int64(frac * 1e9), true
}

// appendPyString appends s as Python's json.dumps writes a str with its
// default ensure_ascii=True: \" \\ \b \f \n \r \t, every other character
// outside ' '..'~' as \u00xx (lower-case hex), non-BMP characters as a
// surrogate pair. '<', '>' and '&' stay as they are. s must be valid UTF-8.
func appendPyString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	u4 := func(b []byte, r rune) []byte {
		return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
	}
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r >= ' ' && r <= '~':
			b = append(b, byte(r))
		case r < 0x10000:
			b = u4(b, r)
		default:
			r -= 0x10000
			b = u4(b, 0xd800|(r>>10)&0x3ff)
			b = u4(b, 0xdc00|r&0x3ff)
		}
	}
	return append(b, '"')
}
