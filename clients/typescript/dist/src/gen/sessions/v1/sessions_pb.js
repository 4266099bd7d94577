// The Sessions contract: durable, tree-structured conversation history for AI agents.
//
// Vocabulary
// - Object: an isolated store named by an object key (one SQLite file, owned by one server).
// - Session: a namespace inside an object, named by a session id ("" is the default).
// - Message: an AI SDK UIMessage-compatible JSON object with a string `id`, a string `role` and
//   an array `parts`. Messages travel as JSON text, byte-exact, never as google.protobuf.Struct.
//
// Framing
// No response frame exceeds 4 MiB, so stock stubs with default settings work for every message
// size. A message too large for one frame arrives as consecutive MessageFrame pieces: the first
// carries `info`, every piece carries the next part of `json` (cut on UTF-8 boundaries), and
// `more_pieces` is true on every piece but the last. Concatenate the pieces to get the message.
//
// Errors
// Failures carry a google.rpc.Status with a google.rpc.ErrorInfo (domain "sessions.v1") whose
// `reason` is an ErrorReason value name without its `ERROR_REASON_` prefix, e.g. "INVALID_JSON".
// Where upstream returns null (a missing message), the answer is an empty or found=false
// response, not an error.
//
// Routing
// Clients send the object key as request metadata `x-object-key` (percent-encoded UTF-8) so a
// proxy can route by it; when present it must equal the request's `object_key`.
import { enumDesc, fileDesc, messageDesc, serviceDesc } from "@bufbuild/protobuf/codegenv2";
/**
 * Describes the file sessions/v1/sessions.proto.
 */
