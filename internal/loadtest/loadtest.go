// Package loadtest measures a tool called directly on an upstream MCP
// server and the same tool called through capgate, interleaved in one run
// so both see the same machine: latency percentiles, calls per second, and
// capgate's own CPU time per call.
package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// Target is one MCP endpoint and the tool to call there.
type Target struct {
	URL   string // streamable HTTP endpoint
	Tool  string
	Token string // bearer token, if any
}

// Options configure a run.
type Options struct {
	Direct, Through Target
	Input           json.RawMessage // the tool's arguments; default {}
	Calls           int             // per target per concurrency level
	Concurrency     []int
	// PID is capgate's process on this host, for its CPU time; 0 skips it.
	PID int
	// Protocol is the MCP revision both clients pin: 2025-11-25 (a
	// session), 2026-07-28 (stateless); "" lets them negotiate the newest.
	Protocol string
}

// Stats are one target's numbers at one concurrency.
type Stats struct {
	Calls     int
	Errors    int
	P50, P99  time.Duration
	PerSecond float64 // concurrency / mean latency
}

// Result is one concurrency level.
type Result struct {
	Concurrency     int
	Direct, Through Stats
	// CPUPerCall is capgate's CPU time (user+system) over the level,
	// divided by the calls made through it; 0 when PID was not given.
	CPUPerCall time.Duration
}

// Run measures every concurrency level in turn.
func Run(ctx context.Context, o Options) ([]Result, error) {
	if o.Calls <= 0 {
		o.Calls = 2000
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 16}
	}
	if len(o.Input) == 0 {
		o.Input = json.RawMessage("{}")
	}
	var args map[string]any
	if err := json.Unmarshal(o.Input, &args); err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 128, IdleConnTimeout: 90 * time.Second}}
	if o.Protocol != "" && !mcp.IsValidProtocolVersion(o.Protocol) {
		return nil, fmt.Errorf("protocol %q: not a revision this client speaks (%s)", o.Protocol, strings.Join(mcp.ValidProtocolVersions, ", "))
	}
	direct, err := dial(ctx, o.Direct, hc, o.Protocol)
	if err != nil {
		return nil, fmt.Errorf("direct %s: %w", o.Direct.URL, err)
	}
	defer direct.Close()
	through, err := dial(ctx, o.Through, hc, o.Protocol)
	if err != nil {
		return nil, fmt.Errorf("through capgate %s: %w", o.Through.URL, err)
	}
	defer through.Close()
	// Warm both paths: connections, caches, upstream sessions.
	for range 50 {
		if err := call(ctx, direct, o.Direct.Tool, args); err != nil {
			return nil, fmt.Errorf("direct %s: %w", o.Direct.Tool, err)
		}
		if err := call(ctx, through, o.Through.Tool, args); err != nil {
			return nil, fmt.Errorf("through capgate %s: %w", o.Through.Tool, err)
		}
	}
	var out []Result
	for _, c := range o.Concurrency {
		r, err := level(ctx, o, c, args, direct, through)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func dial(ctx context.Context, t Target, hc *http.Client, protocol string) (*client.Client, error) {
	opts := []transport.StreamableHTTPCOption{transport.WithHTTPBasicClient(hc)}
	if t.Token != "" {
		opts = append(opts, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + t.Token}))
	}
	tr, err := transport.NewStreamableHTTP(t.URL, opts...)
	if err != nil {
		return nil, err
	}
	var copts []client.ClientOption
	if protocol == "" {
		protocol = mcp.LATEST_PROTOCOL_VERSION
	} else {
		copts = append(copts, client.WithProtocolVersion(protocol))
	}
	c := client.NewClient(tr, copts...)
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = protocol
	init.Params.ClientInfo = mcp.Implementation{Name: "capgate-bench", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func call(ctx context.Context, c *client.Client, name string, args map[string]any) error {
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return err
	}
	if res.IsError {
		return fmt.Errorf("%s answered with an error: %v", name, res.Content)
	}
	return nil
}

// level runs calls per target at concurrency c: each worker alternates a
// direct call and a call through capgate.
func level(ctx context.Context, o Options, c int, args map[string]any, direct, through *client.Client) (Result, error) {
	per := max(o.Calls/c, 1)
	var mu sync.Mutex
	var dl, tl []time.Duration
	var derr, terr int
	cpu0, err := cpuTime(o.PID)
	if err != nil {
		return Result{}, err
	}
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			d, t := make([]time.Duration, 0, per), make([]time.Duration, 0, per)
			var de, te int
			for range per {
				start := time.Now()
				if call(ctx, direct, o.Direct.Tool, args) != nil {
					de++
				}
				mid := time.Now()
				if call(ctx, through, o.Through.Tool, args) != nil {
					te++
				}
				d, t = append(d, mid.Sub(start)), append(t, time.Since(mid))
			}
			mu.Lock()
			dl, tl, derr, terr = append(dl, d...), append(tl, t...), derr+de, terr+te
			mu.Unlock()
		})
	}
	wg.Wait()
	cpu1, err := cpuTime(o.PID)
	if err != nil {
		return Result{}, err
	}
	r := Result{Concurrency: c, Direct: stats(dl, derr, c), Through: stats(tl, terr, c)}
	if o.PID != 0 && len(tl) > 0 {
		r.CPUPerCall = (cpu1 - cpu0) / time.Duration(len(tl))
	}
	return r, nil
}

func stats(ls []time.Duration, errs, c int) Stats {
	slices.Sort(ls)
	s := Stats{Calls: len(ls), Errors: errs}
	if len(ls) == 0 {
		return s
	}
	var sum time.Duration
	for _, l := range ls {
		sum += l
	}
	s.P50, s.P99 = ls[len(ls)/2], ls[min(len(ls)-1, len(ls)*99/100)]
	s.PerSecond = float64(c) / (sum.Seconds() / float64(len(ls)))
	return s
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times; 100 on Linux.
const clockTick = 100

// cpuTime is the CPU time pid has used: the sum of its threads' run time
// in /proc/PID/task/*/schedstat, in nanoseconds (a fast capgate spends
// less than one 10 ms clock tick on a short level), else user plus
// system time from /proc/PID/stat.
func cpuTime(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, nil
	}
	if t, ok := schedTime(pid); ok {
		return t, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("capgate's CPU time: %w", err)
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("capgate's CPU time: /proc/%d/stat is short", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("capgate's CPU time: /proc/%d/stat is not as expected", pid)
	}
	return time.Duration(utime+stime) * time.Second / clockTick, nil
}

// schedTime sums the run time of pid's threads, when the kernel keeps
// schedstat. A thread that ends takes its time with it; Go's rarely do.
func schedTime(pid int) (time.Duration, bool) {
	paths, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if len(paths) == 0 {
		return 0, false
	}
	var sum time.Duration
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended since the glob
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += time.Duration(ns)
	}
	return sum, true
}
