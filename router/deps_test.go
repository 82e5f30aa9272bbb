package router

import (
	"os/exec"
	"strings"
	"testing"
)

// TestRouterDependsOnNoAdapter: the router defines the interfaces it needs
// (State, audit.Sink, Metrics, Tracer) and app joins the implementations,
// so building the router pulls in no storage backend, no telemetry
// exporter and no MCP server. `go list -deps` of the package (tests
// excluded) names none of them.
func TestRouterDependsOnNoAdapter(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"modernc.org/sqlite", "github.com/jackc/pgx", "go.opentelemetry.io/otel/exporters",
		"github.com/prometheus", "github.com/mark3labs/mcp-go/server",
		// capgate's adapters: the router sees them only through its interfaces.
		"github.com/capgate/capgate/store", "github.com/capgate/capgate/telemetry",
		"github.com/capgate/capgate/sources", "github.com/capgate/capgate/app",
		"github.com/capgate/capgate/server",
	}
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("the router depends on %s", dep)
			}
		}
	}
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages: %q", len(deps), out)
	}
}
