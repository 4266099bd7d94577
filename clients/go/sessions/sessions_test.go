package sessions_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

func TestAppendAndReadBack(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)

	first := mustAppend(t, s, textMessage("m1", "user", "hello"))
	if !first.Inserted || first.Message.Info.ID != "m1" || first.Message.Info.Role != "user" {
		t.Fatalf("first append: %+v", first)
	}
	if first.Message.Info.HasParent {
		t.Fatalf("first message of a session should be a root, got parent %q", first.Message.Info.ParentID)
	}
	if !bytes.Equal(first.Message.JSON, textMessage("m1", "user", "hello")) {
		t.Fatalf("stored JSON differs: %s", first.Message.JSON)
	}
	if first.Message.Info.CreatedAtMs == 0 || time.Since(first.Message.Info.CreatedAt()) > time.Hour {
		t.Fatalf("created time looks wrong: %d", first.Message.Info.CreatedAtMs)
	}

	// A Go value is marshalled; HTML characters stay as they are.
	type part struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	second := mustAppend(t, s, map[string]any{"id": "m2", "role": "assistant", "parts": []part{{"text", "a<b & c>d"}}})
	if !second.Inserted || second.Message.Info.ParentID != "m1" || !second.Message.Info.HasParent {
		t.Fatalf("second append should chain to m1: %+v", second.Message.Info)
	}
	if !strings.Contains(string(second.Message.JSON), "a<b & c>d") {
		t.Fatalf("marshalled JSON was HTML-escaped: %s", second.Message.JSON)
	}
	if second.Message.Info.Seq <= first.Message.Info.Seq {
		t.Fatalf("seq did not increase: %d then %d", first.Message.Info.Seq, second.Message.Info.Seq)
	}

	// JSON text as a string is sent byte for byte.
	third := mustAppend(t, s, `{"id":"m3","role":"user","parts":[{"type":"text","text":"x"}],"metadata":{"k":1}}`)
	if string(third.Message.JSON) != `{"id":"m3","role":"user","parts":[{"type":"text","text":"x"}],"metadata":{"k":1}}` {
		t.Fatalf("string JSON not stored byte-exact: %s", third.Message.JSON)
	}

	got, found, err := s.GetMessage(ctx, "m2")
	if err != nil || !found {
		t.Fatalf("GetMessage(m2) = %v, %v", found, err)
	}
	if !bytes.Equal(got.JSON, second.Message.JSON) || got.Info != second.Message.Info {
		t.Fatalf("GetMessage(m2) = %+v, want %+v", got, second.Message)
	}
	var decoded struct {
		Parts []part `json:"parts"`
	}
	if err := got.Decode(&decoded); err != nil || decoded.Parts[0].Text != "a<b & c>d" {
		t.Fatalf("Decode: %v %+v", err, decoded)
	}

	if _, found, err := s.GetMessage(ctx, "nope"); err != nil || found {
		t.Fatalf("GetMessage(missing) = found %v, err %v; want not found, no error", found, err)
	}

	many, err := s.GetMessages(ctx, []string{"m3", "nope", "m1"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"m3", "m1"}; !equalStrings(ids(many), want) {
		t.Fatalf("GetMessages = %v, want %v", ids(many), want)
	}

	leaf, found, err := s.GetLatestLeaf(ctx)
	if err != nil || !found || leaf.Info.ID != "m3" {
		t.Fatalf("GetLatestLeaf = %v %v %v", leaf.Info.ID, found, err)
	}
	if _, found, err := client.Object(objectKey(t)).Session("empty").GetLatestLeaf(ctx); err != nil || found {
		t.Fatalf("GetLatestLeaf(empty session) = found %v, err %v", found, err)
	}

	if got, want := collectHistory(t, s), []string{"m1", "m2", "m3"}; !equalStrings(got, want) {
		t.Fatalf("history = %v, want %v", got, want)
	}
	if got, want := collectHistory(t, s, sessions.NewestFirst()), []string{"m3", "m2", "m1"}; !equalStrings(got, want) {
		t.Fatalf("newest-first history = %v, want %v", got, want)
	}

	// Sessions of one object are separate; objects are separate.
	if got := collectHistory(t, s.Object().Session("other")); len(got) != 0 {
		t.Fatalf("another session sees %v", got)
	}
	if got := collectHistory(t, client.Object(objectKey(t)).Session("s")); len(got) != 0 {
		t.Fatalf("another object sees %v", got)
	}
}

