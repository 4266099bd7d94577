package sessions_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
	"github.com/sessions-dev/sessions/clients/go/sessions"
)

// Plan tokens: AddCompaction WithPlanToken stores a summary only if what it is made of is as
// planned, and CompactWith passes its plan's token, planning and summarizing again (three tries
// in all) when the summary is refused.

// editedTurn is the update of the turn id (m00 to m11, as appendTurns wrote it) with new text.
func editedTurn(id, text string) any {
	var n int
	if _, err := fmt.Sscanf(id, "m%d", &n); err != nil {
		panic(err)
	}
	return textMessage(id, []string{"user", "assistant"}[n%2], text)
}

// planTurns appends appendTurns' twelve turns and plans with a one-token tail; the span must
// hold m05 and end before m10, so m05 is inside it and m11 is not beside it.
func planTurns(ctx context.Context, t *testing.T, s *sessions.Session) sessions.CompactionPlan {
	t.Helper()
	appendTurns(ctx, t, s)
	plan, planned, err := s.PlanCompaction(ctx, 1)
	if err != nil || !planned {
		t.Fatalf("PlanCompaction = %v, %v", planned, err)
	}
	if plan.PlanToken == "" {
		t.Fatalf("plan %s..%s has no PlanToken", plan.FromMessageID, plan.ToMessageID)
	}
	if plan.FromMessageID > "m05" || plan.ToMessageID < "m05" || plan.ToMessageID >= "m10" {
		t.Fatalf("plan %s..%s: want a span holding m05 and ending before m10", plan.FromMessageID, plan.ToMessageID)
	}
	return plan
}

func noCompactions(ctx context.Context, t *testing.T, s *sessions.Session) {
	t.Helper()
	if list, err := s.ListCompactions(ctx); err != nil || len(list) != 0 {
		t.Fatalf("ListCompactions = %+v, %v; want none stored", list, err)
	}
}

func TestReasonPlanExpiredIsInTheContract(t *testing.T) {
	for _, reason := range []string{sessions.ReasonSessionChanged, sessions.ReasonPlanExpired} {
		if _, ok := pb.ErrorReason_value["ERROR_REASON_"+reason]; !ok {
			t.Errorf("reason %s is not in the ErrorReason enum", reason)
		}
	}
}

// TestPlanTokenRefusesAnEditedSpan: a message inside the planned span updated after the plan,
// AddCompaction with the plan's token is refused SESSION_CHANGED and stores nothing.
func TestPlanTokenRefusesAnEditedSpan(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	plan := planTurns(ctx, t, s)
	if _, err := s.UpdateMessage(ctx, editedTurn("m05", "edited after the plan")); err != nil {
		t.Fatal(err)
	}
	_, err := s.AddCompaction(ctx, "stale summary", plan.FromMessageID, plan.ToMessageID, sessions.WithPlanToken(plan.PlanToken))
	if sessions.Code(err) != codes.FailedPrecondition || sessions.Reason(err) != sessions.ReasonSessionChanged {
		t.Fatalf("AddCompaction after an edit inside the span: %v; want FAILED_PRECONDITION %s", err, sessions.ReasonSessionChanged)
	}
	noCompactions(ctx, t, s)
}

// TestPlanTokenIsUsedOnce: an update of the newest message (outside the span) keeps the
// summary, which is stored; the same token a second time is refused PLAN_EXPIRED.
func TestPlanTokenIsUsedOnce(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	plan := planTurns(ctx, t, s)
	if _, err := s.UpdateMessage(ctx, editedTurn("m11", "the newest, edited")); err != nil {
		t.Fatal(err)
	}
	record, err := s.AddCompaction(ctx, "the summary", plan.FromMessageID, plan.ToMessageID, sessions.WithPlanToken(plan.PlanToken))
	if err != nil || record.Summary != "the summary" || record.FromMessageID != plan.FromMessageID || record.ToMessageID != plan.ToMessageID {
		t.Fatalf("AddCompaction after an edit outside the span = %+v, %v", record, err)
	}
	_, err = s.AddCompaction(ctx, "again", plan.FromMessageID, plan.ToMessageID, sessions.WithPlanToken(plan.PlanToken))
	if sessions.Code(err) != codes.FailedPrecondition || sessions.Reason(err) != sessions.ReasonPlanExpired {
		t.Fatalf("AddCompaction with a used token: %v; want FAILED_PRECONDITION %s", err, sessions.ReasonPlanExpired)
	}
	if list, err := s.ListCompactions(ctx); err != nil || len(list) != 1 || list[0].ID != record.ID {
		t.Fatalf("ListCompactions = %+v, %v; want only %s", list, err, record.ID)
	}
}

// TestCompactWithPlansAgainAfterAnEdit: the span edited while the first summary was made,
// CompactWith plans and summarizes again and stores the second summary, once.
func TestCompactWithPlansAgainAfterAnEdit(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	planTurns(ctx, t, s)
	calls := 0
	record, err := s.CompactWith(ctx, func(ctx context.Context, _ string) (string, error) {
		calls++
		if calls == 1 {
			if _, err := s.UpdateMessage(ctx, editedTurn("m05", "edited while summarizing")); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("summary %d", calls), nil
	}, 1)
	if err != nil || record == nil || record.Summary != "summary 2" {
		t.Fatalf("CompactWith = %+v, %v; want the second summary stored", record, err)
	}
	if calls != 2 {
		t.Fatalf("summarize called %d times, want 2", calls)
	}
	if list, err := s.ListCompactions(ctx); err != nil || len(list) != 1 || list[0].ID != record.ID || list[0].Summary != "summary 2" {
		t.Fatalf("ListCompactions = %+v, %v; want only %s", list, err, record.ID)
	}
}

// TestCompactWithGivesUpAfterThreeTries: the span edited while every summary was made,
// CompactWith summarizes three times and returns SESSION_CHANGED, storing nothing.
func TestCompactWithGivesUpAfterThreeTries(t *testing.T) {
	ctx := testCtx(t)
	s := newSession(t)
	planTurns(ctx, t, s)
	calls := 0
	record, err := s.CompactWith(ctx, func(ctx context.Context, _ string) (string, error) {
		calls++
		if _, err := s.UpdateMessage(ctx, editedTurn("m05", fmt.Sprintf("edit %d", calls))); err != nil {
			return "", err
		}
		return fmt.Sprintf("summary %d", calls), nil
	}, 1)
	if record != nil || sessions.Code(err) != codes.FailedPrecondition || sessions.Reason(err) != sessions.ReasonSessionChanged {
		t.Fatalf("CompactWith = %+v, %v; want FAILED_PRECONDITION %s", record, err, sessions.ReasonSessionChanged)
	}
	if calls != 3 {
		t.Fatalf("summarize called %d times, want 3", calls)
	}
	noCompactions(ctx, t, s)
}
