package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/internal/loadtest"
)

func newBenchCmd() *cobra.Command {
	var o loadtest.Options
	var input string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure what capgate adds to a tool call",
		Long: `bench calls a tool directly on an upstream MCP server (--direct) and the same
tool through capgate (--through), both over streamable HTTP, interleaved in one
run, at each --concurrency: p50 and p99 latency and calls per second
(concurrency / mean latency) for each path. With --pid (capgate's process on
this host) it also reports capgate's CPU time per call, from /proc. --protocol
pins the MCP revision: 2025-11-25 is what most clients negotiate today (a
session), 2026-07-28 is stateless.

The token for capgate comes from --token, else CAPGATE_TOKEN.`,
		Example: `  capgate bench --direct http://127.0.0.1:9000/mcp --direct-tool t_00 \
    --through http://127.0.0.1:8787/mcp --through-tool fx__t_00 --pid $(pgrep -f 'capgate serve')`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Direct.URL == "" || o.Through.URL == "" || o.Direct.Tool == "" || o.Through.Tool == "" {
				return usageError("--direct, --direct-tool, --through and --through-tool are required")
			}
			if !json.Valid([]byte(input)) {
				return usageError("--input is not valid JSON")
			}
			o.Input = json.RawMessage(input)
			if o.Through.Token == "" {
				o.Through.Token = os.Getenv("CAPGATE_TOKEN")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			results, err := loadtest.Run(ctx, o)
			if err != nil {
				return &exitError{code: exitDenied, err: err}
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(benchJSON(results))
			}
			printBench(cmd, results)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Direct.URL, "direct", "", "the upstream's MCP endpoint")
	f.StringVar(&o.Direct.Tool, "direct-tool", "", "the tool's name on the upstream")
	f.StringVar(&o.Through.URL, "through", "", "capgate's MCP endpoint")
	f.StringVar(&o.Through.Tool, "through-tool", "", "the tool's exposed name on capgate")
	f.StringVar(&o.Through.Token, "token", "", "capgate token (default $CAPGATE_TOKEN)")
	f.StringVar(&input, "input", "{}", "the tool's arguments, a JSON object")
	f.IntVar(&o.Calls, "calls", 2000, "calls per path at each concurrency")
	f.IntSliceVar(&o.Concurrency, "concurrency", []int{1, 16}, "concurrency levels")
	f.IntVar(&o.PID, "pid", 0, "capgate's process id, for its CPU time per call")
	f.StringVar(&o.Protocol, "protocol", "", "the MCP revision to pin: 2025-11-25 (sessions) or 2026-07-28 (stateless); default the newest both sides speak")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	return cmd
}

func printBench(cmd *cobra.Command, results []loadtest.Result) {
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CONCURRENCY\tPATH\tCALLS\tERRORS\tP50\tP99\tCALLS/S\tCAPGATE CPU/CALL")
	us := func(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond)) }
	for _, r := range results {
		cpu := "-"
		if r.CPUPerCall > 0 {
			cpu = us(r.CPUPerCall)
		}
		fmt.Fprintf(w, "%d\tdirect\t%d\t%d\t%s\t%s\t%.0f\t\n", r.Concurrency, r.Direct.Calls, r.Direct.Errors, us(r.Direct.P50), us(r.Direct.P99), r.Direct.PerSecond)
		fmt.Fprintf(w, "%d\tcapgate\t%d\t%d\t%s\t%s\t%.0f\t%s\n", r.Concurrency, r.Through.Calls, r.Through.Errors, us(r.Through.P50), us(r.Through.P99), r.Through.PerSecond, cpu)
		fmt.Fprintf(w, "%d\tadded\t\t\t%s\t%s\t%.0f%%\t\n", r.Concurrency, us(r.Through.P50-r.Direct.P50), us(r.Through.P99-r.Direct.P99),
			100*r.Through.PerSecond/max(r.Direct.PerSecond, 1))
	}
	w.Flush()
}

// benchStats and benchLevel are bench --json's shape: one level per
// concurrency, latencies in microseconds.
type benchStats struct {
	Calls     int     `json:"calls"`
	Errors    int     `json:"errors"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	PerSecond float64 `json:"calls_per_second"`
}

type benchLevel struct {
	Concurrency int        `json:"concurrency"`
	Direct      benchStats `json:"direct"`
	Capgate     benchStats `json:"capgate"`
	// CPUPerCallUS is capgate's CPU per call; absent without --pid.
	CPUPerCallUS float64 `json:"capgate_cpu_per_call_us,omitempty"`
}

func benchJSON(results []loadtest.Result) []benchLevel {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	stats := func(s loadtest.Stats) benchStats {
		return benchStats{Calls: s.Calls, Errors: s.Errors, P50us: us(s.P50), P99us: us(s.P99), PerSecond: s.PerSecond}
	}
	out := make([]benchLevel, 0, len(results))
	for _, r := range results {
		out = append(out, benchLevel{Concurrency: r.Concurrency, Direct: stats(r.Direct), Capgate: stats(r.Through), CPUPerCallUS: us(r.CPUPerCall)})
	}
	return out
}