func TestReadsOfAPath(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	var msgs []any
	for i := range 6 {
		msgs = append(msgs, textMessage(string(rune('a'+i)), "user", strings.Repeat("word ", 50*(i+1))))
	}
	if _, err := s.AppendMessages(ctx, msgs); err != nil {
		t.Fatal(err)
	}

	stats, err := s.GetHistoryRowStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 6 || stats[0].ID != "a" || stats[5].ID != "f" {
		t.Fatalf("row stats = %+v", stats)
	}
	var total int64
	for _, st := range stats {
		if st.Bytes <= 0 || st.TokenEstimate <= 0 || st.Role != "user" {
			t.Fatalf("row stat without size or tokens: %+v", st)
		}
		total += st.Bytes
	}
	if leafStats, err := s.GetHistoryRowStats(ctx, sessions.WithLeaf("c")); err != nil || len(leafStats) != 3 {
		t.Fatalf("row stats to c = %+v, %v", leafStats, err)
	}

	all, err := s.GetRecentHistory(ctx, total*2)
	if err != nil {
		t.Fatal(err)
	}
	if all.Truncated || all.TotalContentBytes != total || !equalStrings(ids(all.Messages), []string{"a", "b", "c", "d", "e", "f"}) {
		t.Fatalf("recent history with a large budget = %v truncated=%v total=%d (want total %d)",
			ids(all.Messages), all.Truncated, all.TotalContentBytes, total)
	}
	budget := stats[4].Bytes + stats[5].Bytes
	recent, err := s.GetRecentHistory(ctx, budget)
	if err != nil {
		t.Fatal(err)
	}
	if !recent.Truncated || recent.TotalContentBytes != total || !equalStrings(ids(recent.Messages), []string{"e", "f"}) {
		t.Fatalf("recent history with budget %d = %v truncated=%v total=%d", budget, ids(recent.Messages), recent.Truncated, recent.TotalContentBytes)
	}
	tiny, err := s.GetRecentHistory(ctx, 1)
	if err != nil || !equalStrings(ids(tiny.Messages), []string{"f"}) || !tiny.Truncated {
		t.Fatalf("recent history with a 1-byte budget = %v %v %v (always at least the newest)", ids(tiny.Messages), tiny.Truncated, err)
	}
	toC, err := s.GetRecentHistory(ctx, total*2, sessions.WithLeaf("c"))
	if err != nil || !equalStrings(ids(toC.Messages), []string{"a", "b", "c"}) {
		t.Fatalf("recent history to c = %v %v", ids(toC.Messages), err)
	}

	var batches [][]string
	for batch, err := range s.HistoryBatches(ctx, sessions.WithBatchSize(4)).All() {
		if err != nil {
			t.Fatal(err)
		}
		batches = append(batches, ids(batch))
	}
	if len(batches) != 2 || !equalStrings(batches[0], []string{"a", "b", "c", "d"}) || !equalStrings(batches[1], []string{"e", "f"}) {
		t.Fatalf("batches of 4 = %v", batches)
	}
	// Byte-bounded batches: each message here is larger than 100 bytes, so each is alone.
	batches = nil
	for batch, err := range s.HistoryBatches(ctx, sessions.WithMaxBatchBytes(100), sessions.NewestFirst()).All() {
		if err != nil {
			t.Fatal(err)
		}
		batches = append(batches, ids(batch))
	}
	if len(batches) != 6 || batches[0][0] != "f" || batches[5][0] != "a" {
		t.Fatalf("byte-bounded newest-first batches = %v", batches)
	}

	if got := collectHistory(t, s, sessions.WithLeaf("unknown")); len(got) != 0 {
		t.Fatalf("history of an unknown leaf = %v, want nothing", got)
	}
}

