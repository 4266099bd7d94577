package sessions

import (
	"context"
	"io"
	"iter"
	"runtime"

	"google.golang.org/grpc/codes"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

// HistoryIterator streams one root-to-leaf path, one message at a time. The server packs up to
// 400 small messages into one response (about 1 MiB of JSON at most); the iterator reads the
// next response only when the current one is used up, and decodes one message per Next. It
// holds the current message, the not yet returned frames of one response and, while a large
// message arrives in pieces, that message's pieces; never the path. Use it as
//
//	it := s.History(ctx)
//	defer it.Close()
//	for it.Next() {
//		use(it.Message())
//	}
//	if err := it.Err(); err != nil { ... }
//
// or with range over All. Close (or breaking out of All) cancels the server's reads. An
// iterator is not safe for concurrent use.
type HistoryIterator struct {
	cancel context.CancelFunc
	stream *messageStream[pb.StreamHistoryResponse]
	cur    Message
	held   bool
	err    error
	done   bool
}

// maxMessages is StreamHistory's max_messages for the options: 0 (the whole path) without
// WithLimit, an error for WithLimit(0).
func (o *readOptions) maxMessages() (uint32, error) {
	if o.limit == nil {
		return 0, nil
	}
	if *o.limit == 0 {
		return 0, clientError(codes.InvalidArgument, ReasonInvalidField, "limit must be a positive number of messages, got 0")
	}
	return *o.limit, nil
}

// History streams a path: the active branch by default (WithLeaf for another), root first
// (NewestFirst for the other way), all of it or at most WithLimit messages. Errors, including a
// failure to start the call, come from Err once Next returns false. An iterator left before
// Next returns false must be Closed (All does it): until then it holds the call open, on the
// server too, and a goroutine here (until it is garbage-collected, if the context lives on).
func (s *Session) History(ctx context.Context, opts ...ReadOption) *HistoryIterator {
	o := newReadOptions(opts)
	sctx, cancel := context.WithCancel(s.object.routed(ctx))
	it := &HistoryIterator{cancel: cancel}
	cancelWhenDropped(it, cancel)
	maxMessages, err := o.maxMessages()
	if err != nil {
		it.finish(err)
		return it
	}
	stream, err := s.client.stub.StreamHistory(sctx, &pb.StreamHistoryRequest{
		ObjectKey:              s.object.key,
		SessionId:              s.id,
		LeafId:                 o.leafID,
		NewestFirst:            o.newestFirst,
		Attachments:            attachmentMode(o),
		MaxMessagesPerResponse: packedMessages,
		MaxMessages:            maxMessages,
	})
	if err != nil {
		it.finish(toError(err))
		return it
	}
	it.stream = newMessageStream(stream, nil)
	return it
}

// Next advances to the next message, dropping the previous one. It returns false at the end of
// the path, on an error (see Err), or after Close.
func (it *HistoryIterator) Next() bool {
	it.cur, it.held = Message{}, false
	if it.done {
		return false
	}
	msg, err := it.stream.next()
	if err != nil {
		if err == io.EOF {
			err = nil
		}
		it.finish(err)
		return false
	}
	it.cur, it.held = msg, true
	return true
}

// Message returns the current message (valid after Next returned true).
func (it *HistoryIterator) Message() Message { return it.cur }

// Err returns the error that ended the iteration, or nil at a clean end or after Close.
func (it *HistoryIterator) Err() error { return it.err }

// Held returns how many decoded messages the iterator holds: 1 after Next returned true, else 0.
// It never holds more: history is streamed, not collected.
func (it *HistoryIterator) Held() int {
	if it.held {
		return 1
	}
	return 0
}

// Frames returns how many responses (gRPC frames) the iterator has received so far. Each carries
// up to 400 packed messages, or one piece of a message over 3 MiB, so a long path of small
// messages takes far fewer responses than messages. Responses are read only as Next needs them:
// the next one once every message of the current one has been returned.
func (it *HistoryIterator) Frames() int64 {
	if it.stream == nil {
		return 0
	}
	return it.stream.responses
}

// Close stops the stream (the server stops reading) and drops the current message. It is safe
// to call more than once and after the end.
func (it *HistoryIterator) Close() error {
	it.cur, it.held = Message{}, false
	if !it.done {
		it.done = true
		it.cancel()
	}
	return nil
}

// All returns the iterator as a range-over-func sequence. Breaking out of the loop closes the
// stream; an error is yielded once, last.
func (it *HistoryIterator) All() iter.Seq2[Message, error] {
	return func(yield func(Message, error) bool) {
		defer it.Close()
		for it.Next() {
			if !yield(it.Message(), nil) {
				return
			}
		}
		if err := it.Err(); err != nil {
			yield(Message{}, err)
		}
	}
}

func (it *HistoryIterator) finish(err error) {
	it.err, it.done = err, true
	it.cancel()
}

// BatchIterator streams a path in batches marked by the server (by message count and bytes). It
// holds one batch at a time.
type BatchIterator struct {
	cancel context.CancelFunc
	stream *messageStream[pb.StreamHistoryResponse]
	cur    []Message
	err    error
	done   bool
}

// cancelWhenDropped cancels an iterator's call once the iterator is garbage-collected: one left
// unfinished without Close would hold the call, on the server too, and gRPC's goroutine watching
// its context, for as long as the context lived. Best effort (collection comes when the runtime
// decides): Close is the way.
func cancelWhenDropped[T any](it *T, cancel context.CancelFunc) {
	runtime.AddCleanup(it, func(cancel context.CancelFunc) { cancel() }, cancel)
}

// HistoryBatches streams a path in batches of at most WithBatchSize messages (default 50) and
// WithMaxBatchBytes JSON bytes (default 4 MiB; a larger message forms a batch alone), all of it
// or at most WithLimit messages.
func (s *Session) HistoryBatches(ctx context.Context, opts ...ReadOption) *BatchIterator {
	o := newReadOptions(opts)
	if o.batchSize == 0 {
		o.batchSize = 50
	}
	if o.maxBatchBytes == 0 {
		o.maxBatchBytes = 4 * 1024 * 1024
	}
	sctx, cancel := context.WithCancel(s.object.routed(ctx))
	it := &BatchIterator{cancel: cancel}
	cancelWhenDropped(it, cancel)
	maxMessages, err := o.maxMessages()
	if err != nil {
		it.finish(err)
		return it
	}
	stream, err := s.client.stub.StreamHistory(sctx, &pb.StreamHistoryRequest{
		ObjectKey:              s.object.key,
		SessionId:              s.id,
		LeafId:                 o.leafID,
		NewestFirst:            o.newestFirst,
		BatchSize:              o.batchSize,
		MaxBatchBytes:          o.maxBatchBytes,
		Attachments:            attachmentMode(o),
		MaxMessagesPerResponse: packedMessages,
		MaxMessages:            maxMessages,
	})
	if err != nil {
		it.finish(toError(err))
		return it
	}
	it.stream = newMessageStream(stream, nil)
	return it
}

// Next advances to the next batch. It returns false at the end, on an error, or after Close.
func (it *BatchIterator) Next() bool {
	it.cur = nil
	if it.done {
		return false
	}
	var batch []Message
	for {
		msg, ok, ended, err := it.stream.step()
		if err == io.EOF {
			it.finish(nil)
			if len(batch) > 0 { // a server that did not mark the last batch end
				it.cur = batch
				return true
			}
			return false
		}
		if err != nil {
			it.finish(err)
			return false
		}
		if ok {
			batch = append(batch, msg)
			continue
		}
		// batch_end marks a response whose last frame ends a batch: the batch ends once every
		// frame of that response has been read, as in the Python client.
		if ended.GetBatchEnd() {
			it.cur = batch
			return true
		}
	}
}

// Batch returns the current batch (valid after Next returned true).
func (it *BatchIterator) Batch() []Message { return it.cur }

// Err returns the error that ended the iteration, or nil.
func (it *BatchIterator) Err() error { return it.err }

// Close stops the stream. It is safe to call more than once.
func (it *BatchIterator) Close() error {
	it.cur = nil
	if !it.done {
		it.done = true
		it.cancel()
	}
	return nil
}

// All returns the iterator as a range-over-func sequence; breaking out closes the stream.
func (it *BatchIterator) All() iter.Seq2[[]Message, error] {
	return func(yield func([]Message, error) bool) {
		defer it.Close()
		for it.Next() {
			if !yield(it.Batch(), nil) {
				return
			}
		}
		if err := it.Err(); err != nil {
			yield(nil, err)
		}
	}
}

func (it *BatchIterator) finish(err error) {
	it.err, it.done = err, true
	it.cancel()
}
