// Command hostile is the tool the sandbox tests confine: each argument is
// one attempt (write=PATH, writetmp=, read=PATH, tcp=ADDR, udp=ADDR, spawn=PROGRAM,
// env=NAME, id) and it prints one line per attempt, "<attempt> ok <detail>"
// or "<attempt> denied <error>", so a test sees what the kernel allowed.
// With --json first it writes one JSON object instead, attempt → result,
// as an extension command must. With --fail first it prints the lines and
// exits 254 when any attempt was denied, as a tool that gives up would.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/capgate/capgate/internal/testkit/attempt"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--json" {
		out := map[string]string{}
		for _, a := range args[1:] {
			out[a] = attempt.Try(a)
		}
		json.NewEncoder(os.Stdout).Encode(out)
		return
	}
	fail := len(args) > 0 && args[0] == "--fail"
	if fail {
		args = args[1:]
	}
	denied := false
	for _, a := range args {
		r := attempt.Try(a)
		denied = denied || strings.HasPrefix(r, "denied")
		fmt.Printf("%s %s\n", a, r)
	}
	if fail && denied {
		os.Exit(254)
	}
}
