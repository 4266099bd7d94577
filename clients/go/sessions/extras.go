package sessions

import (
	"context"
	"io"
	"strings"

	"google.golang.org/grpc/codes"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// ── admin and attachments (object level) ────────────────────────────────────

// SessionSummary is one session of an object.
type SessionSummary struct {
	ID           string
	MessageCount int64
}

// ObjectStats reports an object's storage.
type ObjectStats struct {
	FileBytes        int64
	MessageRows      int64
	ContinuationRows int64
	AttachmentCount  int64
	AttachmentBytes  int64
	// RowWrites counts rows written since the object was created, as upstream bills them.
	RowWrites    int64
	SessionCount int64
	// FreeBytes counts the file's free pages (within FileBytes): freed by deletes, reused by writes.
	FreeBytes int64
}

// Attachment is one stored attachment payload.
type Attachment struct {
	Hash      string
	MediaType string
	Data      []byte
}

// ListSessions lists the sessions that hold messages or compactions, with their message counts,
// by session id. The server answers a page at a time (up to 1,000 sessions); ListSessions follows
// next_page_token until the last page and returns every session. WithCallTimeout bounds the whole
// listing, every page included.
func (o *Object) ListSessions(ctx context.Context) ([]SessionSummary, error) {
	cctx, cancel := o.unaryCtx(ctx)
	defer cancel()
	var out []SessionSummary
	token := ""
	for {
		resp, err := o.client.stub.ListSessions(cctx, &pb.ListSessionsRequest{ObjectKey: o.key, PageToken: token})
		if err != nil {
			return nil, toError(err)
		}
		for _, s := range resp.GetSessions() {
			out = append(out, SessionSummary{ID: s.GetSessionId(), MessageCount: s.GetMessageCount()})
		}
		if token = resp.GetNextPageToken(); token == "" {
			if out == nil {
				out = []SessionSummary{}
			}
			return out, nil
		}
	}
}

// VacuumReport is what Vacuum did: the object's file and WAL in bytes before and after.
type VacuumReport struct {
	FileBytesBefore int64
	FileBytesAfter  int64
}

// Vacuum gives the disk back the room deletes freed in the object's file (FreeBytes): the
// server rewrites it with the pages in use; its writes wait meanwhile. Tried again only when
// the server refused it before acting, as the other admin calls.
func (o *Object) Vacuum(ctx context.Context) (VacuumReport, error) {
	cctx, cancel := o.unaryCtx(ctx)
	defer cancel()
	r, err := o.client.stub.VacuumObject(cctx, &pb.VacuumObjectRequest{ObjectKey: o.key})
	if err != nil {
		return VacuumReport{}, toError(err)
	}
	return VacuumReport{FileBytesBefore: r.GetFileBytesBefore(), FileBytesAfter: r.GetFileBytesAfter()}, nil
}

// GetObjectStats reports the object's storage: bytes, free bytes, rows, attachments and row writes.
func (o *Object) GetObjectStats(ctx context.Context) (ObjectStats, error) {
	cctx, cancel := o.unaryCtx(ctx)
	defer cancel()
	r, err := o.client.stub.GetObjectStats(cctx, &pb.GetObjectStatsRequest{ObjectKey: o.key})
	if err != nil {
		return ObjectStats{}, toError(err)
	}
	return ObjectStats{
		FileBytes:        r.GetFileBytes(),
		MessageRows:      r.GetMessageRows(),
		ContinuationRows: r.GetContinuationRows(),
		AttachmentCount:  r.GetAttachmentCount(),
		AttachmentBytes:  r.GetAttachmentBytes(),
		RowWrites:        r.GetRowWrites(),
		SessionCount:     r.GetSessionCount(),
		FreeBytes:        r.GetFreeBytes(),
	}, nil
}

// ReadAttachment reads one attachment payload by its hash (the hex after
// `attachment:sha256:` in a message read WithAttachmentPointers).
func (o *Object) ReadAttachment(ctx context.Context, hash string) (Attachment, error) {
	cctx, cancel := o.unaryCtx(ctx)
	defer cancel()
	stream, err := o.client.stub.ReadAttachment(cctx, &pb.ReadAttachmentRequest{ObjectKey: o.key, Hash: hash})
	if err != nil {
		return Attachment{}, toError(err)
	}
	out := Attachment{Hash: hash}
	first := true
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return Attachment{}, toError(err)
		}
		if first {
			out.MediaType = resp.GetMediaType()
			if size := resp.GetSizeBytes(); size > 0 && size <= 1<<31 {
				out.Data = make([]byte, 0, size)
			}
			first = false
		}
		out.Data = append(out.Data, resp.GetData()...)
	}
}

