// S3's XML replies (and the dates in them and in headers), parsed apart from the HTTP client so
// they are tested and fuzzed without a server (fuzz/s3_xml_fuzz.cc). Every body is untrusted: one
// that is not XML, or lacks what is asked for, is an empty answer or Corruption, never a crash.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/core/status.h"
#include "sluice/store/store.h"

namespace sluice::s3 {

// An error body, <Error><Code>…</Code><Message>…</Message></Error>; empty strings where the
// body is not XML or names no code or message.
struct ErrorReply {
  std::string code, message;
};
ErrorReply parse_error_reply(std::string_view body);

// A ListObjectsV2 page (<ListBucketResult>). Keys are full keys: each must start with
// `store_prefix` + `prefix` (the store's prefix and the one asked for), or the page is
// Corruption, and comes back without `store_prefix`. `uri` names the store in errors.
Result<store::ListPage> parse_list_reply(std::string_view body, std::string_view uri,
                                         std::string_view store_prefix, std::string_view prefix);

// The first <DeleteResult><Error> of a DeleteObjects reply; nullopt when there is none (or
// the body is not XML: a quiet delete that succeeded says nothing).
struct DeleteError {
  std::string key, code, message;
};
std::optional<DeleteError> parse_delete_reply(std::string_view body);

// <InitiateMultipartUploadResult><UploadId>; empty when missing.
std::string parse_upload_id(std::string_view body);

// CompleteMultipartUpload may fail with HTTP 200 and an <Error> body: its code (perhaps
// empty) when the body is that, nullopt otherwise.
std::optional<std::string> parse_complete_error(std::string_view body);

// Dates from S3 replies as nanoseconds since the Unix epoch; 0 when they do not parse or lie
// outside 1677 to 2262 (what int64 nanoseconds hold). "2024-05-01T12:00:00.000Z"
// (LastModified in listings), and "Wed, 01 May 2024 12:00:00 GMT" (the Last-Modified
// header).
int64_t parse_iso_date(const std::string& s);
int64_t parse_http_date(const std::string& s);

}  // namespace sluice::s3
