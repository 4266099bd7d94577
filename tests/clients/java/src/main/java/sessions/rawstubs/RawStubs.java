package sessions.rawstubs;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.BadRequest;
import com.google.rpc.ErrorInfo;
import io.grpc.Channel;
import io.grpc.Context;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.MetadataUtils;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayOutputStream;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import sessions.v1.SessionServiceGrpc;
import sessions.v1.SessionServiceGrpc.SessionServiceBlockingStub;
import sessions.v1.Sessions.AppendMessageRequest;
import sessions.v1.Sessions.AppendMessageResponse;
import sessions.v1.Sessions.ChangeType;
import sessions.v1.Sessions.GetMessageRequest;
import sessions.v1.Sessions.GetMessageResponse;
import sessions.v1.Sessions.MessageFrame;
import sessions.v1.Sessions.ParentMode;
import sessions.v1.Sessions.StreamHistoryRequest;
import sessions.v1.Sessions.StreamHistoryResponse;
import sessions.v1.Sessions.SubscribeRequest;
import sessions.v1.Sessions.SubscribeResponse;
import sessions.v1.Sessions.UploadHeader;
import sessions.v1.Sessions.UploadMessageRequest;
import sessions.v1.Sessions.UploadMessageResponse;
import sessions.v1.Sessions.UploadOperation;

/**
 * Uses a Sessions server through stubs generated from proto/ alone, following docs/raw-stubs.md.
 * Arguments: a server's address, then a shard's (a server run with --require-routing-header).
 * Prints "ok NAME" for each check that held; any other outcome exits non-zero with the reason.
 */
public final class RawStubs {
  private static final int PIECE_BYTES = 3 * 1024 * 1024;
  private static final Metadata.Key<String> ROUTING_HEADER =
      Metadata.Key.of("x-object-key", Metadata.ASCII_STRING_MARSHALLER);

  public static void main(String[] args) throws Exception {
    ManagedChannel server = channel(args[0]);
    ManagedChannel shard = channel(args[1]);
    try {
      String key = "java/raw stubs " + System.nanoTime();
      appendsFormATreeAndRepeatAnswerTheStoredMessage(server, key);
      historyArrivesPackedInOrder(server, key);
      aLargeMessageGoesUpInPiecesAndComesBackWhole(server, key);
      errorsCarryTheirReasonAndField(server, key);
      aSubscriptionResumesAfterTheRevisionItSaw(server, key + " feed");
      aShardTakesTheDocumentedSpellingOnly(shard, "tenant a/*~\u00fc " + System.nanoTime());
    } finally {
      server.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
      shard.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
    }
  }

  /** Keepalive as the clients set it: a subscription to a vanished server fails, then resumes. */
  private static ManagedChannel channel(String address) {
    return ManagedChannelBuilder.forTarget(address)
        .usePlaintext()
        .keepAliveTime(30, TimeUnit.SECONDS)
        .keepAliveTimeout(10, TimeUnit.SECONDS)
        .build();
  }

  /** The x-object-key spelling of docs/raw-stubs.md: UTF-8, every byte but A-Z a-z 0-9 _.-~ as %XX. */
  static String routingKey(String objectKey) {
    StringBuilder out = new StringBuilder();
    for (byte b : objectKey.getBytes(StandardCharsets.UTF_8)) {
      int c = b & 0xff;
      boolean plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
          || c == '_' || c == '.' || c == '-' || c == '~';
      if (plain) {
        out.append((char) c);
      } else {
        out.append('%').append(String.format("%02X", c));
      }
    }
    return out.toString();
  }