// ── search ──────────────────────────────────────────────────────────────────

// SearchOptions configures Search.
type SearchOptions struct {
	// Limit is the largest number of results; nil means the server's default (20), 0 returns
	// none, as upstream.
	Limit *int32
	// AllWords matches every word of the query in any order, instead of the whole query as one
	// phrase (upstream's semantics).
	AllWords bool
	// AllSessions searches every session of the object.
	AllSessions bool
}

// SearchResult is one full-text search hit.
type SearchResult struct {
	ID        string
	Role      string
	SessionID string
	// Content is the indexed text of the message.
	Content string
}

// Search runs a full-text search over message text, best match first.
func (s *Session) Search(ctx context.Context, query string, opts SearchOptions) ([]SearchResult, error) {
	mode := pb.SearchMode_SEARCH_MODE_PHRASE
	if opts.AllWords {
		mode = pb.SearchMode_SEARCH_MODE_ALL_WORDS
	}
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	stream, err := s.client.stub.SearchMessages(cctx, &pb.SearchMessagesRequest{
		ObjectKey:   s.object.key,
		SessionId:   s.id,
		Query:       query,
		Limit:       opts.Limit,
		Mode:        mode,
		AllSessions: opts.AllSessions,
		// Every response costs the server a write: take the hits packed.
		MaxHitsPerResponse: searchHitsPerResponse,
	})
	if err != nil {
		return nil, toError(err)
	}
	var out []SearchResult
	var content strings.Builder
	var hit *SearchResult
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			if hit != nil {
				return nil, clientError(codes.DataLoss, ReasonInvalidStream, streamEndedInsideMessage)
			}
			return out, nil
		}
		if err != nil {
			return nil, toError(err)
		}
		pieces := []searchPiece{resp}
		if len(resp.GetHits()) > 0 {
			pieces = pieces[:0]
			for _, packed := range resp.GetHits() {
				pieces = append(pieces, packed)
			}
		}
		for _, piece := range pieces {
			if hit == nil {
				hit = &SearchResult{ID: piece.GetId(), Role: piece.GetRole(), SessionID: piece.GetSessionId()}
				content.Reset()
			}
			content.WriteString(piece.GetContent())
			if !piece.GetMorePieces() {
				hit.Content = content.String()
				out = append(out, *hit)
				hit = nil
			}
		}
	}
}

// searchHitsPerResponse is the packing the client asks for; the server also ends a response at
// about 1 MiB of text.
const searchHitsPerResponse = 1000

// searchPiece is a hit, or a piece of one: a whole response, or one of its packed hits.
type searchPiece interface {
	GetId() string
	GetRole() string
	GetSessionId() string
	GetContent() string
	GetMorePieces() bool
}

// ── compaction ──────────────────────────────────────────────────────────────

// CompactionPlan is the range and prompt for a client-side summarizer.
type CompactionPlan struct {
	FromMessageID string
	ToMessageID   string
	Prompt        string
	// BudgetTokens is the summary length target given in the prompt.
	BudgetTokens int64
	// PlanToken names this plan to the server: pass it to AddCompaction (WithPlanToken) to have
	// the summary refused (ReasonSessionChanged) if what it is made of changed since the plan.
	// Used once, by the server that planned, within 15 minutes (else ReasonPlanExpired).
	PlanToken string
}

// CompactionPolicy is a session's automatic compaction policy.
type CompactionPolicy struct {
	// ThresholdTokens: compact after an inserted append when the session's token estimate
	// exceeds it; 0 disables automatic compaction.
	ThresholdTokens int64
	// KeepRecentTokens is the token budget of the recent tail kept verbatim (0: 20,000).
	KeepRecentTokens int64
}

// CompactionOption configures AddCompaction.
type CompactionOption func(*compactionOptions)

type compactionOptions struct {
	fromCompact bool
	planToken   string
}

// FromCompact marks the summary given to AddCompaction as the result of a compaction the caller
// ran (plan, summarize, store), as Python's add_compaction(..., from_compact=True): subscribers
// then see a ChangeCompact event with no payload, as upstream's compact() emits, instead of
// ChangeCompaction. CompactWith sets it.
func FromCompact() CompactionOption {
	return func(o *compactionOptions) { o.fromCompact = true }
}