// WithLimit keeps the first messages of the read's order: newest first, the newest. WithLimit(0)
// is refused before any call.
func TestHistoryLimit(t *testing.T) {
	ctx := testCtx(t)
	c, log := dialLogged(t, ctx)
	s := c.Object(objectKey(t)).Session("s")
	var msgs []any
	var all, reversed []string
	for i := range 30 {
		id := fmt.Sprintf("m%d", i)
		msgs = append(msgs, textMessage(id, "user", id))
		all = append(all, id)
		reversed = append([]string{id}, reversed...)
	}
	if _, err := s.AppendMessages(ctx, msgs); err != nil {
		t.Fatal(err)
	}

	streamed := func(opts ...sessions.ReadOption) []string {
		t.Helper()
		var got []string
		for m, err := range s.History(ctx, opts...).All() {
			if err != nil {
				t.Fatalf("History: %v", err)
			}
			got = append(got, m.Info.ID)
		}
		return got
	}
	cases := []struct {
		name string
		opts []sessions.ReadOption
		want []string
	}{
		{"newest first, 3", []sessions.ReadOption{sessions.NewestFirst(), sessions.WithLimit(3)}, []string{"m29", "m28", "m27"}},
		{"root first, 3", []sessions.ReadOption{sessions.WithLimit(3)}, []string{"m0", "m1", "m2"}},
		{"larger than the path", []sessions.ReadOption{sessions.WithLimit(1000)}, all},
		{"newest first, larger than the path", []sessions.ReadOption{sessions.NewestFirst(), sessions.WithLimit(1000)}, reversed},
		{"the largest", []sessions.ReadOption{sessions.WithLimit(math.MaxUint32)}, all},
		{"to a leaf", []sessions.ReadOption{sessions.WithLeaf("m4"), sessions.NewestFirst(), sessions.WithLimit(2)}, []string{"m4", "m3"}},
	}
	batched := func(opts ...sessions.ReadOption) []string {
		t.Helper()
		var got []string
		for batch, err := range s.HistoryBatches(ctx, append(opts, sessions.WithBatchSize(2))...).All() {
			if err != nil {
				t.Fatalf("HistoryBatches: %v", err)
			}
			for _, m := range batch {
				got = append(got, m.Info.ID)
			}
		}
		return got
	}
	for _, tc := range cases {
		if got := collectHistory(t, s, tc.opts...); !equalStrings(got, tc.want) {
			t.Fatalf("GetHistory %s = %v, want %v", tc.name, got, tc.want)
		}
		if got := streamed(tc.opts...); !equalStrings(got, tc.want) {
			t.Fatalf("History %s = %v, want %v", tc.name, got, tc.want)
		}
		if got := batched(tc.opts...); !equalStrings(got, tc.want) {
			t.Fatalf("HistoryBatches %s = %v, want %v", tc.name, got, tc.want)
		}
	}
	var sizes []int
	for batch, err := range s.HistoryBatches(ctx, sessions.WithBatchSize(2), sessions.WithLimit(5)).All() {
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(batch))
	}
	if fmt.Sprint(sizes) != "[2 2 1]" {
		t.Fatalf("HistoryBatches of 5 in twos: batch sizes %v, want [2 2 1]", sizes)
	}

	log.take()
	got, err := s.GetHistory(ctx, sessions.WithLimit(0))
	if sessions.Code(err) != codes.InvalidArgument || sessions.Reason(err) != sessions.ReasonInvalidField ||
		!strings.Contains(err.Error(), "limit must be a positive number of messages") || got != nil {
		t.Fatalf("GetHistory with WithLimit(0) = %v, %v; want an InvalidArgument error", got, err)
	}
	it := s.History(ctx, sessions.NewestFirst(), sessions.WithLimit(0))
	if it.Next() || sessions.Code(it.Err()) != codes.InvalidArgument || it.Frames() != 0 {
		t.Fatalf("History with WithLimit(0): err %v", it.Err())
	}
	_ = it.Close()
	batches := s.HistoryBatches(ctx, sessions.WithLimit(0))
	if batches.Next() || sessions.Code(batches.Err()) != codes.InvalidArgument {
		t.Fatalf("HistoryBatches with WithLimit(0): err %v", batches.Err())
	}
	_ = batches.Close()
	if calls := log.take(); len(calls) != 0 {
		t.Fatalf("WithLimit(0) made calls %v, want none", calls)
	}
}

func TestBranches(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	mustAppend(t, s, textMessage("root", "user", "q"))
	mustAppend(t, s, textMessage("a1", "assistant", "first answer"))
	retry := mustAppend(t, s, textMessage("a2", "assistant", "second answer"), sessions.WithParent("root"))
	if retry.Message.Info.ParentID != "root" {
		t.Fatalf("explicit parent not used: %+v", retry.Message.Info)
	}
	mustAppend(t, s, textMessage("u2", "user", "follow-up on a1"), sessions.WithParent("a1"))

	branches, err := s.GetBranches(ctx, "root")
	if err != nil {
		t.Fatal(err)
	}
	if !equalStrings(ids(branches), []string{"a1", "a2"}) {
		t.Fatalf("branches of root = %v", ids(branches))
	}
	if leaves, err := s.GetBranches(ctx, "u2"); err != nil || len(leaves) != 0 {
		t.Fatalf("branches of a leaf = %v %v", ids(leaves), err)
	}
	// The active leaf is the newest message, u2: its path goes through a1.
	if got := collectHistory(t, s); !equalStrings(got, []string{"root", "a1", "u2"}) {
		t.Fatalf("active branch = %v", got)
	}
	if got := collectHistory(t, s, sessions.WithLeaf("a2")); !equalStrings(got, []string{"root", "a2"}) {
		t.Fatalf("branch to a2 = %v", got)
	}
	if got := collectHistory(t, s, sessions.WithLeaf("a2"), sessions.NewestFirst()); !equalStrings(got, []string{"a2", "root"}) {
		t.Fatalf("newest-first branch to a2 = %v", got)
	}

	// AUTO after an explicit parent attaches to the newest message.
	auto := mustAppend(t, s, textMessage("a3", "assistant", "auto"), sessions.WithAutoParent())
	if auto.Message.Info.ParentID != "u2" {
		t.Fatalf("auto parent = %q, want u2", auto.Message.Info.ParentID)
	}
	// A new root, and an unknown parent (which makes a root, as upstream).
	newRoot := mustAppend(t, s, textMessage("r2", "user", "new topic"), sessions.WithRoot())
	if newRoot.Message.Info.HasParent {
		t.Fatalf("WithRoot made a child of %q", newRoot.Message.Info.ParentID)
	}
	orphan := mustAppend(t, s, textMessage("r3", "user", "dangling"), sessions.WithParent("no-such-message"))
	if orphan.Message.Info.HasParent {
		t.Fatalf("unknown parent should make a root, got parent %q", orphan.Message.Info.ParentID)
	}
	if got := collectHistory(t, s); !equalStrings(got, []string{"r3"}) {
		t.Fatalf("active branch after a new root = %v", got)
	}
	// A parent from another session makes a root too.
	other := s.Object().Session("other")
	if res := mustAppend(t, other, textMessage("x", "user", "x"), sessions.WithParent("root")); res.Message.Info.HasParent {
		t.Fatalf("other-session parent used: %+v", res.Message.Info)
	}
}