export const file_sessions_v1_sessions = /*@__PURE__*/ fileDesc("ChpzZXNzaW9ucy92MS9zZXNzaW9ucy5wcm90bxILc2Vzc2lvbnMudjEimgEKC01lc3NhZ2VJbmZvEgoKAmlkGAEgASgJEgwKBHJvbGUYAiABKAkSFgoJcGFyZW50X2lkGAMgASgJSACIAQESCwoDc2VxGAQgASgDEhUKDWNyZWF0ZWRfYXRfbXMYBSABKAMSFgoOdG9rZW5fZXN0aW1hdGUYBiABKAMSDwoHb3ZlcmxheRgHIAEoCEIMCgpfcGFyZW50X2lkIlkKDE1lc3NhZ2VGcmFtZRImCgRpbmZvGAEgASgLMhguc2Vzc2lvbnMudjEuTWVzc2FnZUluZm8SDAoEanNvbhgCIAEoCRITCgttb3JlX3BpZWNlcxgDIAEoCCJcCg5Xcml0dGVuTWVzc2FnZRImCgRpbmZvGAEgASgLMhguc2Vzc2lvbnMudjEuTWVzc2FnZUluZm8SDAoEanNvbhgCIAEoCRIUCgxqc29uX29taXR0ZWQYAyABKAgiTgoMQXBwZW5kUmVzdWx0EhAKCGluc2VydGVkGAEgASgIEiwKB21lc3NhZ2UYAiABKAsyGy5zZXNzaW9ucy52MS5Xcml0dGVuTWVzc2FnZSK6AQoUQXBwZW5kTWVzc2FnZVJlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRISCgpzZXNzaW9uX2lkGAIgASgJEhQKDG1lc3NhZ2VfanNvbhgDIAEoCRIsCgtwYXJlbnRfbW9kZRgEIAEoDjIXLnNlc3Npb25zLnYxLlBhcmVudE1vZGUSEQoJcGFyZW50X2lkGAUgASgJEiMKBnNvdXJjZRgGIAEoDjITLnNlc3Npb25zLnYxLlNvdXJjZSJXChVBcHBlbmRNZXNzYWdlUmVzcG9uc2USEAoIaW5zZXJ0ZWQYASABKAgSLAoHbWVzc2FnZRgCIAEoCzIbLnNlc3Npb25zLnYxLldyaXR0ZW5NZXNzYWdlIogBCgpBcHBlbmRJdGVtEhQKDG1lc3NhZ2VfanNvbhgBIAEoCRIsCgtwYXJlbnRfbW9kZRgCIAEoDjIXLnNlc3Npb25zLnYxLlBhcmVudE1vZGUSEQoJcGFyZW50X2lkGAMgASgJEiMKBnNvdXJjZRgEIAEoDjITLnNlc3Npb25zLnYxLlNvdXJjZSJnChVBcHBlbmRNZXNzYWdlc1JlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRISCgpzZXNzaW9uX2lkGAIgASgJEiYKBWl0ZW1zGAMgAygLMhcuc2Vzc2lvbnMudjEuQXBwZW5kSXRlbSJEChZBcHBlbmRNZXNzYWdlc1Jlc3BvbnNlEioKB3Jlc3VsdHMYASADKAsyGS5zZXNzaW9ucy52MS5BcHBlbmRSZXN1bHQieQoUVXBkYXRlTWVzc2FnZVJlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRISCgpzZXNzaW9uX2lkGAIgASgJEhQKDG1lc3NhZ2VfanNvbhgDIAEoCRIjCgZzb3VyY2UYBCABKA4yEy5zZXNzaW9ucy52MS5Tb3VyY2UiZQoVVXBkYXRlTWVzc2FnZVJlc3BvbnNlEg0KBWZvdW5kGAEgASgIEg8KB2NoYW5nZWQYAiABKAgSLAoHbWVzc2FnZRgDIAEoCzIbLnNlc3Npb25zLnYxLldyaXR0ZW5NZXNzYWdlIroBChRVcHNlcnRNZXNzYWdlUmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhIKCnNlc3Npb25faWQYAiABKAkSFAoMbWVzc2FnZV9qc29uGAMgASgJEiwKC3BhcmVudF9tb2RlGAQgASgOMhcuc2Vzc2lvbnMudjEuUGFyZW50TW9kZRIRCglwYXJlbnRfaWQYBSABKAkSIwoGc291cmNlGAYgASgOMhMuc2Vzc2lvbnMudjEuU291cmNlImgKFVVwc2VydE1lc3NhZ2VSZXNwb25zZRIQCghpbnNlcnRlZBgBIAEoCBIPCgdjaGFuZ2VkGAIgASgIEiwKB21lc3NhZ2UYAyABKAsyGy5zZXNzaW9ucy52MS5Xcml0dGVuTWVzc2FnZSLNAQoMVXBsb2FkSGVhZGVyEhIKCm9iamVjdF9rZXkYASABKAkSEgoKc2Vzc2lvbl9pZBgCIAEoCRIvCglvcGVyYXRpb24YAyABKA4yHC5zZXNzaW9ucy52MS5VcGxvYWRPcGVyYXRpb24SLAoLcGFyZW50X21vZGUYBCABKA4yFy5zZXNzaW9ucy52MS5QYXJlbnRNb2RlEhEKCXBhcmVudF9pZBgFIAEoCRIjCgZzb3VyY2UYBiABKA4yEy5zZXNzaW9ucy52MS5Tb3VyY2UiVQoUVXBsb2FkTWVzc2FnZVJlcXVlc3QSKQoGaGVhZGVyGAEgASgLMhkuc2Vzc2lvbnMudjEuVXBsb2FkSGVhZGVyEhIKCmpzb25fcGllY2UYAiABKAkidwoVVXBsb2FkTWVzc2FnZVJlc3BvbnNlEhAKCGluc2VydGVkGAEgASgIEg0KBWZvdW5kGAIgASgIEg8KB2NoYW5nZWQYAyABKAgSLAoHbWVzc2FnZRgEIAEoCzIbLnNlc3Npb25zLnYxLldyaXR0ZW5NZXNzYWdlIlQKFURlbGV0ZU1lc3NhZ2VzUmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhIKCnNlc3Npb25faWQYAiABKAkSEwoLbWVzc2FnZV9pZHMYAyADKAkiLwoWRGVsZXRlTWVzc2FnZXNSZXNwb25zZRIVCg1kZWxldGVkX2NvdW50GAEgASgDIj4KFENsZWFyTWVzc2FnZXNSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkSEgoKc2Vzc2lvbl9pZBgCIAEoCSIuChVDbGVhck1lc3NhZ2VzUmVzcG9uc2USFQoNZGVsZXRlZF9jb3VudBgBIAEoAyKlAQoVSW1wb3J0TWVzc2FnZXNSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkSEgoKc2Vzc2lvbl9pZBgCIAEoCRISCgpqc29uX3BpZWNlGAMgASgJEhMKC21vcmVfcGllY2VzGAQgASgIEhYKCXBhcmVudF9pZBgFIAEoCUgAiAEBEhUKDWNyZWF0ZWRfYXRfbXMYBiABKANCDAoKX3BhcmVudF9pZCJHChZJbXBvcnRNZXNzYWdlc1Jlc3BvbnNlEhYKDmltcG9ydGVkX2NvdW50GAEgASgDEhUKDXNraXBwZWRfY291bnQYAiABKAMigQEKEUdldE1lc3NhZ2VSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkSEgoKc2Vzc2lvbl9pZBgCIAEoCRISCgptZXNzYWdlX2lkGAMgASgJEjAKC2F0dGFjaG1lbnRzGAQgASgOMhsuc2Vzc2lvbnMudjEuQXR0YWNobWVudE1vZGUiPgoSR2V0TWVzc2FnZVJlc3BvbnNlEigKBWZyYW1lGAEgASgLMhkuc2Vzc2lvbnMudjEuTWVzc2FnZUZyYW1lIoMBChJHZXRNZXNzYWdlc1JlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRISCgpzZXNzaW9uX2lkGAIgASgJEhMKC21lc3NhZ2VfaWRzGAMgAygJEjAKC2F0dGFjaG1lbnRzGAQgASgOMhsuc2Vzc2lvbnMudjEuQXR0YWNobWVudE1vZGUiPwoTR2V0TWVzc2FnZXNSZXNwb25zZRIoCgVmcmFtZRgBIAEoCzIZLnNlc3Npb25zLnYxLk1lc3NhZ2VGcmFtZSJwChRHZXRMYXRlc3RMZWFmUmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhIKCnNlc3Npb25faWQYAiABKAkSMAoLYXR0YWNobWVudHMYAyABKA4yGy5zZXNzaW9ucy52MS5BdHRhY2htZW50TW9kZSJBChVHZXRMYXRlc3RMZWFmUmVzcG9uc2USKAoFZnJhbWUYASABKAsyGS5zZXNzaW9ucy52MS5NZXNzYWdlRnJhbWUiggEKEkdldEJyYW5jaGVzUmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhIKCnNlc3Npb25faWQYAiABKAkSEgoKbWVzc2FnZV9pZBgDIAEoCRIwCgthdHRhY2htZW50cxgEIAEoDjIbLnNlc3Npb25zLnYxLkF0dGFjaG1lbnRNb2RlIj8KE0dldEJyYW5jaGVzUmVzcG9uc2USKAoFZnJhbWUYASABKAsyGS5zZXNzaW9ucy52MS5NZXNzYWdlRnJhbWUixAEKFFN0cmVhbUhpc3RvcnlSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkSEgoKc2Vzc2lvbl9pZBgCIAEoCRIPCgdsZWFmX2lkGAMgASgJEhQKDG5ld2VzdF9maXJzdBgEIAEoCBISCgpiYXRjaF9zaXplGAUgASgNEhcKD21heF9iYXRjaF9ieXRlcxgGIAEoBBIwCgthdHRhY2htZW50cxgHIAEoDjIbLnNlc3Npb25zLnYxLkF0dGFjaG1lbnRNb2RlIlQKFVN0cmVhbUhpc3RvcnlSZXNwb25zZRIoCgVmcmFtZRgBIAEoCzIZLnNlc3Npb25zLnYxLk1lc3NhZ2VGcmFtZRIRCgliYXRjaF9lbmQYAiABKAginwEKF0dldFJlY2VudEhpc3RvcnlSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkSEgoKc2Vzc2lvbl9pZBgCIAEoCRIZChFtYXhfY29udGVudF9ieXRlcxgDIAEoAxIPCgdsZWFmX2lkGAQgASgJEjAKC2F0dGFjaG1lbnRzGAUgASgOMhsuc2Vzc2lvbnMudjEuQXR0YWNobWVudE1vZGUiRgoUUmVjZW50SGlzdG9yeVN1bW1hcnkSEQoJdHJ1bmNhdGVkGAEgASgIEhsKE3RvdGFsX2NvbnRlbnRfYnl0ZXMYAiABKAMieAoYR2V0UmVjZW50SGlzdG9yeVJlc3BvbnNlEjIKB3N1bW1hcnkYASABKAsyIS5zZXNzaW9ucy52MS5SZWNlbnRIaXN0b3J5U3VtbWFyeRIoCgVmcmFtZRgCIAEoCzIZLnNlc3Npb25zLnYxLk1lc3NhZ2VGcmFtZSJUChlHZXRIaXN0b3J5Um93U3RhdHNSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkSEgoKc2Vzc2lvbl9pZBgCIAEoCRIPCgdsZWFmX2lkGAMgASgJIkoKB1Jvd1N0YXQSCgoCaWQYASABKAkSDAoEcm9sZRgCIAEoCRINCgVieXRlcxgDIAEoAxIWCg50b2tlbl9lc3RpbWF0ZRgEIAEoAyJBChpHZXRIaXN0b3J5Um93U3RhdHNSZXNwb25zZRIjCgVzdGF0cxgBIAMoCzIULnNlc3Npb25zLnYxLlJvd1N0YXQiOQoVUmVhZEF0dGFjaG1lbnRSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkSDAoEaGFzaBgCIAEoCSJOChZSZWFkQXR0YWNobWVudFJlc3BvbnNlEhIKCm1lZGlhX3R5cGUYASABKAkSEgoKc2l6ZV9ieXRlcxgCIAEoAxIMCgRkYXRhGAMgASgMIn0KCkNvbXBhY3Rpb24SCgoCaWQYASABKAkSCwoDc2VxGAIgASgDEg8KB3N1bW1hcnkYAyABKAkSFwoPZnJvbV9tZXNzYWdlX2lkGAQgASgJEhUKDXRvX21lc3NhZ2VfaWQYBSABKAkSFQoNY3JlYXRlZF9hdF9tcxgGIAEoAyJ/ChRBZGRDb21wYWN0aW9uUmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhIKCnNlc3Npb25faWQYAiABKAkSDwoHc3VtbWFyeRgDIAEoCRIXCg9mcm9tX21lc3NhZ2VfaWQYBCABKAkSFQoNdG9fbWVzc2FnZV9pZBgFIAEoCSJEChVBZGRDb21wYWN0aW9uUmVzcG9uc2USKwoKY29tcGFjdGlvbhgBIAEoCzIXLnNlc3Npb25zLnYxLkNvbXBhY3Rpb24iQAoWTGlzdENvbXBhY3Rpb25zUmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhIKCnNlc3Npb25faWQYAiABKAkiRwoXTGlzdENvbXBhY3Rpb25zUmVzcG9uc2USLAoLY29tcGFjdGlvbnMYASADKAsyFy5zZXNzaW9ucy52MS5Db21wYWN0aW9uImwKFVBsYW5Db21wYWN0aW9uUmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhIKCnNlc3Npb25faWQYAiABKAkSDwoHbGVhZl9pZBgDIAEoCRIaChJrZWVwX3JlY2VudF90b2tlbnMYBCABKAMigAEKFlBsYW5Db21wYWN0aW9uUmVzcG9uc2USDwoHcGxhbm5lZBgBIAEoCBIXCg9mcm9tX21lc3NhZ2VfaWQYAiABKAkSFQoNdG9fbWVzc2FnZV9pZBgDIAEoCRIOCgZwcm9tcHQYBCABKAkSFQoNYnVkZ2V0X3Rva2VucxgFIAEoAyJJCg5Db21wYWN0UmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhIKCnNlc3Npb25faWQYAiABKAkSDwoHbGVhZl9pZBgDIAEoCSJRCg9Db21wYWN0UmVzcG9uc2USEQoJY29tcGFjdGVkGAEgASgIEisKCmNvbXBhY3Rpb24YAiABKAsyFy5zZXNzaW9ucy52MS5Db21wYWN0aW9uIkgKEENvbXBhY3Rpb25Qb2xpY3kSGAoQdGhyZXNob2xkX3Rva2VucxgBIAEoAxIaChJrZWVwX3JlY2VudF90b2tlbnMYAiABKAMicwoaU2V0Q29tcGFjdGlvblBvbGljeVJlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRISCgpzZXNzaW9uX2lkGAIgASgJEi0KBnBvbGljeRgDIAEoCzIdLnNlc3Npb25zLnYxLkNvbXBhY3Rpb25Qb2xpY3kiTAobU2V0Q29tcGFjdGlvblBvbGljeVJlc3BvbnNlEi0KBnBvbGljeRgBIAEoCzIdLnNlc3Npb25zLnYxLkNvbXBhY3Rpb25Qb2xpY3kiRAoaR2V0Q29tcGFjdGlvblBvbGljeVJlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRISCgpzZXNzaW9uX2lkGAIgASgJIkwKG0dldENvbXBhY3Rpb25Qb2xpY3lSZXNwb25zZRItCgZwb2xpY3kYASABKAsyHS5zZXNzaW9ucy52MS5Db21wYWN0aW9uUG9saWN5IpoBChVTZWFyY2hNZXNzYWdlc1JlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRISCgpzZXNzaW9uX2lkGAIgASgJEg0KBXF1ZXJ5GAMgASgJEg0KBWxpbWl0GAQgASgFEiUKBG1vZGUYBSABKA4yFy5zZXNzaW9ucy52MS5TZWFyY2hNb2RlEhQKDGFsbF9zZXNzaW9ucxgGIAEoCCJsChZTZWFyY2hNZXNzYWdlc1Jlc3BvbnNlEgoKAmlkGAEgASgJEgwKBHJvbGUYAiABKAkSEgoKc2Vzc2lvbl9pZBgDIAEoCRIPCgdjb250ZW50GAQgASgJEhMKC21vcmVfcGllY2VzGAUgASgIIp8BChBTdWJzY3JpYmVSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkSFwoKc2Vzc2lvbl9pZBgCIAEoCUgAiAEBEh0KFXJlc3VtZV9hZnRlcl9yZXZpc2lvbhgDIAEoBBIwCgthdHRhY2htZW50cxgEIAEoDjIbLnNlc3Npb25zLnYxLkF0dGFjaG1lbnRNb2RlQg0KC19zZXNzaW9uX2lkIrACChFTdWJzY3JpYmVSZXNwb25zZRIQCghyZXZpc2lvbhgBIAEoBBIlCgR0eXBlGAIgASgOMhcuc2Vzc2lvbnMudjEuQ2hhbmdlVHlwZRISCgpzZXNzaW9uX2lkGAMgASgJEioKB21lc3NhZ2UYBCABKAsyGS5zZXNzaW9ucy52MS5NZXNzYWdlRnJhbWUSEAoIaW5zZXJ0ZWQYBSABKAgSLAoLcGFyZW50X21vZGUYBiABKA4yFy5zZXNzaW9ucy52MS5QYXJlbnRNb2RlEhEKCXBhcmVudF9pZBgHIAEoCRITCgttZXNzYWdlX2lkcxgIIAMoCRIrCgpjb21wYWN0aW9uGAkgASgLMhcuc2Vzc2lvbnMudjEuQ29tcGFjdGlvbhINCgVlcnJvchgKIAEoCSIpChNMaXN0U2Vzc2lvbnNSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkiOwoOU2Vzc2lvblN1bW1hcnkSEgoKc2Vzc2lvbl9pZBgBIAEoCRIVCg1tZXNzYWdlX2NvdW50GAIgASgDIkUKFExpc3RTZXNzaW9uc1Jlc3BvbnNlEi0KCHNlc3Npb25zGAEgAygLMhsuc2Vzc2lvbnMudjEuU2Vzc2lvblN1bW1hcnkiKwoVR2V0T2JqZWN0U3RhdHNSZXF1ZXN0EhIKCm9iamVjdF9rZXkYASABKAkivAEKFkdldE9iamVjdFN0YXRzUmVzcG9uc2USEgoKZmlsZV9ieXRlcxgBIAEoAxIUCgxtZXNzYWdlX3Jvd3MYAiABKAMSGQoRY29udGludWF0aW9uX3Jvd3MYAyABKAMSGAoQYXR0YWNobWVudF9jb3VudBgEIAEoAxIYChBhdHRhY2htZW50X2J5dGVzGAUgASgDEhIKCnJvd193cml0ZXMYBiABKAMSFQoNc2Vzc2lvbl9jb3VudBgHIAEoAyI7ChJMaXN0T2JqZWN0c1JlcXVlc3QSEQoJcGFnZV9zaXplGAEgASgFEhIKCnBhZ2VfdG9rZW4YAiABKAkiQwoTTGlzdE9iamVjdHNSZXNwb25zZRITCgtvYmplY3Rfa2V5cxgBIAMoCRIXCg9uZXh0X3BhZ2VfdG9rZW4YAiABKAkiVwoTRXhwb3J0T2JqZWN0UmVxdWVzdBISCgpvYmplY3Rfa2V5GAEgASgJEhUKDWxvY2tfZm9yX21vdmUYAiABKAgSFQoNbGVhc2Vfc2Vjb25kcxgDIAEoBSJIChRFeHBvcnRPYmplY3RSZXNwb25zZRISCgpzaXplX2J5dGVzGAEgASgDEgwKBGRhdGEYAiABKAwSDgoGc2hhMjU2GAMgASgJIlgKE0ltcG9ydE9iamVjdFJlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRIPCgdyZXBsYWNlGAIgASgIEgwKBGRhdGEYAyABKAwSDgoGc2hhMjU2GAQgASgJIkAKFEltcG9ydE9iamVjdFJlc3BvbnNlEhIKCnNpemVfYnl0ZXMYASABKAMSFAoMbWVzc2FnZV9yb3dzGAIgASgDIjsKE0RlbGV0ZU9iamVjdFJlcXVlc3QSEgoKb2JqZWN0X2tleRgBIAEoCRIQCghtb3ZlZF90bxgCIAEoCSInChREZWxldGVPYmplY3RSZXNwb25zZRIPCgdkZWxldGVkGAEgASgIKmoKDkF0dGFjaG1lbnRNb2RlEh8KG0FUVEFDSE1FTlRfTU9ERV9VTlNQRUNJRklFRBAAEhoKFkFUVEFDSE1FTlRfTU9ERV9JTkxJTkUQARIbChdBVFRBQ0hNRU5UX01PREVfUE9JTlRFUhACKmkKClBhcmVudE1vZGUSGwoXUEFSRU5UX01PREVfVU5TUEVDSUZJRUQQABIUChBQQVJFTlRfTU9ERV9BVVRPEAESFAoQUEFSRU5UX01PREVfUk9PVBACEhIKDlBBUkVOVF9NT0RFX0lEEAMqRgoGU291cmNlEhYKElNPVVJDRV9VTlNQRUNJRklFRBAAEhEKDVNPVVJDRV9TRVJWRVIQARIRCg1TT1VSQ0VfQ0xJRU5UEAIq+wQKC0Vycm9yUmVhc29uEhwKGEVSUk9SX1JFQVNPTl9VTlNQRUNJRklFRBAAEh0KGUVSUk9SX1JFQVNPTl9JTlZBTElEX0pTT04QARIgChxFUlJPUl9SRUFTT05fSU5WQUxJRF9NRVNTQUdFEAISIwofRVJST1JfUkVBU09OX0lOVkFMSURfT0JKRUNUX0tFWRADEh4KGkVSUk9SX1JFQVNPTl9JTlZBTElEX0ZJRUxEEAQSJAogRVJST1JfUkVBU09OX09CSkVDVF9LRVlfTUlTTUFUQ0gQBRIfChtFUlJPUl9SRUFTT05fSU5WQUxJRF9TVFJFQU0QBhIZChVFUlJPUl9SRUFTT05fRFJBSU5JTkcQBxIgChxFUlJPUl9SRUFTT05fU1RPUkFHRV9GQUlMVVJFEAgSHwobRVJST1JfUkVBU09OX0xJTUlUX0VYQ0VFREVEEAkSHQoZRVJST1JfUkVBU09OX1NUT1JBR0VfRlVMTBAKEhoKFkVSUk9SX1JFQVNPTl9OT1RfRk9VTkQQCxIeChpFUlJPUl9SRUFTT05fTk9fU1VNTUFSSVpFUhAMEiAKHEVSUk9SX1JFQVNPTl9VTkFVVEhFTlRJQ0FURUQQDRIiCh5FUlJPUl9SRUFTT05fUEVSTUlTU0lPTl9ERU5JRUQQDhIZChVFUlJPUl9SRUFTT05fSU5URVJOQUwQDxIkCiBFUlJPUl9SRUFTT05fRkFJTEVEX1BSRUNPTkRJVElPThAQEiEKHUVSUk9SX1JFQVNPTl9PQkpFQ1RfTk9UX09XTkVEEBESHgoaRVJST1JfUkVBU09OX09CSkVDVF9NT1ZJTkcQEiqKAQoPVXBsb2FkT3BlcmF0aW9uEiAKHFVQTE9BRF9PUEVSQVRJT05fVU5TUEVDSUZJRUQQABIbChdVUExPQURfT1BFUkFUSU9OX0FQUEVORBABEhsKF1VQTE9BRF9PUEVSQVRJT05fVVBEQVRFEAISGwoXVVBMT0FEX09QRVJBVElPTl9VUFNFUlQQAypcCgpTZWFyY2hNb2RlEhsKF1NFQVJDSF9NT0RFX1VOU1BFQ0lGSUVEEAASFgoSU0VBUkNIX01PREVfUEhSQVNFEAESGQoVU0VBUkNIX01PREVfQUxMX1dPUkRTEAIqqAIKCkNoYW5nZVR5cGUSGwoXQ0hBTkdFX1RZUEVfVU5TUEVDSUZJRUQQABIWChJDSEFOR0VfVFlQRV9BUFBFTkQQARIWChJDSEFOR0VfVFlQRV9VUERBVEUQAhIWChJDSEFOR0VfVFlQRV9ERUxFVEUQAxIVChFDSEFOR0VfVFlQRV9DTEVBUhAEEhcKE0NIQU5HRV9UWVBFX0NPTVBBQ1QQBRIaChZDSEFOR0VfVFlQRV9DT01QQUNUSU9OEAYSFgoSQ0hBTkdFX1RZUEVfSU1QT1JUEAcSIAocQ0hBTkdFX1RZUEVfQ09NUEFDVElPTl9FUlJPUhAIEhUKEUNIQU5HRV9UWVBFX1JFU0VUEAkSGAoUQ0hBTkdFX1RZUEVfUFJPR1JFU1MQCjKOFQoOU2Vzc2lvblNlcnZpY2USVgoNQXBwZW5kTWVzc2FnZRIhLnNlc3Npb25zLnYxLkFwcGVuZE1lc3NhZ2VSZXF1ZXN0GiIuc2Vzc2lvbnMudjEuQXBwZW5kTWVzc2FnZVJlc3BvbnNlElkKDkFwcGVuZE1lc3NhZ2VzEiIuc2Vzc2lvbnMudjEuQXBwZW5kTWVzc2FnZXNSZXF1ZXN0GiMuc2Vzc2lvbnMudjEuQXBwZW5kTWVzc2FnZXNSZXNwb25zZRJWCg1VcGRhdGVNZXNzYWdlEiEuc2Vzc2lvbnMudjEuVXBkYXRlTWVzc2FnZVJlcXVlc3QaIi5zZXNzaW9ucy52MS5VcGRhdGVNZXNzYWdlUmVzcG9uc2USVgoNVXBzZXJ0TWVzc2FnZRIhLnNlc3Npb25zLnYxLlVwc2VydE1lc3NhZ2VSZXF1ZXN0GiIuc2Vzc2lvbnMudjEuVXBzZXJ0TWVzc2FnZVJlc3BvbnNlElgKDVVwbG9hZE1lc3NhZ2USIS5zZXNzaW9ucy52MS5VcGxvYWRNZXNzYWdlUmVxdWVzdBoiLnNlc3Npb25zLnYxLlVwbG9hZE1lc3NhZ2VSZXNwb25zZSgBElkKDkRlbGV0ZU1lc3NhZ2VzEiIuc2Vzc2lvbnMudjEuRGVsZXRlTWVzc2FnZXNSZXF1ZXN0GiMuc2Vzc2lvbnMudjEuRGVsZXRlTWVzc2FnZXNSZXNwb25zZRJWCg1DbGVhck1lc3NhZ2VzEiEuc2Vzc2lvbnMudjEuQ2xlYXJNZXNzYWdlc1JlcXVlc3QaIi5zZXNzaW9ucy52MS5DbGVhck1lc3NhZ2VzUmVzcG9uc2USWwoOSW1wb3J0TWVzc2FnZXMSIi5zZXNzaW9ucy52MS5JbXBvcnRNZXNzYWdlc1JlcXVlc3QaIy5zZXNzaW9ucy52MS5JbXBvcnRNZXNzYWdlc1Jlc3BvbnNlKAESTwoKR2V0TWVzc2FnZRIeLnNlc3Npb25zLnYxLkdldE1lc3NhZ2VSZXF1ZXN0Gh8uc2Vzc2lvbnMudjEuR2V0TWVzc2FnZVJlc3BvbnNlMAESUgoLR2V0TWVzc2FnZXMSHy5zZXNzaW9ucy52MS5HZXRNZXNzYWdlc1JlcXVlc3QaIC5zZXNzaW9ucy52MS5HZXRNZXNzYWdlc1Jlc3BvbnNlMAESWAoNR2V0TGF0ZXN0TGVhZhIhLnNlc3Npb25zLnYxLkdldExhdGVzdExlYWZSZXF1ZXN0GiIuc2Vzc2lvbnMudjEuR2V0TGF0ZXN0TGVhZlJlc3BvbnNlMAESUgoLR2V0QnJhbmNoZXMSHy5zZXNzaW9ucy52MS5HZXRCcmFuY2hlc1JlcXVlc3QaIC5zZXNzaW9ucy52MS5HZXRCcmFuY2hlc1Jlc3BvbnNlMAESWAoNU3RyZWFtSGlzdG9yeRIhLnNlc3Npb25zLnYxLlN0cmVhbUhpc3RvcnlSZXF1ZXN0GiIuc2Vzc2lvbnMudjEuU3RyZWFtSGlzdG9yeVJlc3BvbnNlMAESYQoQR2V0UmVjZW50SGlzdG9yeRIkLnNlc3Npb25zLnYxLkdldFJlY2VudEhpc3RvcnlSZXF1ZXN0GiUuc2Vzc2lvbnMudjEuR2V0UmVjZW50SGlzdG9yeVJlc3BvbnNlMAESZwoSR2V0SGlzdG9yeVJvd1N0YXRzEiYuc2Vzc2lvbnMudjEuR2V0SGlzdG9yeVJvd1N0YXRzUmVxdWVzdBonLnNlc3Npb25zLnYxLkdldEhpc3RvcnlSb3dTdGF0c1Jlc3BvbnNlMAESWwoOUmVhZEF0dGFjaG1lbnQSIi5zZXNzaW9ucy52MS5SZWFkQXR0YWNobWVudFJlcXVlc3QaIy5zZXNzaW9ucy52MS5SZWFkQXR0YWNobWVudFJlc3BvbnNlMAESVgoNQWRkQ29tcGFjdGlvbhIhLnNlc3Npb25zLnYxLkFkZENvbXBhY3Rpb25SZXF1ZXN0GiIuc2Vzc2lvbnMudjEuQWRkQ29tcGFjdGlvblJlc3BvbnNlElwKD0xpc3RDb21wYWN0aW9ucxIjLnNlc3Npb25zLnYxLkxpc3RDb21wYWN0aW9uc1JlcXVlc3QaJC5zZXNzaW9ucy52MS5MaXN0Q29tcGFjdGlvbnNSZXNwb25zZRJZCg5QbGFuQ29tcGFjdGlvbhIiLnNlc3Npb25zLnYxLlBsYW5Db21wYWN0aW9uUmVxdWVzdBojLnNlc3Npb25zLnYxLlBsYW5Db21wYWN0aW9uUmVzcG9uc2USRAoHQ29tcGFjdBIbLnNlc3Npb25zLnYxLkNvbXBhY3RSZXF1ZXN0Ghwuc2Vzc2lvbnMudjEuQ29tcGFjdFJlc3BvbnNlEmgKE1NldENvbXBhY3Rpb25Qb2xpY3kSJy5zZXNzaW9ucy52MS5TZXRDb21wYWN0aW9uUG9saWN5UmVxdWVzdBooLnNlc3Npb25zLnYxLlNldENvbXBhY3Rpb25Qb2xpY3lSZXNwb25zZRJoChNHZXRDb21wYWN0aW9uUG9saWN5Eicuc2Vzc2lvbnMudjEuR2V0Q29tcGFjdGlvblBvbGljeVJlcXVlc3QaKC5zZXNzaW9ucy52MS5HZXRDb21wYWN0aW9uUG9saWN5UmVzcG9uc2USWwoOU2VhcmNoTWVzc2FnZXMSIi5zZXNzaW9ucy52MS5TZWFyY2hNZXNzYWdlc1JlcXVlc3QaIy5zZXNzaW9ucy52MS5TZWFyY2hNZXNzYWdlc1Jlc3BvbnNlMAESTAoJU3Vic2NyaWJlEh0uc2Vzc2lvbnMudjEuU3Vic2NyaWJlUmVxdWVzdBoeLnNlc3Npb25zLnYxLlN1YnNjcmliZVJlc3BvbnNlMAESUwoMTGlzdFNlc3Npb25zEiAuc2Vzc2lvbnMudjEuTGlzdFNlc3Npb25zUmVxdWVzdBohLnNlc3Npb25zLnYxLkxpc3RTZXNzaW9uc1Jlc3BvbnNlElkKDkdldE9iamVjdFN0YXRzEiIuc2Vzc2lvbnMudjEuR2V0T2JqZWN0U3RhdHNSZXF1ZXN0GiMuc2Vzc2lvbnMudjEuR2V0T2JqZWN0U3RhdHNSZXNwb25zZRJQCgtMaXN0T2JqZWN0cxIfLnNlc3Npb25zLnYxLkxpc3RPYmplY3RzUmVxdWVzdBogLnNlc3Npb25zLnYxLkxpc3RPYmplY3RzUmVzcG9uc2USVQoMRXhwb3J0T2JqZWN0EiAuc2Vzc2lvbnMudjEuRXhwb3J0T2JqZWN0UmVxdWVzdBohLnNlc3Npb25zLnYxLkV4cG9ydE9iamVjdFJlc3BvbnNlMAESVQoMSW1wb3J0T2JqZWN0EiAuc2Vzc2lvbnMudjEuSW1wb3J0T2JqZWN0UmVxdWVzdBohLnNlc3Npb25zLnYxLkltcG9ydE9iamVjdFJlc3BvbnNlKAESUwoMRGVsZXRlT2JqZWN0EiAuc2Vzc2lvbnMudjEuRGVsZXRlT2JqZWN0UmVxdWVzdBohLnNlc3Npb25zLnYxLkRlbGV0ZU9iamVjdFJlc3BvbnNlYgZwcm90bzM");
/**
 * Describes the message sessions.v1.MessageInfo.
 * Use `create(MessageInfoSchema)` to create a new message.
 */