// WithPlanToken gives AddCompaction the PlanToken of the plan the summary was made from: the
// record is then stored only if no message the summary is made of was updated or deleted since
// the plan, nor the session cleared or given another record, nor the object replaced; else
// FAILED_PRECONDITION with ReasonSessionChanged, and nothing is stored. The token is used once:
// used already, older than 15 minutes or from before a restart of the server, it is refused
// FAILED_PRECONDITION with ReasonPlanExpired. fromID and toID must be the plan's
// (INVALID_ARGUMENT, the token kept). An empty token checks nothing, as upstream. CompactWith
// passes it.
func WithPlanToken(token string) CompactionOption {
	return func(o *compactionOptions) { o.planToken = token }
}

// AddCompaction stores a compaction overlay: reads replace the path from fromID to toID with
// one synthetic message holding the summary. Nothing is deleted. Subscribers see a
// ChangeCompaction event carrying the record, or ChangeCompact with FromCompact. WithPlanToken
// has it refused if the span changed since the plan.
func (s *Session) AddCompaction(ctx context.Context, summary, fromID, toID string, opts ...CompactionOption) (Compaction, error) {
	var o compactionOptions
	for _, opt := range opts {
		opt(&o)
	}
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.AddCompaction(cctx, &pb.AddCompactionRequest{
		ObjectKey: s.object.key, SessionId: s.id, Summary: summary, FromMessageId: fromID, ToMessageId: toID,
		FromCompact: o.fromCompact, PlanToken: o.planToken,
	})
	if err != nil {
		return Compaction{}, toError(err)
	}
	return *compactionOrZero(resp.GetCompaction()), nil
}

// ListCompactions lists every compaction record of the session, oldest first. The server answers
// a page at a time (up to 100 records); ListCompactions follows next_page_token until the last
// page and returns every record. WithCallTimeout bounds the whole listing, every page included.
func (s *Session) ListCompactions(ctx context.Context) ([]Compaction, error) {
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	var out []Compaction
	token := ""
	for {
		resp, err := s.client.stub.ListCompactions(cctx, &pb.ListCompactionsRequest{ObjectKey: s.object.key, SessionId: s.id, PageToken: token})
		if err != nil {
			return nil, toError(err)
		}
		for _, c := range resp.GetCompactions() {
			out = append(out, *compactionOrZero(c))
		}
		if token = resp.GetNextPageToken(); token == "" {
			if out == nil {
				out = []Compaction{}
			}
			return out, nil
		}
	}
}

// PlanCompaction plans a compaction of the path (the active branch, or WithLeaf) as upstream's
// createCompactFunction does; planned is false when there is nothing to compact.
// keepRecentTokens 0 means the session's policy (SetCompactionPolicy), whose own 0 is 20,000.
func (s *Session) PlanCompaction(ctx context.Context, keepRecentTokens int64, opts ...ReadOption) (plan CompactionPlan, planned bool, err error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.PlanCompaction(cctx, &pb.PlanCompactionRequest{
		ObjectKey: s.object.key, SessionId: s.id, LeafId: o.leafID, KeepRecentTokens: keepRecentTokens,
	})
	if err != nil {
		return CompactionPlan{}, false, toError(err)
	}
	if !resp.GetPlanned() {
		return CompactionPlan{}, false, nil
	}
	return CompactionPlan{
		FromMessageID: resp.GetFromMessageId(),
		ToMessageID:   resp.GetToMessageId(),
		Prompt:        resp.GetPrompt(),
		BudgetTokens:  resp.GetBudgetTokens(),
		PlanToken:     resp.GetPlanToken(),
	}, true, nil
}

// Compact compacts the path with the server's configured summarizer, keeping the recent tail
// the session's policy names; nil when there was nothing to compact. Without a summarizer the
// server answers FAILED_PRECONDITION (NO_SUMMARIZER).
func (s *Session) Compact(ctx context.Context, opts ...ReadOption) (*Compaction, error) {
	return s.CompactKeeping(ctx, 0, opts...)
}