func TestDuplicates(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	first := mustAppend(t, s, textMessage("dup", "user", "original"))
	again := mustAppend(t, s, textMessage("dup", "user", "changed text"))
	if again.Inserted {
		t.Fatal("a duplicate id was inserted again")
	}
	if !bytes.Equal(again.Message.JSON, first.Message.JSON) || again.Message.Info.Seq != first.Message.Info.Seq {
		t.Fatalf("duplicate append should return the stored message, got %s", again.Message.JSON)
	}
	results, err := s.AppendMessages(ctx, []any{textMessage("dup", "user", "x"), textMessage("new", "user", "y")})
	if err != nil {
		t.Fatal(err)
	}
	if results[0].Inserted || !results[1].Inserted || results[1].Message.Info.ParentID != "dup" {
		t.Fatalf("batch with a duplicate = %+v", results)
	}
	if got := collectHistory(t, s); !equalStrings(got, []string{"dup", "new"}) {
		t.Fatalf("history = %v", got)
	}
}

func TestAppendMessagesIsOneTransaction(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	mustAppend(t, s, textMessage("base", "user", "base"))
	results, err := s.AppendMessages(ctx, []any{
		textMessage("b1", "user", "1"), textMessage("b2", "assistant", "2"), textMessage("b3", "user", "3"),
	}, sessions.WithRoot())
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 3 || results[0].Message.Info.HasParent || results[1].Message.Info.ParentID != "b1" || results[2].Message.Info.ParentID != "b2" {
		t.Fatalf("batch results = %+v", results)
	}
	_, err = s.AppendMessages(ctx, []any{textMessage("c1", "user", "ok"), json.RawMessage(`{"id":"c2"`)})
	if sessions.Code(err) != codes.InvalidArgument || sessions.Reason(err) != sessions.ReasonInvalidJSON {
		t.Fatalf("batch with bad JSON: %v", err)
	}
	if _, found, _ := s.GetMessage(ctx, "c1"); found {
		t.Fatal("a failed batch stored its first message")
	}
	if empty, err := s.AppendMessages(ctx, nil); err != nil || len(empty) != 0 {
		t.Fatalf("empty batch = %v, %v", empty, err)
	}
}

func TestUpdateAndUpsert(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	mustAppend(t, s, textMessage("m", "user", "v1"))
	mustAppend(t, s, textMessage("n", "assistant", "reply"))

	upd, err := s.UpdateMessage(ctx, textMessage("m", "user", "v2"))
	if err != nil {
		t.Fatal(err)
	}
	if !upd.Found || !upd.Changed || !bytes.Equal(upd.Message.JSON, textMessage("m", "user", "v2")) {
		t.Fatalf("update = %+v", upd)
	}
	same, err := s.UpdateMessage(ctx, textMessage("m", "user", "v2"))
	if err != nil || !same.Found || same.Changed {
		t.Fatalf("unchanged update = %+v, %v", same, err)
	}
	missing, err := s.UpdateMessage(ctx, textMessage("ghost", "user", "x"))
	if err != nil || missing.Found {
		t.Fatalf("update of a missing id = %+v, %v", missing, err)
	}
	stored, _, _ := s.GetMessage(ctx, "m")
	if !bytes.Equal(stored.JSON, textMessage("m", "user", "v2")) || stored.Info.HasParent {
		t.Fatalf("after update: %s %+v", stored.JSON, stored.Info)
	}
	if got := collectHistory(t, s); !equalStrings(got, []string{"m", "n"}) {
		t.Fatalf("update moved the message: %v", got)
	}

	ins, err := s.UpsertMessage(ctx, textMessage("u", "user", "new"), sessions.WithParent("m"))
	if err != nil || !ins.Inserted || ins.Message.Info.ParentID != "m" {
		t.Fatalf("upsert of a new id = %+v, %v", ins, err)
	}
	chg, err := s.UpsertMessage(ctx, textMessage("u", "user", "newer"), sessions.WithRoot())
	if err != nil || chg.Inserted || !chg.Changed || chg.Message.Info.ParentID != "m" {
		t.Fatalf("upsert of an existing id = %+v, %v (must not re-parent)", chg, err)
	}
	unchanged, err := s.UpsertMessage(ctx, textMessage("u", "user", "newer"))
	if err != nil || unchanged.Inserted || unchanged.Changed {
		t.Fatalf("unchanged upsert = %+v, %v", unchanged, err)
	}
}

