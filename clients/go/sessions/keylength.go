package sessions

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// largestKeyLimitBytes is the most a server's --max-object-key-bytes may be: servers make room
// for headers carrying a key that long (percent-encoded in x-object-key, up to three times as
// long).
const largestKeyLimitBytes = 64 * 1024

// keyTooLong is the error of a call whose object key is longer than any server takes, as a
// server refuses one past its own limit; nil for any other call. Sent, its header passed what
// the server takes, and grpc-go failed the call INTERNAL ("header list size to send violates the
// maximum size ... set by server"), where the Python and TypeScript clients say this.
func keyTooLong(ctx context.Context) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	for _, escaped := range md.Get(ObjectKeyHeader) {
		if len(escaped) <= largestKeyLimitBytes {
			continue
		}
		if size := len(escaped) - 2*strings.Count(escaped, "%"); size > largestKeyLimitBytes {
			return clientError(codes.InvalidArgument, "INVALID_OBJECT_KEY",
				"object_key is %d bytes; no server takes more than %d bytes (its --max-object-key-bytes at most)",
				size, largestKeyLimitBytes)
		}
	}
	return nil
}

func refuseLongKeysUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := keyTooLong(ctx); err != nil {
		return err
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func refuseLongKeysStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := keyTooLong(ctx); err != nil {
		return nil, err
	}
	return streamer(ctx, desc, cc, method, opts...)
}
