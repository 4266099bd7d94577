package sessions_test

import (
	"fmt"
	"testing"
	"time"
	"context"
)

func TestProbe(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	// a) batch response > 4 MiB
	_, err := s.AppendMessages(ctx, []any{bigMessage("b1", 2500*1024), bigMessage("b2", 2500*1024)})
	fmt.Println("a) AppendMessages 2x2.5MiB:", err)
	h, _ := s.GetHistory(ctx)
	fmt.Println("   stored after:", ids(h))
	// b) subscribe
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	sub := s.Subscribe(sctx)
	go func() { time.Sleep(500 * time.Millisecond); mustAppend(t, s, textMessage("ev", "user", "x")) }()
	ok := sub.Next()
	fmt.Println("b) Subscribe:", ok, sub.Event(), sub.Err())
	// c) GetMessages with duplicate ids
	ms, err := s.GetMessages(ctx, []string{"ev", "ev"})
	fmt.Println("c) GetMessages dup:", ids(ms), err)
	// d) delete duplicate ids
	n, err := s.DeleteMessages(ctx, "ev", "ev")
	fmt.Println("d) delete dup:", n, err)
	// e) empty id message
	_, err = s.AppendMessage(ctx, `{"id":"","role":"user","parts":[]}`)
	fmt.Println("e) empty id:", err)
	// f) Update exactly at 3 MiB boundary, unary
	m := bigMessage("edge", 3*1024*1024)
	m = m[:0:0]
	_ = m
}
