package sessions

// Option configures a write (AppendMessage, AppendMessages, UpdateMessage, UpsertMessage).
// Options that do not apply to a call are ignored.
type Option func(*writeOptions)

type writeOptions struct {
	parentMode ParentMode
	parentID   string
	source     Source
}

func newWriteOptions(opts []Option) writeOptions {
	o := writeOptions{parentMode: ParentAuto, source: SourceServer}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithAutoParent attaches the message to the session's newest message (a root when the
// session is empty). This is the default.
func WithAutoParent() Option {
	return func(o *writeOptions) { o.parentMode, o.parentID = ParentAuto, "" }
}

// WithRoot starts a new root.
func WithRoot() Option {
	return func(o *writeOptions) { o.parentMode, o.parentID = ParentRoot, "" }
}

// WithParent attaches the message to the given parent. An empty, unknown or other-session id
// makes a root, as upstream does; the result's Message.Info.ParentID shows the parent used.
func WithParent(id string) Option {
	return func(o *writeOptions) { o.parentMode, o.parentID = ParentByID, id }
}

// WithSource says who produced the message (SourceServer by default). SourceClient input has
// the server's reserved metadata keys removed.
func WithSource(source Source) Option {
	return func(o *writeOptions) { o.source = source }
}

// ReadOption configures a read. Options that do not apply to a call are ignored.
type ReadOption func(*readOptions)

type readOptions struct {
	leafID        string
	newestFirst   bool
	pointers      bool
	batchSize     uint32
	maxBatchBytes uint64
	resumeAfter   uint64
	limit         *uint32

	includeProgress   bool
	reconnectAttempts *int
}

func newReadOptions(opts []ReadOption) readOptions {
	var o readOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithLeaf reads the path ending at this leaf instead of the active leaf (History,
// HistoryBatches, GetRecentHistory, GetHistoryRowStats). An unknown id reads nothing.
func WithLeaf(id string) ReadOption {
	return func(o *readOptions) { o.leafID = id }
}

// NewestFirst reads a path from the leaf towards the root (History, HistoryBatches). Its cost
// grows with what is read, so stop early when looking for something recent.
func NewestFirst() ReadOption {
	return func(o *readOptions) { o.newestFirst = true }
}

// WithLimit reads at most n messages of a path, in the read's order (History, HistoryBatches,
// GetHistory): with NewestFirst, the newest n, and the server reads no further. Without it the
// whole path is read; WithLimit(0) is an error (codes.InvalidArgument, ReasonInvalidField),
// found before any call.
func WithLimit(n uint32) ReadOption {
	return func(o *readOptions) { o.limit = &n }
}

// WithAttachmentPointers leaves stored attachments as `attachment:sha256:<hex>` pointers
// instead of restoring their payloads into the messages.
func WithAttachmentPointers() ReadOption {
	return func(o *readOptions) { o.pointers = true }
}

// WithBatchSize sets HistoryBatches' largest batch, in messages (default 50; 0 is the default,
// where the Python and TypeScript clients take 0 as 1).
func WithBatchSize(n uint32) ReadOption {
	return func(o *readOptions) { o.batchSize = n }
}

// WithMaxBatchBytes sets HistoryBatches' largest batch, in JSON bytes (default 4 MiB; 0 is the
// default, where the Python and TypeScript clients take 0 as 1); a larger message forms a batch
// alone.
func WithMaxBatchBytes(n uint64) ReadOption {
	return func(o *readOptions) { o.maxBatchBytes = n }
}

// ResumeAfter makes Subscribe resume after this revision instead of starting live.
func ResumeAfter(revision uint64) ReadOption {
	return func(o *readOptions) { o.resumeAfter = revision }
}

// IncludeProgress makes Subscribe also return PROGRESS events (dropped by default): the feed
// is alive at that revision and nothing happened.
func IncludeProgress() ReadOption {
	return func(o *readOptions) { o.includeProgress = true }
}

// WithReconnectAttempts sets how many times in a row Subscribe reconnects after the server went
// away, refused before acting (the object moved to another shard among them) or a proxy ended
// the stream (see Subscription) before it gives up (default 20; 0 never reconnects).
func WithReconnectAttempts(n int) ReadOption {
	return func(o *readOptions) { o.reconnectAttempts = &n }
}