export const MessageInfoSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 0);
/**
 * Describes the message sessions.v1.MessageFrame.
 * Use `create(MessageFrameSchema)` to create a new message.
 */
export const MessageFrameSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 1);
/**
 * Describes the message sessions.v1.WrittenMessage.
 * Use `create(WrittenMessageSchema)` to create a new message.
 */
export const WrittenMessageSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 2);
/**
 * Describes the message sessions.v1.AppendResult.
 * Use `create(AppendResultSchema)` to create a new message.
 */
export const AppendResultSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 3);
/**
 * Describes the message sessions.v1.AppendMessageRequest.
 * Use `create(AppendMessageRequestSchema)` to create a new message.
 */
export const AppendMessageRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 4);
/**
 * Describes the message sessions.v1.AppendMessageResponse.
 * Use `create(AppendMessageResponseSchema)` to create a new message.
 */
export const AppendMessageResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 5);
/**
 * Describes the message sessions.v1.AppendItem.
 * Use `create(AppendItemSchema)` to create a new message.
 */
export const AppendItemSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 6);
/**
 * Describes the message sessions.v1.AppendMessagesRequest.
 * Use `create(AppendMessagesRequestSchema)` to create a new message.
 */
export const AppendMessagesRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 7);
/**
 * Describes the message sessions.v1.AppendMessagesResponse.
 * Use `create(AppendMessagesResponseSchema)` to create a new message.
 */
