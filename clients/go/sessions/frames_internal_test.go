package sessions

import (
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

func TestPiecesCutOnUTF8Boundaries(t *testing.T) {
	// 4-byte characters offset by one ASCII byte: PieceBytes never falls on a boundary.
	text := "x" + strings.Repeat("😀", (3*PieceBytes)/4)
	parts := pieces(text)
	if len(parts) < 3 {
		t.Fatalf("got %d pieces", len(parts))
	}
	if strings.Join(parts, "") != text {
		t.Fatal("pieces do not join back to the text")
	}
	for i, p := range parts {
		if len(p) > PieceBytes || len(p) == 0 || !utf8.ValidString(p) {
			t.Fatalf("piece %d: %d bytes, valid %v", i, len(p), utf8.ValidString(p))
		}
	}
	if got := pieces(""); len(got) != 1 || got[0] != "" {
		t.Fatalf("pieces of empty text = %q", got)
	}
	if got := pieces("small"); len(got) != 1 {
		t.Fatalf("pieces of small text = %q", got)
	}
}

func TestAssembler(t *testing.T) {
	var a assembler
	parent := "p"
	info := &pb.MessageInfo{Id: "m", Role: "user", ParentId: &parent, Seq: 3}
	if _, ok := a.feed(&pb.MessageFrame{Info: info, Json: `{"id":"m",`, MorePieces: true}); ok {
		t.Fatal("first piece completed a message")
	}
	if _, ok := a.feed(&pb.MessageFrame{Json: `"role":"user",`, MorePieces: true}); ok {
		t.Fatal("middle piece completed a message")
	}
	msg, ok := a.feed(&pb.MessageFrame{Json: `"parts":[]}`})
	if !ok || string(msg.JSON) != `{"id":"m","role":"user","parts":[]}` {
		t.Fatalf("assembled %q %v", msg.JSON, ok)
	}
	if msg.Info.ID != "m" || msg.Info.ParentID != "p" || !msg.Info.HasParent || msg.Info.Seq != 3 {
		t.Fatalf("info = %+v", msg.Info)
	}
	if err := a.finish(); err != nil {
		t.Fatal(err)
	}
	single, ok := a.feed(&pb.MessageFrame{Info: &pb.MessageInfo{Id: "s"}, Json: `{}`})
	if !ok || single.Info.ID != "s" || single.Info.HasParent {
		t.Fatalf("single frame = %+v", single)
	}
	a.feed(&pb.MessageFrame{Info: info, Json: `{`, MorePieces: true})
	if err := a.finish(); Code(err) != codes.DataLoss || Reason(err) != ReasonInvalidStream {
		t.Fatalf("unfinished message: %v", err)
	}
}

func TestReasonConstantsAreTheContractsReasons(t *testing.T) {
	named := map[string]bool{}
	for _, reason := range []string{
		ReasonInvalidJSON, ReasonInvalidMessage, ReasonInvalidObjectKey, ReasonInvalidField,
		ReasonObjectKeyMismatch, ReasonInvalidStream, ReasonDraining, ReasonStorageFailure,
		ReasonLimitExceeded, ReasonStorageFull, ReasonNotFound, ReasonNoSummarizer,
		ReasonUnauthenticated, ReasonPermissionDenied, ReasonInternal, ReasonFailedPrecondition,
		ReasonObjectNotOwned, ReasonObjectMoving, ReasonSummarizerFailed, ReasonServerBusy,
		ReasonObjectExists, ReasonSessionChanged, ReasonPlanExpired, ReasonObjectDamaged,
		ReasonObjectDeparting,
	} {
		named[reason] = true
		if _, ok := pb.ErrorReason_value["ERROR_REASON_"+reason]; !ok {
			t.Errorf("reason %s is not in the ErrorReason enum", reason)
		}
	}
	for value, name := range pb.ErrorReason_name {
		reason := strings.TrimPrefix(name, "ERROR_REASON_")
		if value != 0 && !named[reason] {
			t.Errorf("the contract's reason %s has no Reason constant", reason)
		}
	}
}
