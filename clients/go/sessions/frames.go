package sessions

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	pb "github.com/sessions-dev/sessions/clients/go/gen/sessions/v1"
)

const (
	// UnaryLimitBytes: a write whose JSON is larger goes through the client-streaming
	// UploadMessage path, so servers and proxies with default 4 MiB limits accept it.
	UnaryLimitBytes = 3 * 1024 * 1024
	// PieceBytes is the largest piece of a message sent in a client stream.
	PieceBytes = 3 * 1024 * 1024
)

// toJSON turns a message argument into JSON text. json.RawMessage, []byte and string are JSON
// text and are sent byte for byte; a Message sends its JSON; anything else is marshalled with
// encoding/json (HTML characters left unescaped).
func toJSON(message any) (string, error) {
	var text string
	switch m := message.(type) {
	case nil:
		return "", clientError(codes.InvalidArgument, ReasonInvalidJSON, "message is nil")
	case string:
		text = m
	case json.RawMessage:
		text = string(m)
	case *json.RawMessage:
		if m == nil {
			return "", clientError(codes.InvalidArgument, ReasonInvalidJSON, "message is nil")
		}
		text = string(*m)
	case []byte:
		text = string(m)
	case Message:
		text = string(m.JSON)
	case *Message:
		if m == nil {
			return "", clientError(codes.InvalidArgument, ReasonInvalidJSON, "message is nil")
		}
		text = string(m.JSON)
	default:
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(message); err != nil {
			return "", clientError(codes.InvalidArgument, ReasonInvalidJSON, "message cannot be encoded as JSON: %v", err)
		}
		text = string(bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}))
	}
	// Protobuf strings must be UTF-8; report it as the server would rather than as a marshal error.
	if !utf8.ValidString(text) {
		return "", clientError(codes.InvalidArgument, ReasonInvalidJSON, "message is not valid UTF-8")
	}
	return text, nil
}

// pieces cuts text into pieces of at most PieceBytes bytes, never inside a UTF-8 character.
func pieces(text string) []string {
	if len(text) <= PieceBytes {
		return []string{text}
	}
	out := make([]string, 0, len(text)/PieceBytes+1)
	for start := 0; start < len(text); {
		end := min(start+PieceBytes, len(text))
		for end < len(text) && end > start && !utf8.RuneStart(text[end]) {
			end--
		}
		out = append(out, text[start:end])
		start = end
	}
	return out
}

// assembler joins MessageFrame pieces back into whole messages. It holds at most the pieces of
// one message.
type assembler struct {
	info    *pb.MessageInfo
	buf     []byte
	partial bool
}

// feed takes the next frame and returns a message when that frame completes one.
func (a *assembler) feed(frame *pb.MessageFrame) (Message, bool) {
	if frame == nil {
		return Message{}, false
	}
	if !a.partial {
		if !frame.GetMorePieces() {
			return Message{JSON: json.RawMessage(frame.GetJson()), Info: infoFrom(frame.GetInfo())}, true
		}
		a.info = frame.GetInfo()
		a.partial = true
	}
	a.buf = append(a.buf, frame.GetJson()...)
	if frame.GetMorePieces() {
		return Message{}, false
	}
	msg := Message{JSON: json.RawMessage(a.buf), Info: infoFrom(a.info)}
	a.info, a.buf, a.partial = nil, nil, false
	return msg, true
}

// finish reports a stream that ended in the middle of a message.
func (a *assembler) finish() error {
	if a.partial {
		a.info, a.buf, a.partial = nil, nil, false
		return clientError(codes.DataLoss, ReasonInvalidStream, streamEndedInsideMessage)
	}
	return nil
}

func parentFields(o writeOptions) (pb.ParentMode, string) {
	return pb.ParentMode(o.parentMode), o.parentID
}