export const AppendMessagesResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 8);
/**
 * Describes the message sessions.v1.UpdateMessageRequest.
 * Use `create(UpdateMessageRequestSchema)` to create a new message.
 */
export const UpdateMessageRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 9);
/**
 * Describes the message sessions.v1.UpdateMessageResponse.
 * Use `create(UpdateMessageResponseSchema)` to create a new message.
 */
export const UpdateMessageResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 10);
/**
 * Describes the message sessions.v1.UpsertMessageRequest.
 * Use `create(UpsertMessageRequestSchema)` to create a new message.
 */
export const UpsertMessageRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 11);
/**
 * Describes the message sessions.v1.UpsertMessageResponse.
 * Use `create(UpsertMessageResponseSchema)` to create a new message.
 */
export const UpsertMessageResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 12);
/**
 * Describes the message sessions.v1.UploadHeader.
 * Use `create(UploadHeaderSchema)` to create a new message.
 */
export const UploadHeaderSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 13);
/**
 * Describes the message sessions.v1.UploadMessageRequest.
 * Use `create(UploadMessageRequestSchema)` to create a new message.
 */
export const UploadMessageRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 14);
/**
 * Describes the message sessions.v1.UploadMessageResponse.
 * Use `create(UploadMessageResponseSchema)` to create a new message.
 */