// CompactKeeping is Compact with the token budget of the recent tail kept verbatim
// (keepRecentTokens; 0: the session's policy, whose own 0 is 20,000), as PlanCompaction takes it.
func (s *Session) CompactKeeping(ctx context.Context, keepRecentTokens int64, opts ...ReadOption) (*Compaction, error) {
	o := newReadOptions(opts)
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.Compact(cctx, &pb.CompactRequest{
		ObjectKey: s.object.key, SessionId: s.id, LeafId: o.leafID, KeepRecentTokens: keepRecentTokens,
	})
	if err != nil {
		return nil, toError(err)
	}
	if !resp.GetCompacted() {
		return nil, nil
	}
	return compactionOrZero(resp.GetCompaction()), nil
}

// jsWhitespace is JavaScript's whitespace and line terminators (String.prototype.trim): upstream
// drops a summary that trims to nothing by these. strings.TrimSpace knows U+0085 and not U+FEFF.
const jsWhitespace = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"

// compactAttempts is how many times CompactWith plans and summarizes when its summary is refused
// (ReasonSessionChanged, ReasonPlanExpired), as Python's COMPACT_ATTEMPTS.
const compactAttempts = 3

// planAgain reports whether a refusal of AddCompaction is one a new plan and summary can get past.
func planAgain(err error) bool {
	reason := Reason(err)
	return reason == ReasonSessionChanged || reason == ReasonPlanExpired
}

// CompactWith compacts with a summarizer that runs here: it plans on the server, calls
// summarize with the prompt, and stores the summary (upstream's createCompactFunction) as
// AddCompaction with FromCompact does, so subscribers see a ChangeCompact event, as after
// Python's session.compact(summarize=fn). It returns nil when there was nothing to compact or
// the summary is blank. The summary is stored WithPlanToken: when the server refuses it because
// the span changed meanwhile (ReasonSessionChanged) or the plan is no longer held
// (ReasonPlanExpired), CompactWith plans and summarizes again, at once, three tries in all, and
// returns the last refusal after the third.
func (s *Session) CompactWith(ctx context.Context, summarize func(ctx context.Context, prompt string) (string, error), keepRecentTokens int64, opts ...ReadOption) (*Compaction, error) {
	for attempt := 1; ; attempt++ {
		plan, planned, err := s.PlanCompaction(ctx, keepRecentTokens, opts...)
		if err != nil || !planned {
			return nil, err
		}
		summary, err := summarize(ctx, plan.Prompt)
		if err != nil {
			return nil, err
		}
		if strings.Trim(summary, jsWhitespace) == "" {
			return nil, nil
		}
		record, err := s.AddCompaction(ctx, summary, plan.FromMessageID, plan.ToMessageID, FromCompact(), WithPlanToken(plan.PlanToken))
		if err == nil {
			return &record, nil
		}
		if attempt >= compactAttempts || !planAgain(err) {
			return nil, err
		}
	}
}

// SetCompactionPolicy stores the session's automatic compaction policy. A server without a
// summarizer refuses a threshold (ReasonNoSummarizer); a zero threshold with KeepRecentTokens
// still stores PlanCompaction's default tail.
func (s *Session) SetCompactionPolicy(ctx context.Context, policy CompactionPolicy) (CompactionPolicy, error) {
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.SetCompactionPolicy(cctx, &pb.SetCompactionPolicyRequest{
		ObjectKey: s.object.key,
		SessionId: s.id,
		Policy:    &pb.CompactionPolicy{ThresholdTokens: policy.ThresholdTokens, KeepRecentTokens: policy.KeepRecentTokens},
	})
	if err != nil {
		return CompactionPolicy{}, toError(err)
	}
	return policyFrom(resp.GetPolicy()), nil
}

// GetCompactionPolicy reads the session's automatic compaction policy (all zero when none).
func (s *Session) GetCompactionPolicy(ctx context.Context) (CompactionPolicy, error) {
	cctx, cancel := s.object.unaryCtx(ctx)
	defer cancel()
	resp, err := s.client.stub.GetCompactionPolicy(cctx, &pb.GetCompactionPolicyRequest{ObjectKey: s.object.key, SessionId: s.id})
	if err != nil {
		return CompactionPolicy{}, toError(err)
	}
	return policyFrom(resp.GetPolicy()), nil
}

func policyFrom(p *pb.CompactionPolicy) CompactionPolicy {
	return CompactionPolicy{ThresholdTokens: p.GetThresholdTokens(), KeepRecentTokens: p.GetKeepRecentTokens()}
}

func compactionOrZero(p *pb.Compaction) *Compaction {
	if c := compactionFrom(p); c != nil {
		return c
	}
	return &Compaction{}
}