func TestDeleteAndClear(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		mustAppend(t, s, textMessage(id, "user", id))
	}
	n, err := s.DeleteMessages(ctx, "b", "nope")
	if err != nil || n != 1 {
		t.Fatalf("delete = %d, %v", n, err)
	}
	c, _, _ := s.GetMessage(ctx, "c")
	if c.Info.ParentID != "a" {
		t.Fatalf("child of a deleted message has parent %q, want a", c.Info.ParentID)
	}
	if got := collectHistory(t, s); !equalStrings(got, []string{"a", "c", "d"}) {
		t.Fatalf("history after delete = %v", got)
	}
	if n, err := s.DeleteMessages(ctx); err != nil || n != 0 {
		t.Fatalf("delete of nothing = %d, %v", n, err)
	}
	other := s.Object().Session("keep")
	mustAppend(t, other, textMessage("k", "user", "k"))

	n, err = s.ClearMessages(ctx)
	if err != nil || n != 3 {
		t.Fatalf("clear = %d, %v", n, err)
	}
	if got := collectHistory(t, s); len(got) != 0 {
		t.Fatalf("history after clear = %v", got)
	}
	if got := collectHistory(t, other); !equalStrings(got, []string{"k"}) {
		t.Fatalf("clear touched another session: %v", got)
	}
	// A cleared session takes appends again, ids included.
	if res := mustAppend(t, s, textMessage("a", "user", "again")); !res.Inserted || res.Message.Info.HasParent {
		t.Fatalf("append after clear = %+v", res)
	}
}