export const UploadMessageResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 15);
/**
 * Describes the message sessions.v1.DeleteMessagesRequest.
 * Use `create(DeleteMessagesRequestSchema)` to create a new message.
 */
export const DeleteMessagesRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 16);
/**
 * Describes the message sessions.v1.DeleteMessagesResponse.
 * Use `create(DeleteMessagesResponseSchema)` to create a new message.
 */
export const DeleteMessagesResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 17);
/**
 * Describes the message sessions.v1.ClearMessagesRequest.
 * Use `create(ClearMessagesRequestSchema)` to create a new message.
 */
export const ClearMessagesRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 18);
/**
 * Describes the message sessions.v1.ClearMessagesResponse.
 * Use `create(ClearMessagesResponseSchema)` to create a new message.
 */
export const ClearMessagesResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 19);
/**
 * Describes the message sessions.v1.ImportMessagesRequest.
 * Use `create(ImportMessagesRequestSchema)` to create a new message.
 */
export const ImportMessagesRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 20);
/**
 * Describes the message sessions.v1.ImportMessagesResponse.
 * Use `create(ImportMessagesResponseSchema)` to create a new message.
 */
export const ImportMessagesResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 21);
/**
 * Describes the message sessions.v1.GetMessageRequest.
 * Use `create(GetMessageRequestSchema)` to create a new message.
 */
export const GetMessageRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 22);
/**
 * Describes the message sessions.v1.GetMessageResponse.
 * Use `create(GetMessageResponseSchema)` to create a new message.
 */
