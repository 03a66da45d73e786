// Command mint gets COUNT Snowflake IDs from a snowlease sidecar in mint mode
// and prints them.
//
// GET /next?count=N (N at most 4096 per request) over the unix socket the
// sidecar serves with --mint-socket (SNOWLEASE_MINT_SOCKET, default
// /var/run/snowlease/mint.sock), Accept: text/plain (one decimal ID a line).
// While the sidecar answers 503 (no valid lease yet: claiming, guard_closed,
// clock_behind, ...) or its socket is not there yet, it retries after the
// Retry-After seconds (1 s without an answer), for at most --wait seconds
// (default 30) in all: the last try comes at the end of --wait.
//
// Prints COUNT IDs, one a line, increasing, and exits 0. When none come within
// --wait: a message on stderr (the last answer), exit 3, nothing on stdout.
// Any other answer (e.g. 400): exit 1. Bad arguments: exit 2.
//
// Standard library only; Go 1.19+. Run: go run mint.go [--wait SECONDS] COUNT
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxBatch is the most IDs one request may ask for.
const maxBatch = 4096

// noIDs says why no IDs came; code is the exit code (3: none within --wait,
// 1: another answer).
type noIDs struct {
	code    int
	message string
}

func (e *noIDs) Error() string { return e.message }

// client sends every request to the unix socket at path, whatever the URL's host.
func client(path string) *http.Client {
	var dialer net.Dialer
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, "unix", path)
			},
		},
	}
}

// next sends one GET /next?count=n: the status, the Retry-After header and the body.
func next(c *http.Client, n int) (int, string, string, error) {
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://snowlease/next?count=%d", n), nil)
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(body), err
}

// mint returns count IDs as decimal strings, or a *noIDs once wait is spent.
func mint(path string, count int, wait time.Duration) ([]string, error) {
	c := client(path)
	deadline := time.Now().Add(wait)
	ids := make([]string, 0, count)
	for len(ids) < count {
		status, retryAfter, body, err := next(c, min(count-len(ids), maxBatch))
		if err == nil && status == http.StatusOK {
			ids = append(ids, strings.Fields(body)...)
			continue
		}
		last := fmt.Sprintf("%d %s", status, strings.TrimSpace(body))
		if err != nil { // no socket yet, refused, timeout
			last = err.Error()
		} else if status != http.StatusServiceUnavailable {
			return nil, &noIDs{1, "GET /next answered " + last}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, &noIDs{3, fmt.Sprintf("no IDs from %s within %v (last answer: %s)", path, wait, last)}
		}
		delay := time.Second
		if secs, err := strconv.Atoi(retryAfter); err == nil && secs >= 0 {
			delay = time.Duration(secs) * time.Second
		}
		if delay > left {
			delay = left
		}
		time.Sleep(delay)
	}
	return ids, nil
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func main() {
	wait := flag.Float64("wait", 30, "retry 503s this long, in seconds")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: mint [--wait SECONDS] COUNT   (COUNT at least 1)")
	}
	flag.Parse()
	count, err := strconv.Atoi(flag.Arg(0))
	if flag.NArg() != 1 || err != nil || count < 1 || *wait < 0 {
		flag.Usage()
		os.Exit(2)
	}
	path := os.Getenv("SNOWLEASE_MINT_SOCKET")
	if path == "" {
		path = "/var/run/snowlease/mint.sock"
	}
	ids, err := mint(path, count, time.Duration(*wait*float64(time.Second)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if e, ok := err.(*noIDs); ok {
			os.Exit(e.code)
		}
		os.Exit(1)
	}
	fmt.Println(strings.Join(ids, "\n"))
}
