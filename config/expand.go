package config

import (
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// expandEnv replaces ${NAME} and ${NAME:-default} in every string of the
// config, in place. An unset NAME without a default is an error naming the
// key. A '$' not followed by '{' is kept as is.
func expandEnv(c *Config, lookup func(string) (string, bool), fail func(key, format string, args ...any)) {
	walkStrings(reflect.ValueOf(c).Elem(), "", func(key string, s string) string {
		out, err := expand(s, lookup)
		if err != "" {
			fail(key, "%s", err)
			return s
		}
		return out
	})
}

func expand(s string, lookup func(string) (string, bool)) (string, string) {
	if !strings.Contains(s, "${") {
		return s, ""
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), ""
		}
		b.WriteString(s[:i])
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return "", "unclosed ${ in " + quote(s)
		}
		ref := s[i+2 : i+j]
		name, def, hasDef := strings.Cut(ref, ":-")
		if !validEnvName(name) {
			return "", "${" + ref + "} is not a valid variable reference"
		}
		v, ok := lookup(name)
		switch {
		case ok && v != "":
		case hasDef:
			v = def
		case !ok:
			return "", "environment variable " + name + " is not set (write ${" + name + ":-default} for a default)"
		}
		b.WriteString(v)
		s = s[i+j+1:]
	}
}

func quote(s string) string { return `"` + s + `"` }

func itoa(i int) string { return strconv.Itoa(i) }

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// walkStrings calls f on every string reachable from v (struct fields,
// slices, map values, pointers), with its dotted TOML key, and stores what
// f returns.
func walkStrings(v reflect.Value, key string, f func(key, s string) string) {
	join := func(k string) string {
		if key == "" {
			return k
		}
		return key + "." + k
	}
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			walkStrings(v.Elem(), key, f)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			tag := t.Field(i).Tag.Get("toml")
			if tag == "" || tag == "-" {
				continue
			}
			walkStrings(v.Field(i), join(tag), f)
		}
	case reflect.Slice:
		for i := range v.Len() {
			walkStrings(v.Index(i), key+"["+itoa(i)+"]", f)
		}
	case reflect.Map:
		keys := v.MapKeys()
		sort.Slice(keys, func(a, b int) bool { return keys[a].String() < keys[b].String() })
		for _, k := range keys {
			e := v.MapIndex(k)
			if e.Kind() == reflect.String {
				v.SetMapIndex(k, reflect.ValueOf(f(join(k.String()), e.String())).Convert(e.Type()))
				continue
			}
			// Struct values in maps are not addressable: copy, walk, store.
			c := reflect.New(e.Type()).Elem()
			c.Set(e)
			walkStrings(c, join(k.String()), f)
			v.SetMapIndex(k, c)
		}
	case reflect.String:
		if v.CanSet() {
			v.SetString(f(key, v.String()))
		}
	}
}