export const GetMessageResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 23);
/**
 * Describes the message sessions.v1.GetMessagesRequest.
 * Use `create(GetMessagesRequestSchema)` to create a new message.
 */
export const GetMessagesRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 24);
/**
 * Describes the message sessions.v1.GetMessagesResponse.
 * Use `create(GetMessagesResponseSchema)` to create a new message.
 */
export const GetMessagesResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 25);
/**
 * Describes the message sessions.v1.GetLatestLeafRequest.
 * Use `create(GetLatestLeafRequestSchema)` to create a new message.
 */
export const GetLatestLeafRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 26);
/**
 * Describes the message sessions.v1.GetLatestLeafResponse.
 * Use `create(GetLatestLeafResponseSchema)` to create a new message.
 */
export const GetLatestLeafResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 27);
/**
 * Describes the message sessions.v1.GetBranchesRequest.
 * Use `create(GetBranchesRequestSchema)` to create a new message.
 */
export const GetBranchesRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 28);
/**
 * Describes the message sessions.v1.GetBranchesResponse.
 * Use `create(GetBranchesResponseSchema)` to create a new message.
 */
export const GetBranchesResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 29);
/**
 * Describes the message sessions.v1.StreamHistoryRequest.
 * Use `create(StreamHistoryRequestSchema)` to create a new message.
 */
export const StreamHistoryRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 30);
/**
 * Describes the message sessions.v1.StreamHistoryResponse.
 * Use `create(StreamHistoryResponseSchema)` to create a new message.
 */
export const StreamHistoryResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 31);
/**
 * Describes the message sessions.v1.GetRecentHistoryRequest.
 * Use `create(GetRecentHistoryRequestSchema)` to create a new message.
 */
export const GetRecentHistoryRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 32);
/**
 * Describes the message sessions.v1.RecentHistorySummary.
 * Use `create(RecentHistorySummarySchema)` to create a new message.
 */
export const RecentHistorySummarySchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 33);
/**
 * Describes the message sessions.v1.GetRecentHistoryResponse.
 * Use `create(GetRecentHistoryResponseSchema)` to create a new message.
 */
export const GetRecentHistoryResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 34);
/**
 * Describes the message sessions.v1.GetHistoryRowStatsRequest.
 * Use `create(GetHistoryRowStatsRequestSchema)` to create a new message.
 */
export const GetHistoryRowStatsRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 35);
/**
 * Describes the message sessions.v1.RowStat.
 * Use `create(RowStatSchema)` to create a new message.
 */
export const RowStatSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 36);
/**
 * Describes the message sessions.v1.GetHistoryRowStatsResponse.
 * Use `create(GetHistoryRowStatsResponseSchema)` to create a new message.
 */
export const GetHistoryRowStatsResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 37);
/**
 * Describes the message sessions.v1.ReadAttachmentRequest.
 * Use `create(ReadAttachmentRequestSchema)` to create a new message.
 */
export const ReadAttachmentRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 38);
/**
 * Describes the message sessions.v1.ReadAttachmentResponse.
 * Use `create(ReadAttachmentResponseSchema)` to create a new message.
 */
export const ReadAttachmentResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 39);
/**
 * Describes the message sessions.v1.Compaction.
 * Use `create(CompactionSchema)` to create a new message.
 */
export const CompactionSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 40);
/**
 * Describes the message sessions.v1.AddCompactionRequest.
 * Use `create(AddCompactionRequestSchema)` to create a new message.
 */
export const AddCompactionRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 41);
/**
 * Describes the message sessions.v1.AddCompactionResponse.
 * Use `create(AddCompactionResponseSchema)` to create a new message.
 */
export const AddCompactionResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 42);
/**
 * Describes the message sessions.v1.ListCompactionsRequest.
 * Use `create(ListCompactionsRequestSchema)` to create a new message.
 */
export const ListCompactionsRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 43);
/**
 * Describes the message sessions.v1.ListCompactionsResponse.
 * Use `create(ListCompactionsResponseSchema)` to create a new message.
 */
export const ListCompactionsResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 44);
/**
 * Describes the message sessions.v1.PlanCompactionRequest.
 * Use `create(PlanCompactionRequestSchema)` to create a new message.
 */
export const PlanCompactionRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 45);
/**
 * Describes the message sessions.v1.PlanCompactionResponse.
 * Use `create(PlanCompactionResponseSchema)` to create a new message.
 */
export const PlanCompactionResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 46);
/**
 * Describes the message sessions.v1.CompactRequest.
 * Use `create(CompactRequestSchema)` to create a new message.
 */
export const CompactRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 47);
/**
 * Describes the message sessions.v1.CompactResponse.
 * Use `create(CompactResponseSchema)` to create a new message.
 */
export const CompactResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 48);
/**
 * Describes the message sessions.v1.CompactionPolicy.
 * Use `create(CompactionPolicySchema)` to create a new message.
 */
export const CompactionPolicySchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 49);
/**
 * Describes the message sessions.v1.SetCompactionPolicyRequest.
 * Use `create(SetCompactionPolicyRequestSchema)` to create a new message.
 */
export const SetCompactionPolicyRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 50);
/**
 * Describes the message sessions.v1.SetCompactionPolicyResponse.
 * Use `create(SetCompactionPolicyResponseSchema)` to create a new message.
 */
export const SetCompactionPolicyResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 51);
/**
 * Describes the message sessions.v1.GetCompactionPolicyRequest.
 * Use `create(GetCompactionPolicyRequestSchema)` to create a new message.
 */
export const GetCompactionPolicyRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 52);
/**
 * Describes the message sessions.v1.GetCompactionPolicyResponse.
 * Use `create(GetCompactionPolicyResponseSchema)` to create a new message.
 */
export const GetCompactionPolicyResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 53);
/**
 * Describes the message sessions.v1.SearchMessagesRequest.
 * Use `create(SearchMessagesRequestSchema)` to create a new message.
 */
export const SearchMessagesRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 54);
/**
 * Describes the message sessions.v1.SearchMessagesResponse.
 * Use `create(SearchMessagesResponseSchema)` to create a new message.
 */
export const SearchMessagesResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 55);
/**
 * Describes the message sessions.v1.SubscribeRequest.
 * Use `create(SubscribeRequestSchema)` to create a new message.
 */
export const SubscribeRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 56);
/**
 * Describes the message sessions.v1.SubscribeResponse.
 * Use `create(SubscribeResponseSchema)` to create a new message.
 */
export const SubscribeResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 57);
/**
 * Describes the message sessions.v1.ListSessionsRequest.
 * Use `create(ListSessionsRequestSchema)` to create a new message.
 */
export const ListSessionsRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 58);
/**
 * Describes the message sessions.v1.SessionSummary.
 * Use `create(SessionSummarySchema)` to create a new message.
 */
export const SessionSummarySchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 59);
/**
 * Describes the message sessions.v1.ListSessionsResponse.
 * Use `create(ListSessionsResponseSchema)` to create a new message.
 */
export const ListSessionsResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 60);
/**
 * Describes the message sessions.v1.GetObjectStatsRequest.
 * Use `create(GetObjectStatsRequestSchema)` to create a new message.
 */
export const GetObjectStatsRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 61);
/**
 * Describes the message sessions.v1.GetObjectStatsResponse.
 * Use `create(GetObjectStatsResponseSchema)` to create a new message.
 */
export const GetObjectStatsResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 62);
/**
 * Describes the message sessions.v1.ListObjectsRequest.
 * Use `create(ListObjectsRequestSchema)` to create a new message.
 */
export const ListObjectsRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 63);
/**
 * Describes the message sessions.v1.ListObjectsResponse.
 * Use `create(ListObjectsResponseSchema)` to create a new message.
 */
export const ListObjectsResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 64);
/**
 * Describes the message sessions.v1.ExportObjectRequest.
 * Use `create(ExportObjectRequestSchema)` to create a new message.
 */
export const ExportObjectRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 65);
/**
 * Describes the message sessions.v1.ExportObjectResponse.
 * Use `create(ExportObjectResponseSchema)` to create a new message.
 */