  /** A stub whose calls send `spelling` as x-object-key. */
  private static SessionServiceBlockingStub spelled(Channel channel, String spelling) {
    Metadata headers = new Metadata();
    headers.put(ROUTING_HEADER, spelling);
    return SessionServiceGrpc.newBlockingStub(channel)
        .withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers))
        .withDeadlineAfter(60, TimeUnit.SECONDS);
  }

  private static SessionServiceBlockingStub stub(Channel channel, String objectKey) {
    return spelled(channel, routingKey(objectKey));
  }

  private static String message(String id, String role, String text) {
    return "{\"id\":\"" + id + "\",\"role\":\"" + role + "\",\"parts\":[{\"type\":\"text\",\"text\":\"" + text + "\"}]}";
  }

  private static AppendMessageResponse append(Channel channel, String key, String json, ParentMode mode) {
    return stub(channel, key).appendMessage(AppendMessageRequest.newBuilder()
        .setObjectKey(key).setMessageJson(json).setParentMode(mode).setOmitJsonAsSent(true).build());
  }

  private static void appendsFormATreeAndRepeatAnswerTheStoredMessage(Channel channel, String key) {
    String first = message("u1", "user", "hello from Java");
    AppendMessageResponse root = append(channel, key, first, ParentMode.PARENT_MODE_ROOT);
    check(root.getInserted() && root.getMessage().getJsonAsSent(), "u1 stored as sent: " + root);
    AppendMessageResponse reply = append(channel, key, message("a1", "assistant", "hi"), ParentMode.PARENT_MODE_AUTO);
    check(reply.getMessage().getInfo().getParentId().equals("u1"), "a1's parent: " + reply);
    AppendMessageResponse again = append(channel, key, message("u1", "user", "other text"), ParentMode.PARENT_MODE_ROOT);
    check(!again.getInserted() && again.getMessage().getJson().equals(first), "repeat of u1: " + again);
    System.out.println("ok append");
  }

  private static void historyArrivesPackedInOrder(Channel channel, String key) {
    Iterator<StreamHistoryResponse> responses = stub(channel, key).streamHistory(StreamHistoryRequest.newBuilder()
        .setObjectKey(key).setMaxMessagesPerResponse(400).build());
    List<String> ids = new ArrayList<>();
    int count = 0;
    while (responses.hasNext()) {
      StreamHistoryResponse response = responses.next();
      count++;
      List<MessageFrame> frames = new ArrayList<>(response.getFramesList());
      if (response.hasFrame()) {
        frames.add(0, response.getFrame());
      }
      for (MessageFrame frame : frames) {
        if (frame.hasInfo()) {
          ids.add(frame.getInfo().getId());
        }
      }
    }
    check(ids.equals(List.of("u1", "a1")) && count == 1, "history " + ids + " in " + count + " responses");
    System.out.println("ok history");
  }

  private static void aLargeMessageGoesUpInPiecesAndComesBackWhole(Channel channel, String key) throws Exception {
    String text = "\u00fc\u20ac".repeat(1024 * 1024); // 5 MiB of two- and three-byte characters
    String json = message("big", "user", text);
    CompletableFuture<UploadMessageResponse> answer = new CompletableFuture<>();
    StreamObserver<UploadMessageRequest> upload = SessionServiceGrpc.newStub(channel)
        .withInterceptors(MetadataUtils.newAttachHeadersInterceptor(routingHeader(key)))
        .withDeadlineAfter(60, TimeUnit.SECONDS)
        .uploadMessage(new StreamObserver<>() {
          @Override public void onNext(UploadMessageResponse value) { answer.complete(value); }
          @Override public void onError(Throwable t) { answer.completeExceptionally(t); }
          @Override public void onCompleted() { }
        });
    upload.onNext(UploadMessageRequest.newBuilder().setHeader(UploadHeader.newBuilder()
        .setObjectKey(key).setOperation(UploadOperation.UPLOAD_OPERATION_APPEND)
        .setParentMode(ParentMode.PARENT_MODE_AUTO)).build());
    int pieces = 0;
    for (String piece : utf8Pieces(json)) {
      upload.onNext(UploadMessageRequest.newBuilder().setJsonPiece(piece).build());
      pieces++;
    }
    upload.onCompleted();
    UploadMessageResponse stored = answer.get(60, TimeUnit.SECONDS);
    check(stored.getInserted() && pieces == 2, "upload of " + pieces + " pieces: " + stored.getInserted());

    ByteArrayOutputStream joined = new ByteArrayOutputStream();
    int frames = 0;
    Iterator<GetMessageResponse> read = stub(channel, key).getMessage(GetMessageRequest.newBuilder()
        .setObjectKey(key).setMessageId("big").build());
    while (read.hasNext()) {
      joined.write(read.next().getFrame().getJson().getBytes(StandardCharsets.UTF_8));
      frames++;
    }
    check(frames > 1 && joined.toString(StandardCharsets.UTF_8).equals(json), "read back in " + frames + " pieces");
    System.out.println("ok large");
  }

  private static Metadata routingHeader(String key) {
    Metadata headers = new Metadata();
    headers.put(ROUTING_HEADER, routingKey(key));
    return headers;
  }

  /** Pieces of at most PIECE_BYTES UTF-8 bytes, never cutting a character (nor a surrogate pair). */
  static List<String> utf8Pieces(String text) {
    List<String> pieces = new ArrayList<>();
    int start = 0;
    int bytes = 0;
    for (int i = 0; i < text.length(); ) {
      int codePoint = text.codePointAt(i);
      int size = new String(Character.toChars(codePoint)).getBytes(StandardCharsets.UTF_8).length;
      if (bytes + size > PIECE_BYTES) {
        pieces.add(text.substring(start, i));
        start = i;
        bytes = 0;
      }
      bytes += size;
      i += Character.charCount(codePoint);
    }
    pieces.add(text.substring(start));
    return pieces;
  }

  private static void errorsCarryTheirReasonAndField(Channel channel, String key) throws InvalidProtocolBufferException {
    StatusRuntimeException refused = refusal(() -> append(channel, key, "{not json", ParentMode.PARENT_MODE_AUTO));
    check(refused.getStatus().getCode() == Status.Code.INVALID_ARGUMENT, "code " + refused.getStatus());
    com.google.rpc.Status details = StatusProto.fromThrowable(refused);
    check(details != null, "no google.rpc.Status in " + refused);
    ErrorInfo info = null;
    BadRequest badRequest = null;
    for (Any detail : details.getDetailsList()) {
      if (detail.is(ErrorInfo.class)) {
        info = detail.unpack(ErrorInfo.class);
      } else if (detail.is(BadRequest.class)) {
        badRequest = detail.unpack(BadRequest.class);
      }
    }
    check(info != null && info.getDomain().equals("sessions.v1") && info.getReason().equals("INVALID_JSON"),
        "ErrorInfo " + info);
    check(badRequest != null && badRequest.getFieldViolations(0).getField().equals("message_json"),
        "BadRequest " + badRequest);
    System.out.println("ok errors");
  }

  private static void aSubscriptionResumesAfterTheRevisionItSaw(Channel channel, String key) throws Exception {
    append(channel, key, message("before", "user", "written before subscribing"), ParentMode.PARENT_MODE_AUTO);
    Context.CancellableContext live = Context.current().withCancellation();
    long opened;
    long appended;
    try {
      Iterator<SubscribeResponse> events = live.call(() -> stub(channel, key).withDeadlineAfter(1, TimeUnit.DAYS)
          .subscribe(SubscribeRequest.newBuilder().setObjectKey(key).build()));
      SubscribeResponse first = live.call(events::next);
      check(first.getType() == ChangeType.CHANGE_TYPE_PROGRESS, "first event " + first.getType());
      opened = first.getRevision();
      append(channel, key, message("during", "user", "written while subscribed"), ParentMode.PARENT_MODE_AUTO);
      SubscribeResponse next = live.call(events::next);
      check(next.getType() == ChangeType.CHANGE_TYPE_APPEND && next.getMessage().getInfo().getId().equals("during"),
          "event " + next);
      appended = next.getRevision();
      // Revisions are unsigned 64-bit: compared as such, never as Java's signed long.
      check(Long.compareUnsigned(appended, opened) > 0, "revisions " + Long.toUnsignedString(opened) + " then "
          + Long.toUnsignedString(appended));
    } finally {
      live.cancel(null);
    }
    append(channel, key, message("missed", "user", "written while away"), ParentMode.PARENT_MODE_AUTO);
    Context.CancellableContext resumed = Context.current().withCancellation();
    try {
      Iterator<SubscribeResponse> events = resumed.call(() -> stub(channel, key).withDeadlineAfter(1, TimeUnit.DAYS)
          .subscribe(SubscribeRequest.newBuilder().setObjectKey(key).setResumeAfterRevision(appended).build()));
      SubscribeResponse first = resumed.call(events::next);
      check(first.getType() == ChangeType.CHANGE_TYPE_PROGRESS && first.getRevision() == appended,
          "resume starts with " + first);
      SubscribeResponse missed = resumed.call(events::next);
      check(missed.getType() == ChangeType.CHANGE_TYPE_APPEND && missed.getMessage().getInfo().getId().equals("missed"),
          "missed event " + missed);
    } finally {
      resumed.cancel(null);
    }
    System.out.println("ok subscribe");
  }

  private static void aShardTakesTheDocumentedSpellingOnly(Channel shard, String key) {
    String documented = routingKey(key);
    AppendMessageResponse stored = spelled(shard, documented).appendMessage(AppendMessageRequest.newBuilder()
        .setObjectKey(key).setMessageJson(message("s1", "user", "on a shard")).setOmitJsonAsSent(true).build());
    check(stored.getInserted(), "append with " + documented);
    // URLEncoder writes a space as '+', which decodes to another key; with "%20" for it, '*' left
    // raw and "%7E" for '~' still spell the key otherwise than the proxy hashes it.
    String urlEncoded = URLEncoder.encode(key, StandardCharsets.UTF_8);
    String patched = urlEncoded.replace("+", "%20");
    for (String spelling : List.of(urlEncoded, patched)) {
      StatusRuntimeException refused = refusal(() -> spelled(shard, spelling).appendMessage(
          AppendMessageRequest.newBuilder().setObjectKey(key).setMessageJson(message("s2", "user", "x")).build()));
      check(refused.getStatus().getCode() == Status.Code.INVALID_ARGUMENT
          && reason(refused).equals("OBJECT_KEY_MISMATCH"), "refusal of " + spelling + ": " + refused.getStatus());
      if (spelling.equals(patched)) {
        check(refused.getStatus().getDescription().contains(documented), "wanted spelling not named: " + refused);
      }
    }
    System.out.println("ok routing " + documented);
  }

  private static String reason(StatusRuntimeException refused) {
    com.google.rpc.Status details = StatusProto.fromThrowable(refused);
    if (details != null) {
      for (Any detail : details.getDetailsList()) {
        if (detail.is(ErrorInfo.class)) {
          try {
            return detail.unpack(ErrorInfo.class).getReason();
          } catch (InvalidProtocolBufferException e) {
            throw new AssertionError(e);
          }
        }
      }
    }
    return "";
  }

  private static StatusRuntimeException refusal(Runnable call) {
    try {
      call.run();
    } catch (StatusRuntimeException refused) {
      return refused;
    }
    throw new AssertionError("the call was not refused");
  }

  private static void check(boolean holds, String what) {
    if (!holds) {
      throw new AssertionError(what);
    }
  }
}
