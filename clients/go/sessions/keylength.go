package sessions

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// largestKeyLimitBytes is the most a server's --max-object-key-bytes may be: servers make room
// for headers carrying a key that long (percent-encoded in x-object-key, up to three times as
// long).
const largestKeyLimitBytes = 64 * 1024

// keyTooLong is the error of calls for key when it is longer than any server takes, as a server
// refuses one past its own limit; nil for any other key. Sent, its header passed what the server
// takes, and grpc-go failed the call INTERNAL ("header list size to send violates the maximum
// size ... set by server"), where the Python and TypeScript clients say this.
func keyTooLong(key string) error {
	if len(key) <= largestKeyLimitBytes {
		return nil
	}
	return clientError(codes.InvalidArgument, ReasonInvalidObjectKey,
		"object_key is %d bytes; no server takes more than %d bytes (its --max-object-key-bytes at most)",
		len(key), largestKeyLimitBytes)
}

// refusedKey carries, in a call's context, the keyTooLong error of the object it is routed to.
type refusedKey struct{}

// keyCheckedConn fails a call whose context carries a refusedKey before anything is sent, on
// whichever connection the client calls through (Dial's own, or WithConn's).
type keyCheckedConn struct {
	grpc.ClientConnInterface
}

func (c keyCheckedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if err, _ := ctx.Value(refusedKey{}).(error); err != nil {
		return err
	}
	return c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
}

func (c keyCheckedConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err, _ := ctx.Value(refusedKey{}).(error); err != nil {
		return nil, err
	}
	return c.ClientConnInterface.NewStream(ctx, desc, method, opts...)
}
