package testkit

import (
	"maps"
	"strings"
	"testing"
)

// TestListKeys: a program's key is the same whether it is listed alone or
// with others, and programs made of different packages differ.
func TestListKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	both := listKeys([]string{MCPFixture, BridgeFixture})
	alone := listKeys([]string{MCPFixture})
	if len(both) != 2 || len(alone) != 1 {
		t.Fatalf("keys: %v and %v", both, alone)
	}
	if both[MCPFixture] != alone[MCPFixture] {
		t.Errorf("mcpfixture's key listed with another %s, alone %s", both[MCPFixture], alone[MCPFixture])
	}
	if both[MCPFixture] == both[BridgeFixture] || !strings.HasPrefix(both[BridgeFixture], "bridgefixture-") {
		t.Errorf("keys %v", both)
	}
	if got := listKeys([]string{MCPFixture, "github.com/capgate/capgate/no/such/program"}); got != nil {
		t.Errorf("a batch with a package that does not exist keyed %v", got)
	}
	// Programs batches: keying one keys the others, and Build's next
	// question is answered without go list.
	keysMu.Lock()
	saved, savedPrograms := maps.Clone(keys), programs
	keys, programs = map[string]string{}, []string{BridgeFixture}
	keysMu.Unlock()
	t.Cleanup(func() { keysMu.Lock(); keys, programs = saved, savedPrograms; keysMu.Unlock() })
	if k := binKey(MCPFixture); k != both[MCPFixture] {
		t.Errorf("binKey %s, want %s", k, both[MCPFixture])
	}
	keysMu.Lock()
	k, ok := keys[BridgeFixture]
	keysMu.Unlock()
	if !ok || k != both[BridgeFixture] {
		t.Errorf("the program Programs named was not keyed with the first: %q", k)
	}
}