export const ExportObjectResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 66);
/**
 * Describes the message sessions.v1.ImportObjectRequest.
 * Use `create(ImportObjectRequestSchema)` to create a new message.
 */
export const ImportObjectRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 67);
/**
 * Describes the message sessions.v1.ImportObjectResponse.
 * Use `create(ImportObjectResponseSchema)` to create a new message.
 */
export const ImportObjectResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 68);
/**
 * Describes the message sessions.v1.DeleteObjectRequest.
 * Use `create(DeleteObjectRequestSchema)` to create a new message.
 */
export const DeleteObjectRequestSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 69);
/**
 * Describes the message sessions.v1.DeleteObjectResponse.
 * Use `create(DeleteObjectResponseSchema)` to create a new message.
 */
export const DeleteObjectResponseSchema = /*@__PURE__*/ messageDesc(file_sessions_v1_sessions, 70);
/**
 * How reads return inline media that is stored as an attachment.
 *
 * @generated from enum sessions.v1.AttachmentMode
 */
export var AttachmentMode;
(function (AttachmentMode) {
    /**
     * Same as INLINE.
     *
     * @generated from enum value: ATTACHMENT_MODE_UNSPECIFIED = 0;
     */
    AttachmentMode[AttachmentMode["UNSPECIFIED"] = 0] = "UNSPECIFIED";
    /**
     * Payloads are restored into the message exactly as upstream's reads restore them.
     *
     * @generated from enum value: ATTACHMENT_MODE_INLINE = 1;
     */
    AttachmentMode[AttachmentMode["INLINE"] = 1] = "INLINE";
    /**
     * Payloads stay `attachment:sha256:<hex>` pointers; fetch them with ReadAttachment.
     *
     * @generated from enum value: ATTACHMENT_MODE_POINTER = 2;
     */
    AttachmentMode[AttachmentMode["POINTER"] = 2] = "POINTER";
})(AttachmentMode || (AttachmentMode = {}));
/**
 * Describes the enum sessions.v1.AttachmentMode.
 */
export const AttachmentModeSchema = /*@__PURE__*/ enumDesc(file_sessions_v1_sessions, 0);
/**
 * Where an appended message attaches in the tree.
 *
 * @generated from enum sessions.v1.ParentMode
 */
export var ParentMode;
(function (ParentMode) {
    /**
     * AUTO, unless `parent_id` is non-empty, in which case ID.
     *
     * @generated from enum value: PARENT_MODE_UNSPECIFIED = 0;
     */
    ParentMode[ParentMode["UNSPECIFIED"] = 0] = "UNSPECIFIED";
    /**
     * Attach to the session's newest message (a root when the session is empty).
     *
     * @generated from enum value: PARENT_MODE_AUTO = 1;
     */
    ParentMode[ParentMode["AUTO"] = 1] = "AUTO";
    /**
     * Start a new root.
     *
     * @generated from enum value: PARENT_MODE_ROOT = 2;
     */
    ParentMode[ParentMode["ROOT"] = 2] = "ROOT";
    /**
     * Attach to `parent_id`. An empty, unknown or other-session id makes a root, as upstream does;
     * the response's `info.parent_id` shows which parent was used.
     *
     * @generated from enum value: PARENT_MODE_ID = 3;
     */
    ParentMode[ParentMode["ID"] = 3] = "ID";
})(ParentMode || (ParentMode = {}));
/**
 * Describes the enum sessions.v1.ParentMode.
 */
export const ParentModeSchema = /*@__PURE__*/ enumDesc(file_sessions_v1_sessions, 1);
/**
 * Who produced a message. Client input has the server's reserved metadata keys removed.
 *
 * @generated from enum sessions.v1.Source
 */
export var Source;
(function (Source) {
    /**
     * Same as SERVER.
     *
     * @generated from enum value: SOURCE_UNSPECIFIED = 0;
     */
    Source[Source["UNSPECIFIED"] = 0] = "UNSPECIFIED";
    /**
     * Trusted input from the application itself.
     *
     * @generated from enum value: SOURCE_SERVER = 1;
     */
    Source[Source["SERVER"] = 1] = "SERVER";
    /**
     * Untrusted input: reserved `metadata` keys (server flag --reserved-metadata-key) are removed.
     *
     * @generated from enum value: SOURCE_CLIENT = 2;
     */
    Source[Source["CLIENT"] = 2] = "CLIENT";
})(Source || (Source = {}));
/**
 * Describes the enum sessions.v1.Source.
 */
export const SourceSchema = /*@__PURE__*/ enumDesc(file_sessions_v1_sessions, 2);
/**
 * The reasons found in google.rpc.ErrorInfo.reason (without the ERROR_REASON_ prefix).
 *
 * @generated from enum sessions.v1.ErrorReason
 */
export var ErrorReason;
(function (ErrorReason) {
    /**
     * Not used.
     *
     * @generated from enum value: ERROR_REASON_UNSPECIFIED = 0;
     */
    ErrorReason[ErrorReason["UNSPECIFIED"] = 0] = "UNSPECIFIED";
    /**
     * A message is not valid JSON (metadata: field, detail).
     *
     * @generated from enum value: ERROR_REASON_INVALID_JSON = 1;
     */
    ErrorReason[ErrorReason["INVALID_JSON"] = 1] = "INVALID_JSON";
    /**
     * A JSON value is not a message: it needs a string `id`, a string `role` and an array
     * `parts` of objects with a string `type` (metadata: field, detail).
     *
     * @generated from enum value: ERROR_REASON_INVALID_MESSAGE = 2;
     */
    ErrorReason[ErrorReason["INVALID_MESSAGE"] = 2] = "INVALID_MESSAGE";
    /**
     * The object key is empty, too long, or holds control characters (metadata: limit_bytes).
     *
     * @generated from enum value: ERROR_REASON_INVALID_OBJECT_KEY = 3;
     */
    ErrorReason[ErrorReason["INVALID_OBJECT_KEY"] = 3] = "INVALID_OBJECT_KEY";
    /**
     * Another request field is invalid (metadata: field, detail).
     *
     * @generated from enum value: ERROR_REASON_INVALID_FIELD = 4;
     */
    ErrorReason[ErrorReason["INVALID_FIELD"] = 4] = "INVALID_FIELD";
    /**
     * The x-object-key metadata differs from the request's object_key.
     *
     * @generated from enum value: ERROR_REASON_OBJECT_KEY_MISMATCH = 5;
     */
    ErrorReason[ErrorReason["OBJECT_KEY_MISMATCH"] = 5] = "OBJECT_KEY_MISMATCH";
    /**
     * A client stream is malformed: missing header, unfinished message, mixed objects.
     *
     * @generated from enum value: ERROR_REASON_INVALID_STREAM = 6;
     */
    ErrorReason[ErrorReason["INVALID_STREAM"] = 6] = "INVALID_STREAM";
    /**
     * The server is shutting down; retry on another connection.
     *
     * @generated from enum value: ERROR_REASON_DRAINING = 7;
     */
    ErrorReason[ErrorReason["DRAINING"] = 7] = "DRAINING";
    /**
     * The storage engine failed (disk full, I/O error); nothing was written.
     *
     * @generated from enum value: ERROR_REASON_STORAGE_FAILURE = 8;
     */
    ErrorReason[ErrorReason["STORAGE_FAILURE"] = 8] = "STORAGE_FAILURE";
    /**
     * A configured limit was exceeded (metadata: limit, limit_value).
     *
     * @generated from enum value: ERROR_REASON_LIMIT_EXCEEDED = 9;
     */
    ErrorReason[ErrorReason["LIMIT_EXCEEDED"] = 9] = "LIMIT_EXCEEDED";
    /**
     * The disk holding the object is full (or the file size limit was reached); nothing was written.
     *
     * @generated from enum value: ERROR_REASON_STORAGE_FULL = 10;
     */
    ErrorReason[ErrorReason["STORAGE_FULL"] = 10] = "STORAGE_FULL";
    /**
     * A thing named by id does not exist where an answer needs it (e.g. an attachment hash).
     *
     * @generated from enum value: ERROR_REASON_NOT_FOUND = 11;
     */
    ErrorReason[ErrorReason["NOT_FOUND"] = 11] = "NOT_FOUND";
    /**
     * Compact was called but the server has no summarizer configured.
     *
     * @generated from enum value: ERROR_REASON_NO_SUMMARIZER = 12;
     */
    ErrorReason[ErrorReason["NO_SUMMARIZER"] = 12] = "NO_SUMMARIZER";
    /**
     * The call carries no valid bearer token.
     *
     * @generated from enum value: ERROR_REASON_UNAUTHENTICATED = 13;
     */
    ErrorReason[ErrorReason["UNAUTHENTICATED"] = 13] = "UNAUTHENTICATED";
    /**
     * The bearer token does not grant this object key or this kind of access.
     *
     * @generated from enum value: ERROR_REASON_PERMISSION_DENIED = 14;
     */
    ErrorReason[ErrorReason["PERMISSION_DENIED"] = 14] = "PERMISSION_DENIED";
    /**
     * The server failed on its own; the message names the error class and the log has details.
     *
     * @generated from enum value: ERROR_REASON_INTERNAL = 15;
     */
    ErrorReason[ErrorReason["INTERNAL"] = 15] = "INTERNAL";
    /**
     * The stored state does not allow the request (see the message).
     *
     * @generated from enum value: ERROR_REASON_FAILED_PRECONDITION = 16;
     */
    ErrorReason[ErrorReason["FAILED_PRECONDITION"] = 16] = "FAILED_PRECONDITION";
    /**
     * This server does not own the object (ownership guard); route it to its shard.
     *
     * @generated from enum value: ERROR_REASON_OBJECT_NOT_OWNED = 17;
     */
    ErrorReason[ErrorReason["OBJECT_NOT_OWNED"] = 17] = "OBJECT_NOT_OWNED";
    /**
     * The object is being moved to another server; retry shortly.
     *
     * @generated from enum value: ERROR_REASON_OBJECT_MOVING = 18;
     */
    ErrorReason[ErrorReason["OBJECT_MOVING"] = 18] = "OBJECT_MOVING";
})(ErrorReason || (ErrorReason = {}));
/**
 * Describes the enum sessions.v1.ErrorReason.
 */
