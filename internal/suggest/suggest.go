// Package suggest finds the word a mistyped one was likely meant to be,
// for "did you mean" in error messages.
package suggest

import "strings"

// Nearest returns the candidate closest to s when it is close enough to
// be a likely typo ('-' and '_' and case not counted), else "".
func Nearest(s string, candidates []string) string {
	norm := func(x string) string { return strings.ReplaceAll(strings.ToLower(x), "-", "_") }
	best, bestD := "", 3
	for _, c := range candidates {
		d := distance(norm(s), norm(c))
		if d < bestD && d*2 < len(c) {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
