// sluice/s3/store.h: the s3:// store — any S3-compatible object store.
//
// Opens `s3://bucket[/prefix]`; keys are relative to the prefix. Requests are signed with
// AWS Signature Version 4 and sent over libcurl with connection reuse and at most
// `max_in_flight` requests at once.
//
// Contract, beyond store.h:
// - Reads go straight into the caller's buffer. A read larger than `part_size` is split
//   into parallel ranged GETs, all pinned to the ETag of the first (If-Match), so an
//   object replaced mid-read fails with Conflict instead of returning a blend. Every
//   response's length is checked against what was asked.
// - Writers upload with one PUT up to `part_size`, else as a multipart upload with up to
//   `part_concurrency` parts in flight; every part carries Content-MD5. A failed or
//   abandoned multipart upload is aborted, so no orphan parts stay behind.
// - Retries: 500, 502, 503, 504, 429, SlowDown, RequestTimeout, InternalError, resets and
//   timeouts are retried with exponential backoff and full jitter, at most
//   `max_attempts` tries per request and within a store-wide retry budget. Errors that
//   cannot succeed (403, 404, NoSuchBucket, bad credentials) fail at once, naming the
//   bucket, key and S3 error code.
// - Credentials and endpoint are options: only the CLI and the daemon read the
//   environment and ~/.aws files.
#pragma once

#include <memory>
#include <string>

#include "sluice/store/store.h"

namespace sluice::s3 {

struct S3Options {
  std::string endpoint;  // "http://127.0.0.1:4568"; empty: https://s3.<region>.amazonaws.com
  std::string region = "us-east-1";
  std::string access_key;
  std::string secret_key;
  std::string session_token;
  bool path_style = true;  // bucket in the path (custom endpoints); false: virtual host
  // HTTP requests in flight at once across the store. Too many collapse a server's
  // throughput (a single-threaded s3rver thrashes at 32); 16 keeps one AWS prefix busy.
  unsigned max_in_flight = 16;
  // Multipart part size and parallel ranged-GET size, at most 5 GiB (kMaxPartSize). AWS
  // needs at least 5 MiB for every part but the last.
  size_t part_size = 8 << 20;
  unsigned part_concurrency = 8;  // parts of one object (up or down) in flight at once
  unsigned max_attempts = 5;
  unsigned base_delay_ms = 50;
  unsigned max_delay_ms = 5000;
  unsigned retry_budget = 500;  // tokens: a retry costs 5, a success returns 1
  // A request that makes no progress (under 1 KiB/s) for this long is abandoned with
  // TimedOut, retries included.
  unsigned stall_timeout_s = 30;
  // Records sluice_s3_requests_total, sluice_s3_retries_total, sluice_s3_bytes_total and
  // sluice_s3_latency_seconds by operation, if set.
  telemetry::Registry* registry = nullptr;
};

inline constexpr size_t kMaxPartSize = size_t{5} << 30;

struct S3Location {
  std::string bucket;
  std::string prefix;  // everything after "bucket/", as given ("" for the whole bucket)
};

// The server `options` reach: the endpoint without trailing slashes, or AWS's for the region.
std::string endpoint_url(const S3Options& options);

// Parses "s3://bucket/some/prefix".
Result<S3Location> parse_s3_uri(std::string_view uri);

Result<std::unique_ptr<store::Store>> open_s3_store(std::string_view uri, const S3Options& options);

// Registers the s3:// scheme with store::open_store, which then opens s3:// URIs with the
// S3Options set in StoreOptions::backend (defaults when none). Idempotent.
void register_scheme();

}  // namespace sluice::s3
