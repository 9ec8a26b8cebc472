// The one HTTP/1.1 client over libcurl, for the S3 store and the peer stores (chunks from a
// peer's cache, a peer's object space). Internal: no public header names it.
//
// - Connection reuse: a pool of curl multi handles, each keeping its connection alive
//   between requests; a request borrows one, runs a fresh easy handle on it and gives it
//   back (an easy handle is never reused: see perform).
// - Bounded concurrency: at most `max_in_flight` requests run at once across all threads;
//   more wait for a slot. Too many concurrent requests collapse an object store's
//   throughput, so this is the knob.
// - Bodies: uploads come from a caller span; downloads go straight into a caller span
//   (no intermediate copy) when one is given and the status is 2xx, else into `body`
//   (at most `max_body_bytes` of it).
// - Retries are the caller's (it knows which requests may be resent); core/backoff.h gives
//   every caller the same backoff.
//
// Thread safety: `perform` may be called from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::http {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method = "GET";
  std::string url;
  HeaderList headers;
  std::span<const std::byte> body;  // request body (PUT, POST)
  std::span<std::byte> sink;        // where a 2xx response body goes, if not empty
  // Told after each piece of a 2xx body lands in the sink, with the bytes in it so far.
  std::function<void(size_t)> on_sink;
};

struct HttpResponse {
  long status = 0;
  HeaderList headers;          // names lower-cased
  std::string body;            // the body, unless it went to the sink
  size_t sink_bytes = 0;       // bytes written into the sink
  bool sink_overflow = false;  // the server sent more than the sink holds
  bool body_overflow = false;  // the body passed HttpOptions::max_body_bytes

  // The first header called `name` (lower-case), or empty.
  std::string header(std::string_view name) const;
};

struct HttpOptions {
  unsigned max_in_flight = 16;  // requests at once; also the connections kept for reuse
  long connect_timeout_ms = 5000;
  // A transfer slower than 1 KiB/s for this long is abandoned (a stalled server).
  long low_speed_time_s = 30;
  long timeout_ms = 0;     // a whole request at most this long (TimedOut); 0: no limit
  bool http_only = false;  // refuse any scheme but http:// (a peer never speaks another)
  // A body that is not going to a sink is cut off past this (the response then has
  // body_overflow set and the connection is dropped); 0: no limit.
  size_t max_body_bytes = 0;
};

class HttpClient {
 public:
  explicit HttpClient(const HttpOptions& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Transport failures (refused, reset, timed out, truncated body) come back as
  // Unavailable or TimedOut with curl's reason (the caller names the object); any HTTP
  // status is a successful result.
  Result<HttpResponse> perform(const HttpRequest& request);

  // `text` escaped for a URL's query or path component (RFC 3986 unreserved kept).
  static std::string escape(std::string_view text);

 private:
  struct Pool;
  std::unique_ptr<Pool> pool_;
};

}  // namespace sluice::http
