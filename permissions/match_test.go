package permissions

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "regenerate testdata/fnmatch_corpus.jsonl from python3")

func TestMatchTable(t *testing.T) {
	tests := []struct {
		pat, s string
		want   bool
	}{
		{"rye.execute.tool.mcp.filesystem.*", "rye.execute.tool.mcp.filesystem.read_file", true},
		{"rye.execute.*", "rye.execute.tool.mcp.filesystem.read_file", true}, // '*' crosses dots
		{"rye.execute.tool.mcp.*", "rye.fetch.tool.mcp.x", false},
		{"rye.execute.tool.?", "rye.execute.tool.a", true},
		{"rye.execute.tool.?", "rye.execute.tool.ab", false},
		{"*", "", true},
		{"", "", true},
		{"", "a", false},
		{"a*", "a\nb", true}, // '*' crosses newlines too
		{"[a-c]", "b", true},
		{"[c-a]", "b", false}, // reversed range matches nothing
		{"[c-a]", "c", false},
		{"[!c-a]", "z", true}, // negated empty set: any one character
		{"[!a-c]", "b", false},
		{"[!a-c]", "d", true},
		{"[]a]", "]", true}, // leading ']' is literal
		{"[!]a]", "]", false},
		{"[!]a]", "b", true},
		{"[a", "[a", true}, // unclosed '[' is literal
		{"a[", "a[", true},
		{"[!", "[!", true},
		{`a\*`, `a\bc`, true}, // no escapes: backslash is a character
		{`a\*`, "a*", false},
		{`[\]`, `\`, true},
		{"{a,b}", "a", false}, // no braces
		{"{a,b}", "{a,b}", true},
		{"[a-]", "-", true},
		{"[a-]", "b", false},
		{"[--a]", ".", true}, // range '-'..'a' includes '.'
		{"[a-b-c]", "-", true},
		{"[a-b-c]", "c", true},
		{"[^a]", "^", true}, // '^' is not negation
		{"[^a]", "b", false},
		{"[&&]", "&", true},
		{"rye.Execute.*", "rye.execute.x", false}, // case-sensitive
		{"ü?", "üx", true},
		{"?", "ü", true}, // one character, not one byte
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q~%q", tt.pat, tt.s), func(t *testing.T) {
			if got := Match(tt.pat, tt.s); got != tt.want {
				t.Errorf("Match(%q, %q) = %v, want %v", tt.pat, tt.s, got, tt.want)
			}
		})
	}
}

// pair is one differential case: Python's verdict for (pattern, string).
type pair struct {
	Pattern string `json:"p"`
	S       string `json:"s"`
	Want    bool   `json:"m"`
}

// alphabet is rich in the characters where fnmatch implementations differ.
const alphabet = `.-_*?[]!^\{},ab` + `rye` + "z-"

// genPairs makes n (pattern, string) pairs. Patterns are built from pieces
// that stress fnmatch: bracket expressions with ranges (reversed ones too),
// negation, leading ']', unclosed '[', hyphens in odd places, backslashes
// and braces. Half the strings are instantiated from the pattern so that
// matches are common; the rest are random.
func genPairs(seed uint64, n int) []pair {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ab := []rune(alphabet)
	char := func() rune { return ab[rng.IntN(len(ab))] }
	randStr := func(max int) string {
		var b strings.Builder
		for range rng.IntN(max + 1) {
			b.WriteRune(char())
		}
		return b.String()
	}
	bracket := func() string {
		var b strings.Builder
		b.WriteByte('[')
		if rng.IntN(3) == 0 {
			b.WriteByte('!')
		}
		if rng.IntN(4) == 0 {
			b.WriteByte(']')
		}
		for range rng.IntN(5) {
			switch rng.IntN(3) {
			case 0: // a range, in either order
				b.WriteRune(char())
				b.WriteByte('-')
				b.WriteRune(char())
			case 1:
				b.WriteByte('-')
			default:
				b.WriteRune(char())
			}
		}
		if rng.IntN(6) != 0 {
			b.WriteByte(']')
		}
		return b.String()
	}
	out := make([]pair, 0, n)
	for len(out) < n {
		var pb strings.Builder
		if rng.IntN(4) == 0 {
			pb.WriteString("rye.")
		}
		for range 1 + rng.IntN(5) {
			switch rng.IntN(6) {
			case 0:
				pb.WriteByte('*')
			case 1:
				pb.WriteByte('?')
			case 2, 3:
				pb.WriteString(bracket())
			default:
				pb.WriteString(randStr(3))
			}
		}
		p := pb.String()
		var s string
		if rng.IntN(2) == 0 {
			s = randStr(10)
		} else {
			// Instantiate: wildcards and brackets become random text, so
			// some of it matches and some barely misses.
			var b strings.Builder
			for _, r := range p {
				switch {
				case r == '*':
					b.WriteString(randStr(3))
				case r == '?' || strings.ContainsRune("[]!-", r) && rng.IntN(2) == 0:
					b.WriteRune(char())
				default:
					b.WriteRune(r)
				}
			}
			s = b.String()
		}
		out = append(out, pair{Pattern: p, S: s})
	}
	return out
}

// pythonVerdicts asks python3 for fnmatch.fnmatchcase on every pair.
func pythonVerdicts(t *testing.T, pairs []pair) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 not found, and CI must run the differential test against fnmatch.fnmatchcase")
		}
		t.Skip("python3 not found: the differential test against fnmatch.fnmatchcase needs it (CI has it)")
	}
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, p := range pairs {
		if err := enc.Encode([2]string{p.Pattern, p.S}); err != nil {
			t.Fatal(err)
		}
	}
	const script = `import sys, json, fnmatch
out = []
for line in sys.stdin:
    p, s = json.loads(line)
    out.append("1" if fnmatch.fnmatchcase(s, p) else "0")
sys.stdout.write("".join(out))`
	cmd := exec.Command(py, "-c", script)
	cmd.Stdin = &in
	cmd.Stderr = os.Stderr
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	if len(got) != len(pairs) {
		t.Fatalf("python3 answered %d verdicts for %d pairs", len(got), len(pairs))
	}
	for i := range pairs {
		pairs[i].Want = got[i] == '1'
	}
}

func checkPairs(t *testing.T, pairs []pair) (matches int) {
	t.Helper()
	bad := 0
	for _, p := range pairs {
		got := Match(p.Pattern, p.S)
		if got {
			matches++
		}
		if got != p.Want {
			bad++
			if bad <= 20 {
				t.Errorf("Match(%q, %q) = %v, python fnmatchcase says %v", p.Pattern, p.S, got, p.Want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d pairs disagree with python", bad, len(pairs))
	}
	return matches
}

// TestMatchPythonDifferential compares Match with python3's fnmatchcase on
// freshly generated pairs.
func TestMatchPythonDifferential(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 3000
	}
	var pairs []pair
	for seed := uint64(1); seed <= 4; seed++ {
		pairs = append(pairs, genPairs(seed, n/4)...)
	}
	pythonVerdicts(t, pairs)
	matches := checkPairs(t, pairs)
	// A generator that never produced matches would prove nothing.
	if matches < len(pairs)/10 {
		t.Fatalf("only %d of %d pairs match: the generator is too weak", matches, len(pairs))
	}
	t.Logf("%d pairs, %d matches, 0 disagreements", len(pairs), matches)
}

const corpusFile = "testdata/fnmatch_corpus.jsonl"

// TestMatchCorpus replays a corpus of python3 verdicts kept in testdata, so
// the property holds even where python3 is absent. -update regenerates it.
func TestMatchCorpus(t *testing.T) {
	if *update {
		pairs := genPairs(42, 4000)
		pythonVerdicts(t, pairs)
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		for _, p := range pairs {
			if err := enc.Encode(p); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(filepath.Dir(corpusFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(corpusFile, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pairs := readCorpus(t)
	if len(pairs) < 1000 {
		t.Fatalf("corpus has %d pairs; regenerate with -update", len(pairs))
	}
	checkPairs(t, pairs)
}

func readCorpus(t testing.TB) []pair {
	t.Helper()
	f, err := os.Open(corpusFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var pairs []pair
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var p pair
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("%s: %v", corpusFile, err)
		}
		pairs = append(pairs, p)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return pairs
}

// naiveMatch is a plain recursive reading of the compiled tokens, a second
// opinion on the backtracking loop of Pattern.Match.
func naiveMatch(toks []token, s string) bool {
	if len(toks) == 0 {
		return s == ""
	}
	t := toks[0]
	switch t.kind {
	case tokStar:
		for i := 0; ; {
			if naiveMatch(toks[1:], s[i:]) {
				return true
			}
			if i >= len(s) {
				return false
			}
			_, n := decode(s[i:])
			i += n
		}
	case tokLiteral:
		return strings.HasPrefix(s, t.lit) && naiveMatch(toks[1:], s[len(t.lit):])
	case tokAny:
		if s == "" {
			return false
		}
		_, n := decode(s)
		return naiveMatch(toks[1:], s[n:])
	default:
		if s == "" {
			return false
		}
		r, n := decode(s)
		return t.cls.match(r) && naiveMatch(toks[1:], s[n:])
	}
}

func FuzzMatch(f *testing.F) {
	for _, p := range readCorpus(f)[:200] {
		f.Add(p.Pattern, p.S)
	}
	f.Fuzz(func(t *testing.T, pat, s string) {
		if len(pat) > 64 || len(s) > 64 {
			return // keep the naive matcher's worst case small
		}
		c := Compile(pat)
		if got, want := c.Match(s), naiveMatch(c.toks, s); got != want {
			t.Fatalf("Match(%q, %q) = %v, naive reading says %v", pat, s, got, want)
		}
		if c.Literal() && c.Match(s) != (s == pat) {
			t.Fatalf("literal pattern %q: Match(%q) differs from equality", pat, s)
		}
	})
}
