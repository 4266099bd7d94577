// Command bench measures the Go client's throughput against a Sessions server: serial 1 KB
// appends, and streaming a long history of 1 KB messages.
//
//	go run ./cmd/bench                      # starts its own server (like the tests do)
//	go run ./cmd/bench -target 127.0.0.1:50051
//
// Each run uses a fresh object, so it can be pointed at a shared server.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sessions-dev/sessions/clients/go/internal/testserver"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

func main() {
	target := flag.String("target", "", "server address; empty starts a sessions-server (repo .venv or $SESSIONS_SERVER_CMD)")
	appends := flag.Int("appends", 2000, "serial appends to time")
	history := flag.Int("history", 10000, "messages in the streamed history")
	size := flag.Int("size", 1024, "JSON bytes per message")
	runs := flag.Int("runs", 3, "history reads to time (the best and the median are reported)")
	flag.Parse()
	if err := run(*target, *appends, *history, *size, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(target string, appends, historyLen, size, runs int) error {
	ctx := context.Background()
	if target == "" {
		srv, err := testserver.Start()
		if err != nil {
			return err
		}
		defer srv.Stop()
		target = srv.Addr
		fmt.Printf("server: %s (started by bench)\n", target)
	} else {
		fmt.Printf("server: %s\n", target)
	}
	client, err := sessions.Dial(ctx, target, sessions.WithBlock())
	if err != nil {
		return err
	}
	defer client.Close()
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	obj := client.Object("go-bench/" + hex.EncodeToString(tag[:]))

	// Warm up the connection and the object (the first call opens its file).
	warm := obj.Session("warm")
	if _, err := warm.AppendMessage(ctx, message("w", size)); err != nil {
		return err
	}

	// Serial appends: one call at a time, each waiting for the server's commit.
	s := obj.Session("appends")
	cpu0 := cpuTime()
	start := time.Now()
	for i := range appends {
		if _, err := s.AppendMessage(ctx, message(fmt.Sprintf("a%06d", i), size)); err != nil {
			return err
		}
	}
	elapsed := time.Since(start)
	fmt.Printf("append   %5d x %d B serial:   %7.3f s  %8.0f msg/s  (%.2f ms/append; client CPU %.0f µs/msg)\n",
		appends, size, elapsed.Seconds(), float64(appends)/elapsed.Seconds(), elapsed.Seconds()*1000/float64(appends),
		perMessage(cpuTime()-cpu0, appends))

	// History streaming: fill with batched appends (not timed), then stream the whole path.
	h := obj.Session("history")
	const batch = 500
	for i := 0; i < historyLen; i += batch {
		msgs := make([]any, 0, batch)
		for j := i; j < min(i+batch, historyLen); j++ {
			msgs = append(msgs, message(fmt.Sprintf("h%06d", j), size))
		}
		if _, err := h.AppendMessages(ctx, msgs); err != nil {
			return err
		}
	}
	var times []time.Duration
	cpu0 = cpuTime()
	for range runs {
		start := time.Now()
		n, bytes := 0, 0
		it := h.History(ctx)
		for it.Next() {
			n++
			bytes += len(it.Message().JSON)
		}
		if err := it.Err(); err != nil {
			return err
		}
		times = append(times, time.Since(start))
		if n != historyLen {
			return fmt.Errorf("history returned %d messages, want %d", n, historyLen)
		}
		_ = bytes
	}
	readCPU := cpuTime() - cpu0
	slices.Sort(times)
	best, median := times[0], times[len(times)/2]
	fmt.Printf("history  %5d x %d B streamed: %7.3f s  %8.0f msg/s  (best of %d; median %.3f s = %.0f msg/s; client CPU %.0f µs/msg)\n",
		historyLen, size, best.Seconds(), float64(historyLen)/best.Seconds(), runs, median.Seconds(), float64(historyLen)/median.Seconds(),
		perMessage(readCPU, historyLen*runs))

	// Batched reading of the same path, for comparison.
	start = time.Now()
	n := 0
	for b, err := range h.HistoryBatches(ctx, sessions.WithBatchSize(100)).All() {
		if err != nil {
			return err
		}
		n += len(b)
	}
	elapsed = time.Since(start)
	fmt.Printf("batches  %5d x %d B (100/batch): %7.3f s  %8.0f msg/s\n", n, size, elapsed.Seconds(), float64(n)/elapsed.Seconds())
	return nil
}

// cpuTime returns the CPU time (user + system) this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func perMessage(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(n)
}

// message returns a text message whose JSON is exactly size bytes (or the minimum).
func message(id string, size int) json.RawMessage {
	head := `{"id":"` + id + `","role":"user","parts":[{"type":"text","text":"`
	tail := `"}]}`
	pad := max(0, size-len(head)-len(tail))
	return json.RawMessage(head + strings.Repeat("x", pad) + tail)
}
