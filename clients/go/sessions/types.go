package sessions

import (
	"encoding/json"
	"strings"
	"time"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// Message is one stored message: its JSON text, byte for byte as stored, and the facts the
// server lifts beside it.
type Message struct {
	// JSON is the message as stored (an AI SDK UIMessage-compatible object).
	JSON json.RawMessage
	// Info holds the id, role, parent, seq, created time and token estimate.
	Info MessageInfo
}

// Decode unmarshals the message JSON into v.
func (m Message) Decode(v any) error { return json.Unmarshal(m.JSON, v) }

// MessageInfo holds the facts about a stored message that travel beside its JSON.
type MessageInfo struct {
	ID   string
	Role string
	// ParentID is the parent message id; empty (and HasParent false) for a root.
	ParentID  string
	HasParent bool
	// Seq is the per-session insertion number; the newest message has the highest.
	Seq int64
	// CreatedAtMs is when the row was written (or the imported created time), Unix ms.
	CreatedAtMs   int64
	TokenEstimate int64
	// Overlay is true for a synthetic compaction overlay message (only ID and Role are set).
	Overlay bool
}

// CreatedAt returns CreatedAtMs as a time.
func (i MessageInfo) CreatedAt() time.Time { return time.UnixMilli(i.CreatedAtMs) }

func infoFrom(p *pb.MessageInfo) MessageInfo {
	if p == nil {
		return MessageInfo{}
	}
	return MessageInfo{
		ID:            p.GetId(),
		Role:          p.GetRole(),
		ParentID:      p.GetParentId(),
		HasParent:     p.ParentId != nil,
		Seq:           p.GetSeq(),
		CreatedAtMs:   p.GetCreatedAtMs(),
		TokenEstimate: p.GetTokenEstimate(),
		Overlay:       p.GetOverlay(),
	}
}

// AppendResult is an append's outcome.
type AppendResult struct {
	// Inserted is false when the id already existed; Message is then the stored one.
	Inserted bool
	// Message is the stored message; Message.Info.ParentID is the parent actually used.
	Message Message
}

// UpdateResult is an update's outcome.
type UpdateResult struct {
	// Found is false when no message with that id exists in the session (nothing was written).
	Found bool
	// Changed is true when the stored content changed.
	Changed bool
	// Message is the message as stored (set when Found).
	Message Message
}

// UpsertResult is an upsert's outcome.
type UpsertResult struct {
	// Inserted is true when the message was new and appended.
	Inserted bool
	// Changed is true when an existing message's content changed.
	Changed bool
	// Message is the stored message.
	Message Message
}

// ImportItem is one message to import verbatim.
type ImportItem struct {
	// Message is the message: json.RawMessage, []byte or string JSON text, or a value to marshal.
	Message any
	// ParentID is stored exactly as given (not validated); empty makes a root.
	ParentID string
	// CreatedAt is the created time to store; the zero time means now.
	CreatedAt time.Time
}

// ImportResult counts an import's messages.
type ImportResult struct {
	// Imported is the number of messages written.
	Imported int64
	// Skipped is the number of messages skipped because their id already existed.
	Skipped int64
}

// RecentHistory is the longest recent suffix of a path that fits a byte budget.
type RecentHistory struct {
	// Messages are root first (oldest first).
	Messages []Message
	// Truncated is true when older messages on the path were left out.
	Truncated bool
	// TotalContentBytes is the stored size of the whole path.
	TotalContentBytes int64
}

// RowStat is the stored size and token estimate of one message on a path.
type RowStat struct {
	ID            string
	Role          string
	Bytes         int64
	TokenEstimate int64
}

// Source says who produced a message.
type Source int32

const (
	// SourceServer is trusted input from the application itself (the default).
	SourceServer Source = Source(pb.Source_SOURCE_SERVER)
	// SourceClient is untrusted input: the server removes its reserved metadata keys.
	SourceClient Source = Source(pb.Source_SOURCE_CLIENT)
)

// ParentMode says where an appended message attaches in the tree.
type ParentMode int32

const (
	ParentModeUnspecified ParentMode = ParentMode(pb.ParentMode_PARENT_MODE_UNSPECIFIED)
	// ParentAuto attaches to the session's newest message.
	ParentAuto ParentMode = ParentMode(pb.ParentMode_PARENT_MODE_AUTO)
	// ParentRoot starts a new root.
	ParentRoot ParentMode = ParentMode(pb.ParentMode_PARENT_MODE_ROOT)
	// ParentByID attaches to an explicit parent id.
	ParentByID ParentMode = ParentMode(pb.ParentMode_PARENT_MODE_ID)
)

func (m ParentMode) String() string {
	return strings.TrimPrefix(pb.ParentMode(m).String(), "PARENT_MODE_")
}

// ChangeType is the kind of a change-feed event.
type ChangeType int32

const (
	ChangeAppend          ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_APPEND)
	ChangeUpdate          ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_UPDATE)
	ChangeDelete          ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_DELETE)
	ChangeClear           ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_CLEAR)
	ChangeCompact         ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_COMPACT)
	ChangeCompaction      ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_COMPACTION)
	ChangeImport          ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_IMPORT)
	ChangeCompactionError ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_COMPACTION_ERROR)
	// ChangeReset says events were missed: re-read state, then continue.
	ChangeReset ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_RESET)
	// ChangeProgress says nothing happened; the stream is alive at this revision.
	ChangeProgress ChangeType = ChangeType(pb.ChangeType_CHANGE_TYPE_PROGRESS)
)

func (t ChangeType) String() string {
	return strings.TrimPrefix(pb.ChangeType(t).String(), "CHANGE_TYPE_")
}

// Compaction is a stored compaction record.
type Compaction struct {
	ID            string
	Seq           int64
	Summary       string
	FromMessageID string
	ToMessageID   string
	CreatedAtMs   int64
}

func compactionFrom(p *pb.Compaction) *Compaction {
	if p == nil {
		return nil
	}
	return &Compaction{
		ID:            p.GetId(),
		Seq:           p.GetSeq(),
		Summary:       p.GetSummary(),
		FromMessageID: p.GetFromMessageId(),
		ToMessageID:   p.GetToMessageId(),
		CreatedAtMs:   p.GetCreatedAtMs(),
	}
}

// Event is one change-feed event.
type Event struct {
	// Revision is the object-wide revision; it increases with every event.
	Revision  uint64
	Type      ChangeType
	SessionID string
	// Message is the message of an APPEND, UPDATE or IMPORT event, reassembled; nil otherwise.
	Message *Message
	// Inserted (APPEND) says whether a new row was written.
	Inserted bool
	// ParentMode and ParentID: APPEND, the parent option as the caller passed it; IMPORT, the
	// parent stored.
	ParentMode ParentMode
	ParentID   string
	// MessageIDs (DELETE) are the ids the caller passed.
	MessageIDs []string
	// Compaction (COMPACTION) is the stored record.
	Compaction *Compaction
	// Error (COMPACTION_ERROR, RESET) says what failed or why events were missed.
	Error string
}