export const ErrorReasonSchema = /*@__PURE__*/ enumDesc(file_sessions_v1_sessions, 3);
/**
 * What an UploadMessage stream does with its message.
 *
 * @generated from enum sessions.v1.UploadOperation
 */
export var UploadOperation;
(function (UploadOperation) {
    /**
     * Invalid.
     *
     * @generated from enum value: UPLOAD_OPERATION_UNSPECIFIED = 0;
     */
    UploadOperation[UploadOperation["UNSPECIFIED"] = 0] = "UNSPECIFIED";
    /**
     * As AppendMessage.
     *
     * @generated from enum value: UPLOAD_OPERATION_APPEND = 1;
     */
    UploadOperation[UploadOperation["APPEND"] = 1] = "APPEND";
    /**
     * As UpdateMessage.
     *
     * @generated from enum value: UPLOAD_OPERATION_UPDATE = 2;
     */
    UploadOperation[UploadOperation["UPDATE"] = 2] = "UPDATE";
    /**
     * As UpsertMessage.
     *
     * @generated from enum value: UPLOAD_OPERATION_UPSERT = 3;
     */
    UploadOperation[UploadOperation["UPSERT"] = 3] = "UPSERT";
})(UploadOperation || (UploadOperation = {}));
/**
 * Describes the enum sessions.v1.UploadOperation.
 */
export const UploadOperationSchema = /*@__PURE__*/ enumDesc(file_sessions_v1_sessions, 4);
/**
 * How a search query matches.
 *
 * @generated from enum sessions.v1.SearchMode
 */
export var SearchMode;
(function (SearchMode) {
    /**
     * Same as PHRASE.
     *
     * @generated from enum value: SEARCH_MODE_UNSPECIFIED = 0;
     */
    SearchMode[SearchMode["UNSPECIFIED"] = 0] = "UNSPECIFIED";
    /**
     * Upstream's semantics: the whole query is one phrase (adjacent words, in order).
     *
     * @generated from enum value: SEARCH_MODE_PHRASE = 1;
     */
    SearchMode[SearchMode["PHRASE"] = 1] = "PHRASE";
    /**
     * Every word of the query, in any order.
     *
     * @generated from enum value: SEARCH_MODE_ALL_WORDS = 2;
     */
    SearchMode[SearchMode["ALL_WORDS"] = 2] = "ALL_WORDS";
})(SearchMode || (SearchMode = {}));
/**
 * Describes the enum sessions.v1.SearchMode.
 */
export const SearchModeSchema = /*@__PURE__*/ enumDesc(file_sessions_v1_sessions, 5);
/**
 * The kinds of change events.
 *
 * @generated from enum sessions.v1.ChangeType
 */
export var ChangeType;
(function (ChangeType) {
    /**
     * Not used.
     *
     * @generated from enum value: CHANGE_TYPE_UNSPECIFIED = 0;
     */
    ChangeType[ChangeType["UNSPECIFIED"] = 0] = "UNSPECIFIED";
    /**
     * A message append (also duplicates, with inserted=false).
     *
     * @generated from enum value: CHANGE_TYPE_APPEND = 1;
     */
    ChangeType[ChangeType["APPEND"] = 1] = "APPEND";
    /**
     * A message's content changed.
     *
     * @generated from enum value: CHANGE_TYPE_UPDATE = 2;
     */
    ChangeType[ChangeType["UPDATE"] = 2] = "UPDATE";
    /**
     * Messages were deleted (message_ids as the caller passed them).
     *
     * @generated from enum value: CHANGE_TYPE_DELETE = 3;
     */
    ChangeType[ChangeType["DELETE"] = 3] = "DELETE";
    /**
     * A session was cleared.
     *
     * @generated from enum value: CHANGE_TYPE_CLEAR = 4;
     */
    ChangeType[ChangeType["CLEAR"] = 4] = "CLEAR";
    /**
     * Compact stored an overlay.
     *
     * @generated from enum value: CHANGE_TYPE_COMPACT = 5;
     */
    ChangeType[ChangeType["COMPACT"] = 5] = "COMPACT";
    /**
     * AddCompaction stored an overlay (compaction is set).
     *
     * @generated from enum value: CHANGE_TYPE_COMPACTION = 6;
     */
    ChangeType[ChangeType["COMPACTION"] = 6] = "COMPACTION";
    /**
     * A message was imported.
     *
     * @generated from enum value: CHANGE_TYPE_IMPORT = 7;
     */
    ChangeType[ChangeType["IMPORT"] = 7] = "IMPORT";
    /**
     * Automatic compaction failed (error is set); the append that triggered it succeeded.
     *
     * @generated from enum value: CHANGE_TYPE_COMPACTION_ERROR = 8;
     */
    ChangeType[ChangeType["COMPACTION_ERROR"] = 8] = "COMPACTION_ERROR";
    /**
     * Events were missed (restart, retention or a full queue): re-read state, then continue.
     *
     * @generated from enum value: CHANGE_TYPE_RESET = 9;
     */
    ChangeType[ChangeType["RESET"] = 9] = "RESET";
    /**
     * Nothing happened; the stream is alive at this revision.
     *
     * @generated from enum value: CHANGE_TYPE_PROGRESS = 10;
     */
    ChangeType[ChangeType["PROGRESS"] = 10] = "PROGRESS";
})(ChangeType || (ChangeType = {}));
/**
 * Describes the enum sessions.v1.ChangeType.
 */
export const ChangeTypeSchema = /*@__PURE__*/ enumDesc(file_sessions_v1_sessions, 6);
/**
 * SessionService reads and writes the messages of sessions inside objects.
 *
 * @generated from service sessions.v1.SessionService
 */
export const SessionService = /*@__PURE__*/ serviceDesc(file_sessions_v1_sessions, 0);
//# sourceMappingURL=sessions_pb.js.map