func TestImportMessages(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	t0 := time.UnixMilli(1_700_000_000_000)
	items := []sessions.ImportItem{
		{Message: textMessage("i1", "user", "old question"), CreatedAt: t0},
		{Message: textMessage("i2", "assistant", "old answer"), ParentID: "i1", CreatedAt: t0.Add(time.Second)},
		{Message: textMessage("i3", "user", "points elsewhere"), ParentID: "not-here", CreatedAt: t0.Add(2 * time.Second)},
	}
	res, err := s.ImportMessages(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if res.Imported != 3 || res.Skipped != 0 {
		t.Fatalf("import = %+v", res)
	}
	i2, _, _ := s.GetMessage(ctx, "i2")
	if i2.Info.ParentID != "i1" || i2.Info.CreatedAtMs != t0.Add(time.Second).UnixMilli() {
		t.Fatalf("imported info = %+v", i2.Info)
	}
	i3, _, _ := s.GetMessage(ctx, "i3")
	if i3.Info.ParentID != "not-here" {
		t.Fatalf("import did not store the parent verbatim: %+v", i3.Info)
	}
	again, err := s.ImportMessages(ctx, items[:2])
	if err != nil || again.Imported != 0 || again.Skipped != 2 {
		t.Fatalf("re-import = %+v, %v", again, err)
	}
	if empty, err := s.ImportMessages(ctx, nil); err != nil || empty.Imported != 0 {
		t.Fatalf("empty import = %+v, %v", empty, err)
	}

	// ImportChain parents each message to the one before; a large message goes in pieces.
	big := bigMessage("chain-big", 5*1024*1024)
	chain := sessions.ImportChain(textMessage("c1", "user", "q"), big, textMessage("c3", "user", "after"))
	other := s.Object().Session("chain")
	if res, err := other.ImportMessages(ctx, chain); err != nil || res.Imported != 3 {
		t.Fatalf("chain import = %+v, %v", res, err)
	}
	history, err := other.GetHistory(ctx, sessions.WithLeaf("c3"))
	if err != nil || !equalStrings(ids(history), []string{"c1", "chain-big", "c3"}) {
		t.Fatalf("chain history = %v, %v", ids(history), err)
	}
	if !bytes.Equal(history[1].JSON, big) {
		t.Fatalf("imported large message differs (%d bytes vs %d)", len(history[1].JSON), len(big))
	}

	// A message that is not JSON fails the call with the server's reason.
	_, err = s.Object().Session("bad").ImportMessages(ctx, []sessions.ImportItem{{Message: `{"id":`}})
	if sessions.Code(err) != codes.InvalidArgument || sessions.Reason(err) != sessions.ReasonInvalidJSON {
		t.Fatalf("import of bad JSON: %v", err)
	}
}

// A slice goes packed (many whole messages a frame), a sequence a message a frame; both import
// the same chain, a 400 KB message among 2,500 going in pieces in the packed one.
func TestImportPackedAndStreamed(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	msgs := make([]any, 2500)
	want := make([]string, len(msgs))
	for i := range msgs {
		want[i] = fmt.Sprintf("p%04d", i)
		msgs[i] = textMessage(want[i], "user", strings.Repeat("t", 1000))
	}
	msgs[1200] = textMessage(want[1200], "user", strings.Repeat("x", 400_000))
	chain := sessions.ImportChain(msgs...)
	if res, err := s.ImportMessages(ctx, chain); err != nil || res.Imported != 2500 {
		t.Fatalf("packed import = %+v, %v", res, err)
	}
	streamed := s.Object().Session("streamed")
	if res, err := streamed.ImportMessagesSeq(ctx, slices.Values(chain)); err != nil || res.Imported != 2500 {
		t.Fatalf("streamed import = %+v, %v", res, err)
	}
	for _, session := range []*sessions.Session{s, streamed} {
		history, err := session.GetHistory(ctx)
		if err != nil || !equalStrings(ids(history), want) {
			t.Fatalf("history of %q: %d messages, %v", session.ID(), len(history), err)
		}
	}
}

func TestBadInput(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	cases := []struct {
		name   string
		msg    any
		reason string
	}{
		{"not JSON", `{"id":"x","role":`, sessions.ReasonInvalidJSON},
		{"trailing garbage", `{"id":"x","role":"user","parts":[]} x`, sessions.ReasonInvalidJSON},
		{"not an object", `[1,2,3]`, sessions.ReasonInvalidMessage},
		{"no parts", `{"id":"x","role":"user"}`, sessions.ReasonInvalidMessage},
		{"id not a string", `{"id":7,"role":"user","parts":[]}`, sessions.ReasonInvalidMessage},
		{"part without type", `{"id":"x","role":"user","parts":[{"text":"t"}]}`, sessions.ReasonInvalidMessage},
		{"invalid UTF-8 (client-side)", string([]byte{'"', 0xff, '"'}), sessions.ReasonInvalidJSON},
		{"unencodable value (client-side)", map[string]any{"id": make(chan int)}, sessions.ReasonInvalidJSON},
		{"nil", nil, sessions.ReasonInvalidJSON},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.AppendMessage(ctx, tc.msg)
			var e *sessions.Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v (%T), want *sessions.Error", err, err)
			}
			if e.Code != codes.InvalidArgument || e.Reason != tc.reason {
				t.Fatalf("err = %v, want InvalidArgument/%s", err, tc.reason)
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("status.Code(err) = %v", status.Code(err))
			}
		})
	}
	// The server's errors carry ErrorInfo metadata (which field, why).
	_, err := s.AppendMessage(ctx, `{"id":"x","role":"user"}`)
	var e *sessions.Error
	if !errors.As(err, &e) || e.Domain != "sessions.v1" || e.Metadata["field"] == "" {
		t.Fatalf("error details = %+v", e)
	}
	// Update and upsert validate too.
	if _, err := s.UpdateMessage(ctx, `{"nope"`); sessions.Reason(err) != sessions.ReasonInvalidJSON {
		t.Fatalf("update of bad JSON: %v", err)
	}
	if _, err := s.UpsertMessage(ctx, `{"id":"x"}`); sessions.Reason(err) != sessions.ReasonInvalidMessage {
		t.Fatalf("upsert of a non-message: %v", err)
	}
	// Bad object keys.
	if _, err := client.Object("").Session("").AppendMessage(ctx, textMessage("a", "user", "a")); sessions.Code(err) != codes.InvalidArgument || sessions.Reason(err) != sessions.ReasonInvalidObjectKey {
		t.Fatalf("empty object key: %v", err)
	}
	if _, err := client.Object(strings.Repeat("k", 5000)).Session("").AppendMessage(ctx, textMessage("a", "user", "a")); sessions.Reason(err) != sessions.ReasonInvalidObjectKey {
		t.Fatalf("long object key: %v", err)
	}
	if _, err := client.Object("bad\x00key").Session("").AppendMessage(ctx, textMessage("a", "user", "a")); sessions.Reason(err) != sessions.ReasonInvalidObjectKey {
		t.Fatalf("object key with a control character: %v", err)
	}
	if got := collectHistory(t, s); len(got) != 0 {
		t.Fatalf("bad input stored messages: %v", got)
	}
}

