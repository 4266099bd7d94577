package sessions

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons found in Error.Reason: the ErrorReason enum of the contract without its prefix.
const (
	ReasonInvalidJSON        = "INVALID_JSON"
	ReasonInvalidMessage     = "INVALID_MESSAGE"
	ReasonInvalidObjectKey   = "INVALID_OBJECT_KEY"
	ReasonInvalidField       = "INVALID_FIELD"
	ReasonObjectKeyMismatch  = "OBJECT_KEY_MISMATCH"
	ReasonInvalidStream      = "INVALID_STREAM"
	ReasonDraining           = "DRAINING"
	ReasonStorageFailure     = "STORAGE_FAILURE"
	ReasonLimitExceeded      = "LIMIT_EXCEEDED"
	ReasonStorageFull        = "STORAGE_FULL"
	ReasonNotFound           = "NOT_FOUND"
	ReasonNoSummarizer       = "NO_SUMMARIZER"
	ReasonUnauthenticated    = "UNAUTHENTICATED"
	ReasonPermissionDenied   = "PERMISSION_DENIED"
	ReasonInternal           = "INTERNAL"
	ReasonFailedPrecondition = "FAILED_PRECONDITION"
	ReasonObjectNotOwned     = "OBJECT_NOT_OWNED"
	ReasonObjectMoving       = "OBJECT_MOVING"
	ReasonSummarizerFailed   = "SUMMARIZER_FAILED"
	ReasonServerBusy         = "SERVER_BUSY"
	ReasonObjectExists       = "OBJECT_EXISTS"
	ReasonSessionChanged     = "SESSION_CHANGED"
	ReasonPlanExpired        = "PLAN_EXPIRED"
	// ReasonObjectDamaged comes with codes.DataLoss: the object's file on the server is damaged
	// (or is not an object file at all) and every call on the object is refused until an
	// operator restores or erases it. Permanent: never retried.
	ReasonObjectDamaged = "OBJECT_DAMAGED"
	// ReasonObjectDeparting comes with codes.FailedPrecondition from a move's import of an object
	// the server is moving away: most often a move whose destination is its source by another address.
	ReasonObjectDeparting    = "OBJECT_DEPARTING"
	errorDomain              = "sessions.v1"
	codeUnavailable          = codes.Unavailable
	streamEndedInsideMessage = "stream ended inside a message (more_pieces was true)"
)

// Error is every failure this package returns: the gRPC status code, the server's message and,
// when the server sent one, the google.rpc.ErrorInfo reason and metadata. Use errors.As to get
// it, or the Code and Reason helpers.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message.
	Message string
	// Reason is the ErrorInfo reason (e.g. "INVALID_JSON"); empty when the status had none.
	Reason string
	// Domain is the ErrorInfo domain ("sessions.v1" for the server's own errors).
	Domain string
	// Metadata is the ErrorInfo metadata (e.g. "field", "detail", "limit").
	Metadata map[string]string

	status *status.Status
}

func (e *Error) Error() string {
	s := fmt.Sprintf("sessions: %s: %s", e.Code, e.Message)
	if e.Reason != "" {
		s += " [" + e.Reason + "]"
	}
	return s
}

// GRPCStatus lets status.FromError and status.Code see the original status.
func (e *Error) GRPCStatus() *status.Status {
	if e.status != nil {
		return e.status
	}
	return status.New(e.Code, e.Message)
}

// Code returns the gRPC code of err: codes.OK for nil; works on *Error and on plain gRPC errors
// (from Stub calls) alike.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	return FromError(err).Code
}

// Reason returns the ErrorInfo reason of err (an *Error or a plain gRPC error), or "".
func Reason(err error) string {
	if err == nil {
		return ""
	}
	return FromError(err).Reason
}

// FromError converts any error (a gRPC status error from a Stub call, a context error) into an
// *Error; nil for nil.
func FromError(err error) *Error {
	if err == nil {
		return nil
	}
	return toError(err).(*Error)
}

// toError converts a gRPC (or context) error into *Error; nil stays nil.
func toError(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			st = status.FromContextError(err)
		} else {
			st = status.New(codes.Unknown, err.Error())
		}
	}
	switch {
	case cutMidMessage(st):
		// grpc-go reports a stream that ended with a response half received (the server's
		// stop cancelled it at the end of its drain, or the connection failed) as INTERNAL;
		// the other clients see the cancellation itself, UNAVAILABLE, and so retry it.
		st = status.New(codes.Unavailable, "the stream was cut in the middle of a response: "+st.Message())
	case endedWithoutStatus(st):
		// A proxy (HAProxy) ends a call so when its connection to the server fails under it:
		// whether the server carried the call out is unknown, as after any failed connection.
		// The Python and TypeScript clients report it alike.
		st = status.New(codes.Unavailable, "the call ended without the server's status, as a proxy ends it when its connection to the server fails ("+st.Message()+")")
	}
	out := &Error{Code: st.Code(), Message: st.Message(), status: st}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			out.Reason = info.GetReason()
			out.Domain = info.GetDomain()
			out.Metadata = maps.Clone(info.GetMetadata())
			break
		}
	}
	return out
}

// cutMidMessage reports whether st is grpc-go's own status for a stream that ended in the middle
// of a message (io.ErrUnexpectedEOF as INTERNAL), not one the server sent.
func cutMidMessage(st *status.Status) bool {
	return st.Code() == codes.Internal && st.Message() == io.ErrUnexpectedEOF.Error() && len(st.Details()) == 0
}

// endedWithoutStatus reports whether st is grpc-go's own status for a stream that ended without
// trailers, hence without the server's status.
func endedWithoutStatus(st *status.Status) bool {
	return st.Code() == codes.Internal && st.Message() == "server closed the stream without sending trailers" && len(st.Details()) == 0
}

// clientError is an error found before anything was sent, shaped like the server's.
func clientError(code codes.Code, reason, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Reason: reason, Domain: errorDomain}
}
