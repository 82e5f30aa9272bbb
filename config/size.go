package config

import (
	"fmt"
	"strconv"
	"strings"
)

// ByteSize is a size in bytes, written as an integer (8388608) or a
// string with a unit ("8MiB", "512KiB", "4MB"; B, KB/KiB, MB/MiB, GB/GiB,
// where KB and KiB both mean 1024).
type ByteSize int64

func (b *ByteSize) UnmarshalText(t []byte) error {
	s := strings.TrimSpace(string(t))
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '_' })
	if i < 0 {
		i = len(s)
	}
	num, unit := s[:i], strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := sizeUnits[unit]
	n, err := strconv.ParseInt(strings.ReplaceAll(num, "_", ""), 10, 64)
	if !ok || err != nil || num == "" {
		return fmt.Errorf("%q is not a size such as \"8MiB\", \"512KiB\" or a number of bytes", t)
	}
	if n > (1<<62)/mult {
		return fmt.Errorf("%q is too large", t)
	}
	*b = ByteSize(n * mult)
	return nil
}

func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// String writes b in the largest binary unit that divides it.
func (b ByteSize) String() string {
	switch {
	case b != 0 && b%(1<<30) == 0:
		return strconv.FormatInt(int64(b>>30), 10) + "GiB"
	case b != 0 && b%(1<<20) == 0:
		return strconv.FormatInt(int64(b>>20), 10) + "MiB"
	case b != 0 && b%(1<<10) == 0:
		return strconv.FormatInt(int64(b>>10), 10) + "KiB"
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
}