func TestRoutingMetadata(t *testing.T) {
	ctx := testCtx(t)
	// Reserved characters, percent signs, plus signs and non-ASCII survive the header.
	key := objectKey(t) + "/tenant ä?x=1&y#z%41+😀"
	s := client.Object(key).Session("")
	if res := mustAppend(t, s, textMessage("a", "user", "routed")); !res.Inserted {
		t.Fatal("not inserted")
	}
	if got := collectHistory(t, s); !equalStrings(got, []string{"a"}) {
		t.Fatalf("history = %v", got)
	}
	// The server checks that the header names the request's object.
	raw := client.Stub()
	_, err := raw.AppendMessage(metadata.AppendToOutgoingContext(ctx, sessions.ObjectKeyHeader, "some-other-key"), &pb.AppendMessageRequest{
		ObjectKey: key, MessageJson: string(textMessage("b", "user", "b")),
	})
	if sessions.Reason(err) != sessions.ReasonObjectKeyMismatch {
		t.Fatalf("mismatched routing header: %v", err)
	}
	// CallContext adds the same header the handles send.
	if _, err := raw.AppendMessage(client.CallContext(ctx, key), &pb.AppendMessageRequest{ObjectKey: key, MessageJson: string(textMessage("c", "user", "c"))}); err != nil {
		t.Fatalf("raw append with routing header: %v", err)
	}
}

func TestEscapeObjectKeyMatchesPythonQuote(t *testing.T) {
	// Expected values from Python's urllib.parse.quote(key, safe="").
	cases := map[string]string{
		"plain-Key_1.2~":                   "plain-Key_1.2~",
		"tenant/ä b?x=1&y#z%41+":           "tenant%2F%C3%A4%20b%3Fx%3D1%26y%23z%2541%2B",
		"😀中文":                              "%F0%9F%98%80%E4%B8%AD%E6%96%87",
		"a:b@c=d;e,f$g!h*i'j(k)l":          "a%3Ab%40c%3Dd%3Be%2Cf%24g%21h%2Ai%27j%28k%29l",
		"":                                 "",
		"tab\tnewline\nnul\x00del\x7f end": "tab%09newline%0Anul%00del%7F%20end",
	}
	for key, want := range cases {
		if got := sessions.EscapeObjectKey(key); got != want {
			t.Errorf("EscapeObjectKey(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestSourceClientStripsReservedMetadata(t *testing.T) {
	s := newSession(t)
	msg := `{"id":"c","role":"user","parts":[{"type":"text","text":"hi"}],"metadata":{"` + reservedKey + `":"forged","keep":1}}`
	res := mustAppend(t, s, msg, sessions.WithSource(sessions.SourceClient))
	if strings.Contains(string(res.Message.JSON), reservedKey) || !strings.Contains(string(res.Message.JSON), `"keep":1`) {
		t.Fatalf("source=client message stored as %s", res.Message.JSON)
	}
	trusted := mustAppend(t, s, strings.Replace(msg, `"id":"c"`, `"id":"s"`, 1), sessions.WithSource(sessions.SourceServer))
	if !strings.Contains(string(trusted.Message.JSON), reservedKey) {
		t.Fatalf("source=server message lost its metadata: %s", trusted.Message.JSON)
	}
}

func TestCanceledContext(t *testing.T) {
	s := newSession(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.AppendMessage(ctx, textMessage("a", "user", "a"))
	var e *sessions.Error
	if !errors.As(err, &e) || e.Code != codes.Canceled {
		t.Fatalf("canceled append: %v", err)
	}
	it := s.History(ctx)
	if it.Next() || sessions.Code(it.Err()) != codes.Canceled {
		t.Fatalf("canceled history: %v", it.Err())
	}
	short, cancel2 := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel2()
	<-short.Done()
	if _, _, err := s.GetMessage(short, "a"); sessions.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("expired deadline: %v", err)
	}
}

func TestCallTimeoutOption(t *testing.T) {
	ctx := testCtx(t)
	c, err := sessions.Dial(ctx, server.Addr, sessions.WithCallTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := c.Object(objectKey(t)).Session("")
	if _, err := s.AppendMessage(ctx, textMessage("a", "user", "a")); err != nil {
		t.Fatal(err)
	}
	if got := collectHistory(t, s); !equalStrings(got, []string{"a"}) {
		t.Fatalf("history = %v", got)
	}
}

// TestGetHistoryCallTimeout: GetHistory is a collected read, so WithCallTimeout bounds it, as it
// bounds GetRecentHistory; the streaming History is bounded only by its context. A timeout of
// 1 ns has passed before any call can complete.
func TestGetHistoryCallTimeout(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	mustAppend(t, s, textMessage("a", "user", "a"))
	c, err := sessions.Dial(ctx, server.Addr, sessions.WithCallTimeout(time.Nanosecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bounded := c.Object(s.Object().Key()).Session(s.ID())

	if _, err := bounded.GetRecentHistory(ctx, 1<<20); sessions.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("GetRecentHistory with a 1 ns call timeout: %v, want DEADLINE_EXCEEDED", err)
	}
	if msgs, err := bounded.GetHistory(ctx); sessions.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("GetHistory with a 1 ns call timeout = %v, %v; want DEADLINE_EXCEEDED", ids(msgs), err)
	}
	var streamed []string
	for m, err := range bounded.History(ctx).All() {
		if err != nil {
			t.Fatalf("History (not bounded by the call timeout): %v", err)
		}
		streamed = append(streamed, m.Info.ID)
	}
	if !equalStrings(streamed, []string{"a"}) {
		t.Fatalf("History = %v", streamed)
	}
}

// TestGetMessagesRepeatedAndMissingIDs pins what GetMessages documents: the messages found, each
// once, in the order their ids first appear in the request (not the stored order); missing ids
// are left out.
func TestGetMessagesRepeatedAndMissingIDs(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	mustAppend(t, s, textMessage("a", "user", "a"))
	mustAppend(t, s, textMessage("b", "assistant", "b"))
	mustAppend(t, s, textMessage("c", "user", "c"))
	msgs, err := s.GetMessages(ctx, []string{"c", "a", "c", "nope", "a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(msgs); !equalStrings(got, []string{"c", "a", "b"}) {
		t.Fatalf("GetMessages = %v, want [c a b]", got)
	}
	if !bytes.Equal(msgs[0].JSON, textMessage("c", "user", "c")) {
		t.Fatalf("GetMessages[0] = %s", msgs[0].JSON)
	}
}

// TestAKeyLongerThanTheServerTakesIsInvalidWhateverItsHeader: servers make room for the header of
// any key up to the largest --max-object-key-bytes and judge it (a 4,200-character CJK key went
// as a 37,800-byte header past the room of the server's own limit, and grpc-go refused it
// INTERNAL); a key past that largest limit is refused before it is sent, in the same words as
// the Python and TypeScript clients'. Neither is tried again.
func TestAKeyLongerThanTheServerTakesIsInvalidWhateverItsHeader(t *testing.T) {
	ctx := testCtx(t)
	var log retryLog
	c := dialRetrying(t, server.Addr, &log)
	for _, k := range []struct{ key, words string }{
		{strings.Repeat("中", 4_200), "object_key is 12600 bytes; the limit is 1024 bytes"},
		{strings.Repeat("😀", 16_384), "object_key is 65536 bytes; the limit is 1024 bytes"},
		{strings.Repeat("k", 300_000), "object_key is 300000 bytes; no server takes more than 65536 bytes"},
	} {
		s := c.Object(k.key).Session("")
		_, err := s.AppendMessage(ctx, textMessage("a", "user", "hi"))
		if sessions.Code(err) != codes.InvalidArgument || sessions.Reason(err) != sessions.ReasonInvalidObjectKey ||
			!strings.Contains(err.Error(), k.words) {
			t.Fatalf("AppendMessage with a key of %d bytes: %v, want INVALID_OBJECT_KEY saying %q", len(k.key), err, k.words)
		}
		it := s.History(ctx)
		if it.Next() || sessions.Reason(it.Err()) != sessions.ReasonInvalidObjectKey {
			t.Fatalf("History with a key of %d bytes: %v, want INVALID_OBJECT_KEY", len(k.key), it.Err())
		}
	}
	if notices := log.seen(); len(notices) != 0 {
		t.Fatalf("tried again %d times: %v", len(notices), notices[0].Err)
	}
	// So on a connection of the caller's (WithConn), which the client did not dial.
	viaConn, err := sessions.Dial(ctx, server.Addr, sessions.WithConn(c.Conn()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = viaConn.Object(strings.Repeat("k", 300_000)).Session("").GetHistoryRowStats(ctx)
	if sessions.Reason(err) != sessions.ReasonInvalidObjectKey || !strings.Contains(err.Error(), "no server takes more") {
		t.Fatalf("a key of 300,000 bytes through WithConn: %v, want INVALID_OBJECT_KEY", err)
	}
}
