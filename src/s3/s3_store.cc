// The s3:// store: S3 REST over libcurl, signed with SigV4, with retries, ETag pinning,
// parallel ranged GETs and parallel multipart uploads.
#include "sluice/s3/store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "core/backoff.h"
#include "core/executor.h"
#include "http/client.h"
#include "sigv4.h"
#include "sluice/telemetry/registry.h"
#include "xml.h"

namespace sluice::s3 {

using http::HeaderList;
using http::HttpClient;
using http::HttpOptions;
using http::HttpRequest;
using http::HttpResponse;

Result<S3Location> parse_s3_uri(std::string_view uri) {
  if (!uri.starts_with("s3://"))
    return fail(Code::kInvalidArgument, "'" + std::string(uri) + "' is not an s3:// URI");
  std::string_view rest = uri.substr(5);
  size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) loc.prefix = std::string(rest.substr(slash + 1));
  if (loc.bucket.size() < 3 || loc.bucket.size() > 63 ||
      loc.bucket.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-") != std::string::npos)
    return fail(Code::kInvalidArgument, "invalid bucket name '" + loc.bucket + "' in '" +
                                            std::string(uri) +
                                            "' (3-63 lower-case letters, digits, '.', '-')");
  return loc;
}

namespace {

enum Op { kHead, kGet, kPut, kPost, kDelete, kList, kOpCount };
constexpr const char* kOpNames[kOpCount] = {"head", "get", "put", "post", "delete", "list"};

struct S3Request {
  Op op = kGet;
  std::string method;
  std::string key;  // full object key, or empty for bucket-level calls
  std::vector<std::pair<std::string, std::string>> query;
  HeaderList headers;
  std::span<const std::byte> body;
  std::span<std::byte> sink;
  // Checks a 2xx response (lengths, ranges); an error from it is retried like a reset.
  std::function<std::optional<Error>(const HttpResponse&)> check = {};
  // A ranged GET that starts at or past the end gets 416; with this set, send() returns
  // that response instead of an error (the read is simply at the end).
  bool range_past_end_ok = false;
  std::function<void(size_t)> on_sink = {};  // HttpRequest::on_sink
};

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// ETags compared as servers and proxies vary them: without a weak prefix ("W/") or quotes.
std::string_view bare_etag(std::string_view e) {
  if (e.starts_with("W/")) e.remove_prefix(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

bool same_etag(std::string_view a, std::string_view b) {
  return bare_etag(a) == bare_etag(b);
}

struct S3Metrics {
  telemetry::Counter* requests[kOpCount] = {};
  telemetry::Histogram* latency[kOpCount] = {};
  telemetry::Counter* retries = nullptr;
  telemetry::Counter* throttled = nullptr;
  telemetry::Counter* bytes_in = nullptr;
  telemetry::Counter* bytes_out = nullptr;
};

class S3Store;

class S3Writer : public store::Writer {
 public:
  S3Writer(S3Store* store, std::string key, store::WriteOptions options);
  ~S3Writer() override { abort(); }
  Status append(std::span<const std::byte> data) override;
  Status commit() override;
  void abort() override;
  uint64_t size() const override { return size_; }

 private:
  struct Part {
    int number;
    std::future<Result<std::string>> etag;
  };
  Status start_part();  // sends the buffered part
  Status drain(size_t keep);
  Status failed(Error e) {
    abort();
    return std::unexpected(std::move(e));
  }

  S3Store* store_;
  std::string key_;
  store::WriteOptions options_;
  size_t part_size_;
  std::vector<std::byte> buf_;
  std::string upload_id_;
  std::vector<Part> in_flight_;
  std::vector<std::pair<int, std::string>> done_;  // part number, etag
  uint64_t size_ = 0;
  bool finished_ = false;
};

}  // namespace

std::string endpoint_url(const S3Options& options) {
  std::string ep = options.endpoint.empty() ? "https://s3." + options.region + ".amazonaws.com"
                                            : options.endpoint;
  while (ep.ends_with('/')) ep.pop_back();
  return ep;
}

namespace {

class S3Store : public store::Store {
 public:
  S3Store(S3Location loc, S3Options opts)
      : loc_(std::move(loc)),
        opts_(std::move(opts)),
        // Each attempt may stall for half the stall timeout, so one retry (on a fresh
        // connection) still fits in it.
        http_(HttpOptions{opts_.max_in_flight, 5000,
                          std::max(1L, static_cast<long>(opts_.stall_timeout_s) / 2)}),
        parts_(std::max(1u, std::min(opts_.part_concurrency, 64u))),
        budget_(static_cast<int64_t>(opts_.retry_budget)) {
    std::string ep = endpoint_url(opts_);
    size_t scheme = ep.find("://");
    scheme_ = scheme == std::string::npos ? "https" : ep.substr(0, scheme);
    host_ = scheme == std::string::npos ? ep : ep.substr(scheme + 3);
    if (!opts_.path_style) host_ = loc_.bucket + "." + host_;
    if (telemetry::Registry* r = opts_.registry) {
      for (int i = 0; i < kOpCount; ++i) {
        m_.requests[i] = &r->counter("sluice_s3_requests_total", {{"op", kOpNames[i]}},
                                     "S3 requests sent, retries included");
        m_.latency[i] = &r->histogram("sluice_s3_latency_seconds", {{"op", kOpNames[i]}},
                                      "S3 request latency", 1e-9);
      }
      m_.retries = &r->counter("sluice_s3_retries_total", {}, "S3 requests retried");
      m_.throttled = &r->counter("sluice_s3_throttled_total", {},
                                 "S3 answers asking to slow down (503, 429, SlowDown)");
      m_.bytes_in = &r->counter("sluice_s3_bytes_total", {{"direction", "in"}}, "S3 body bytes");
      m_.bytes_out = &r->counter("sluice_s3_bytes_total", {{"direction", "out"}}, "S3 body bytes");
    }
  }

  std::string uri() const override { return "s3://" + loc_.bucket + "/" + loc_.prefix; }
  std::string identity() const override { return uri() + " at " + endpoint_url(opts_); }
  std::string object_uri(std::string_view full_key) const {
    return "s3://" + loc_.bucket + "/" + std::string(full_key);
  }
  std::string full_key(std::string_view key) const { return loc_.prefix + std::string(key); }
  const S3Options& options() const { return opts_; }
  Executor& parts() { return parts_; }

  // Signs and sends one request, retrying what may succeed later. HTTP errors come back
  // as Errors naming the bucket, key and S3 error code.
  Result<HttpResponse> send(const S3Request& r) {
    // Path style: /bucket[/key]; virtual-host style: /[key] (the bucket is in the host).
    std::string path = opts_.path_style ? "/" + loc_.bucket : "";
    if (!r.key.empty()) path += "/" + uri_encode(r.key, false);
    if (path.empty()) path = "/";
    std::string query = canonical_query(r.query);
    HttpRequest h;
    h.method = r.method;
    h.url = scheme_ + "://" + host_ + path + (query.empty() ? "" : "?" + query);
    h.body = r.body;
    h.sink = r.sink;
    h.on_sink = r.on_sink;
    std::string what = r.method + " " + (r.key.empty() ? "s3://" + loc_.bucket : object_uri(r.key));

    const auto started = std::chrono::steady_clock::now();
    for (unsigned attempt = 1;; ++attempt) {
      h.headers = signed_headers(r, path);
      uint64_t t0 = telemetry::now_ns();
      auto resp = http_.perform(h);
      if (m_.requests[r.op]) {
        m_.requests[r.op]->add();
        m_.latency[r.op]->record(telemetry::now_ns() - t0);
      }
      Verdict v = judge(r, resp, what, started);
      // Any answer but a 404 about the bucket says the bucket is there.
      if (v.done || (resp && resp->status != 404))
        bucket_seen_.store(true, std::memory_order_relaxed);
      if (v.done) {
        if (m_.bytes_in) {
          m_.bytes_in->add(resp->sink_bytes + resp->body.size());
          m_.bytes_out->add(r.body.size());
        }
        // A success earns back a little of the retry budget.
        if (budget_.load(std::memory_order_relaxed) < static_cast<int64_t>(opts_.retry_budget))
          budget_.fetch_add(1, std::memory_order_relaxed);
        return std::move(*resp);
      }
      if (!v.retryable || attempt >= opts_.max_attempts)
        return std::unexpected(
            attempt > 1 ? v.error->with_context("after " + std::to_string(attempt) + " attempts")
                        : *v.error);
      SLUICE_RETURN_IF_ERROR(back_off(attempt, *v.error));
    }
  }

  // The request's headers with the SigV4 Authorization (none for anonymous requests).
  HeaderList signed_headers(const S3Request& r, const std::string& path) const {
    HeaderList headers = r.headers;
    if (opts_.access_key.empty()) return headers;
    SigningRequest sr{r.method, host_, path, r.query, r.headers, std::string(kUnsignedPayload)};
    if (r.body.empty()) sr.payload_sha256 = std::string(kEmptyPayloadSha256);
    auto signed_req =
        sign_v4(sr, Credentials{opts_.access_key, opts_.secret_key, opts_.session_token},
                opts_.region, "s3", std::time(nullptr));
    for (auto& kv : signed_req.headers) headers.push_back(kv);
    return headers;
  }

  // What one attempt's outcome means: done (a usable answer), or an error that may or may
  // not be worth another attempt.
  struct Verdict {
    bool done = false;
    std::optional<Error> error;
    bool retryable = false;
  };

  Verdict judge(const S3Request& r, const Result<HttpResponse>& resp, const std::string& what,
                std::chrono::steady_clock::time_point started) const {
    if (!resp) {  // transport: refused, reset, timed out, truncated
      Error e(resp.error().code(), what + ": " + resp.error().message());
      // A stall (no progress for half of stall_timeout_s) is retried only while the request
      // as a whole has not yet waited stall_timeout_s: a stalled server is abandoned in
      // about stall_timeout_s, not max_attempts times it.
      if (e.code() == Code::kTimedOut &&
          std::chrono::steady_clock::now() - started >= std::chrono::seconds(opts_.stall_timeout_s))
        return {false,
                e.with_context("stalled for " + std::to_string(opts_.stall_timeout_s) +
                               " s (the stall timeout)"),
                false};
      bool retry = e.code() == Code::kUnavailable || e.code() == Code::kTimedOut;
      return {false, std::move(e), retry};
    }
    if (resp->status == 416 && r.range_past_end_ok) return {true};
    if (resp->status >= 300 || resp->sink_overflow) {
      auto [e, retry] = classify(*resp, what);
      if (m_.throttled && (resp->status == 503 || resp->status == 429 ||
                           e.message().find("SlowDown") != std::string::npos))
        m_.throttled->add();
      return {false, std::move(e), retry};
    }
    if (r.check) {
      if (auto e = r.check(*resp)) {
        bool retry = e->code() == Code::kUnavailable;  // a short body: like a reset
        return {false, std::move(e), retry};
      }
    }
    return {true};
  }

  // Sleeps before another attempt (exponential backoff with full jitter), unless the
  // store-wide retry budget is spent.
  Status back_off(unsigned attempt, const Error& why) {
    // Relaxed: the budget is a soft, approximate limit on retry storms.
    if (budget_.fetch_sub(5, std::memory_order_relaxed) < 5) {
      budget_.fetch_add(5, std::memory_order_relaxed);
      return std::unexpected(why.with_context("retry budget exhausted"));
    }
    if (m_.retries) m_.retries->add();
    sleep_backoff(attempt, std::chrono::milliseconds(opts_.base_delay_ms),
                  std::chrono::milliseconds(opts_.max_delay_ms));
    return ok();
  }

  std::pair<Error, bool> classify(const HttpResponse& resp, const std::string& what) const {
    ErrorReply reply = parse_error_reply(resp.body);
    std::string code = std::move(reply.code), message = std::move(reply.message);
    if (resp.sink_overflow)  // more than the range or the listed size: not this version
      return {Error(Code::kConflict, what + ": server sent more bytes than asked for"), false};
    long s = resp.status;
    if (code.empty()) {
      switch (s) {
        case 404:
          code = "NotFound";
          break;
        case 403:
          code = "Forbidden";
          break;
        case 412:
          code = "PreconditionFailed";
          break;
        default:
          code = "HTTP" + std::to_string(s);
      }
    }
    std::string msg = what + ": " + code + " (HTTP " + std::to_string(s) + ")" +
                      (message.empty() ? "" : ": " + message);
    bool retry = s == 500 || s == 502 || s == 503 || s == 504 || s == 429 || code == "SlowDown" ||
                 code == "RequestTimeout" || code == "InternalError";
    Code c = Code::kIoError;
    if (s == 404)
      c = Code::kNotFound;
    else if (s == 401 || s == 403)
      c = Code::kPermissionDenied;
    else if (s == 409 || s == 412)
      c = Code::kConflict;
    else if (code == "BadDigest" || code == "InvalidDigest")
      c = Code::kCorruption;
    else if (retry)
      c = Code::kUnavailable;
    else if (s >= 400 && s < 500)
      c = Code::kInvalidArgument;
    return {Error(c, msg), retry};
  }

  Result<store::ObjectInfo> stat(std::string_view key) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    auto got = send(S3Request{kHead, "HEAD", full_key(key), {}, {}, {}, {}});
    if (!got && got.error().code() == Code::kNotFound &&
        !bucket_seen_.load(std::memory_order_relaxed)) {
      // A HEAD's 404 has no body to say whether the key or the bucket is missing: ask, until
      // some answer has shown the bucket is there (misses are common: probes, polls).
      auto bucket = send(S3Request{kHead, "HEAD", "", {}, {}, {}, {}});
      if (!bucket && bucket.error().code() == Code::kNotFound)
        return fail(Code::kNotFound, "no bucket '" + loc_.bucket + "' at " + endpoint_url(opts_) +
                                         " (reading " + object_uri(full_key(key)) + ")");
    }
    SLUICE_ASSIGN_OR_RETURN(auto resp, std::move(got));
    store::ObjectInfo info;
    info.key = std::string(key);
    info.size = std::strtoull(resp.header("content-length").c_str(), nullptr, 10);
    info.etag = resp.header("etag");
    info.mtime_ns = parse_http_date(resp.header("last-modified"));
    return info;
  }

  // One ranged GET into `dst`. Returns bytes read and, through `etag`, the object's ETag.
  // Pinned to `if_match` and, when known, the object's size: not every server honours
  // If-Match on a ranged GET (s3rver answers 206 regardless), so each response's ETag and
  // Content-Range total are compared too.
  Result<size_t> get_range(const std::string& fk, uint64_t offset, std::span<std::byte> dst,
                           const std::string& if_match, std::optional<uint64_t> object_size,
                           std::string* etag, std::function<void(size_t)> on_sink = {}) {
    S3Request r{kGet, "GET", fk, {}, {}, {}, dst};
    r.on_sink = std::move(on_sink);
    r.headers.emplace_back(
        "Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + dst.size() - 1));
    if (!if_match.empty()) r.headers.emplace_back("If-Match", if_match);
    std::string what = "GET " + object_uri(fk) + " bytes " + std::to_string(offset) + "+" +
                       std::to_string(dst.size());
    // Never return a partial or misplaced body: the length must match Content-Length and
    // the range must start where asked. A mismatch is retried, like a reset.
    r.check = [&](const HttpResponse& h) -> std::optional<Error> {
      if (!if_match.empty() && !same_etag(h.header("etag"), if_match))
        return Error(Code::kConflict, what + ": ETag " + h.header("etag") + " is not the " +
                                          if_match + " the read is pinned to");
      std::string cl = h.header("content-length");
      if (cl.empty() || std::strtoull(cl.c_str(), nullptr, 10) != h.sink_bytes)
        return Error(Code::kUnavailable, what + ": body of " + std::to_string(h.sink_bytes) +
                                             " bytes, Content-Length '" + cl + "'");
      uint64_t total = 0;
      if (h.status == 206) {
        std::string cr = h.header("content-range");  // "bytes a-b/total"
        uint64_t a = 0, b = 0;
        if (std::sscanf(cr.c_str(), "bytes %lu-%lu/%lu", &a, &b, &total) != 3 || a != offset ||
            b - a + 1 != h.sink_bytes)
          return Error(Code::kCorruption, what + ": Content-Range '" + cr +
                                              "' does not match the " +
                                              std::to_string(h.sink_bytes) + "-byte body");
      } else if (offset != 0) {
        return Error(Code::kCorruption, what + ": server ignored the Range header");
      } else {
        total = h.sink_bytes;  // 200: the whole object fit the range
      }
      if (object_size && total != *object_size)
        return Error(Code::kConflict, what + ": the object is " + std::to_string(total) +
                                          " bytes now, not the " + std::to_string(*object_size) +
                                          " the read is pinned to");
      return std::nullopt;
    };
    r.range_past_end_ok = true;
    SLUICE_ASSIGN_OR_RETURN(HttpResponse resp, send(r));
    if (resp.status == 416) return size_t{0};  // the range starts at or past the end
    if (etag) *etag = resp.header("etag");
    return resp.sink_bytes;
  }

  // A whole object of known size with one plain GET: one response is one version, so the
  // ETag is checked on the response rather than sent as If-Match.
  Result<size_t> get_whole(const std::string& fk, uint64_t size, std::span<std::byte> dst,
                           const std::string& if_match, std::function<void(size_t)> on_sink) {
    S3Request r{kGet, "GET", fk, {}, {}, {}, dst.first(size)};
    r.on_sink = std::move(on_sink);
    std::string what = "GET " + object_uri(fk);
    r.check = [&](const HttpResponse& h) -> std::optional<Error> {
      std::string cl = h.header("content-length");
      if (cl != std::to_string(size))  // a different size: a different version
        return Error(Code::kConflict, what + " changed since it was listed: " + cl +
                                          " bytes, expected " + std::to_string(size));
      if (h.sink_bytes != size)  // a short body: retried like a reset
        return Error(Code::kUnavailable, what + ": body of " + std::to_string(h.sink_bytes) +
                                             " bytes, expected " + std::to_string(size));
      return std::nullopt;
    };
    auto resp = send(r);
    if (!resp) {
      // Conflict (a different size, or more bytes than the listing said): a new version.
      if (resp.error().code() == Code::kConflict)
        return std::unexpected(
            resp.error().with_context(object_uri(fk) + " changed since it was listed"));
      return std::unexpected(resp.error());
    }
    if (!if_match.empty() && !same_etag(resp->header("etag"), if_match))
      return fail(Code::kConflict, object_uri(fk) + " changed since it was listed (ETag " +
                                       if_match + ", now " + resp->header("etag") + ")");
    return resp->sink_bytes;
  }

  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    if (dst.empty()) return size_t{0};
    std::string fk = full_key(key);
    const size_t part = options.split ? opts_.part_size : dst.size();
    // ReadHooks::on_landed, for a read that is one request.
    std::function<void(size_t)> landed;
    if (options.hooks.on_landed && dst.size() <= part)
      landed = [&options, offset](size_t n) { options.hooks.on_landed(offset + n); };
    if (offset == 0 && options.object_size && *options.object_size <= dst.size() &&
        *options.object_size <= part)
      return get_whole(fk, *options.object_size, dst, options.if_match, std::move(landed));
    if (options.object_size && offset >= *options.object_size) return size_t{0};
    std::string etag = options.if_match;
    size_t first_len = std::min(dst.size(), part);
    SLUICE_ASSIGN_OR_RETURN(size_t first,
                            get_range(fk, offset, dst.first(first_len), etag, options.object_size,
                                      etag.empty() ? &etag : nullptr, std::move(landed)));
    if (first < first_len || dst.size() == first_len) return first;
    // The rest in parallel, every part pinned to the first part's ETag.
    std::vector<std::future<Result<size_t>>> futs;
    std::vector<std::pair<size_t, size_t>> ranges;
    for (size_t at = first_len; at < dst.size(); at += part) {
      size_t len = std::min(part, dst.size() - at);
      ranges.emplace_back(at, len);
      auto p = std::make_shared<std::promise<Result<size_t>>>();
      futs.push_back(p->get_future());
      parts_.post([this, p, fk, offset, at, len, dst, etag, size = options.object_size] {
        p->set_value(get_range(fk, offset + at, dst.subspan(at, len), etag, size, nullptr));
      });
    }
    size_t total = first;
    bool short_seen = false;
    std::optional<Error> err;
    for (size_t i = 0; i < futs.size(); ++i) {
      auto r = futs[i].get();
      if (!r) {
        if (!err) err = r.error();
        continue;
      }
      if (!short_seen) total += *r;
      if (*r < ranges[i].second) short_seen = true;
    }
    if (err) {
      if (err->code() == Code::kConflict)
        return std::unexpected(
            Error(Code::kConflict, object_uri(fk) + " was replaced during the read (ETag " + etag +
                                       " no longer matches): " + err->message()));
      return std::unexpected(*err);
    }
    return total;
  }

  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions& options) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    return std::unique_ptr<store::Writer>(std::make_unique<S3Writer>(this, full_key(key), options));
  }

  Result<store::ListPage> list(const store::ListOptions& options) override {
    if (options.max_keys == 0 || options.max_keys > 10000)
      return fail(Code::kInvalidArgument, "list max_keys must be 1..10000");
    S3Request r{kList, "GET", "", {}, {}, {}, {}};
    r.query = {{"list-type", "2"},
               {"prefix", loc_.prefix + options.prefix},
               {"max-keys", std::to_string(std::min<size_t>(options.max_keys, 1000))}};
    if (!options.continuation.empty())
      r.query.emplace_back("continuation-token", options.continuation);
    SLUICE_ASSIGN_OR_RETURN(auto resp, send(r));
    return parse_list_reply(resp.body, uri(), loc_.prefix, options.prefix);
  }

  Status remove(std::string_view key) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    SLUICE_RETURN_IF_ERROR(send(S3Request{kDelete, "DELETE", full_key(key), {}, {}, {}, {}}));
    return ok();
  }

  Status remove_many(std::span<const std::string> keys) override {
    for (size_t at = 0; at < keys.size(); at += 1000) {
      std::string xml = "<Delete><Quiet>true</Quiet>";
      for (size_t i = at; i < std::min(keys.size(), at + 1000); ++i) {
        SLUICE_RETURN_IF_ERROR(store::validate_key(keys[i]));
        xml += "<Object><Key>" + xml_escape(full_key(keys[i])) + "</Key></Object>";
      }
      xml += "</Delete>";
      auto body = std::as_bytes(std::span(xml.data(), xml.size()));
      S3Request r{kPost,
                  "POST",
                  "",
                  {{"delete", ""}},
                  {{"Content-MD5", md5_base64(body)}, {"Content-Type", "application/xml"}},
                  body,
                  {}};
      SLUICE_ASSIGN_OR_RETURN(auto resp, send(r));
      if (auto e = parse_delete_reply(resp.body))
        return fail(Code::kIoError,
                    "delete " + object_uri(e->key) + ": " + e->code + ": " + e->message);
    }
    return ok();
  }

 private:
  S3Location loc_;
  S3Options opts_;
  std::string scheme_, host_;
  HttpClient http_;
  Executor parts_;
  std::atomic<int64_t> budget_;  // relaxed: a soft, approximate limit on retry storms
  // Some answer showed the bucket exists. Relaxed: a hint that only saves a request; a
  // stale false costs one extra HEAD of the bucket, and nothing is published through it.
  std::atomic<bool> bucket_seen_{false};
  S3Metrics m_;
};

// S3 refuses parts under 5 MiB (but the last), and only at CompleteMultipartUpload, after
// every byte was sent; and it allows 10,000 parts, so an upload whose size is known gets
// parts large enough for it.
size_t part_size_for_upload(size_t configured, std::optional<uint64_t> size_hint) {
  constexpr uint64_t kMaxParts = 10000, kMiB = 1 << 20, kMinPart = 5 * kMiB;
  configured = std::max<size_t>(configured, kMinPart);
  if (!size_hint) return configured;
  uint64_t needed = (*size_hint + kMaxParts - 1) / kMaxParts;
  needed = (needed + kMiB - 1) / kMiB * kMiB;
  return static_cast<size_t>(std::clamp<uint64_t>(needed, configured, kMaxPartSize));
}

S3Writer::S3Writer(S3Store* store, std::string key, store::WriteOptions options)
    : store_(store),
      key_(std::move(key)),
      options_(options),
      part_size_(part_size_for_upload(store->options().part_size, options.size_hint)) {}

Status S3Writer::append(std::span<const std::byte> data) {
  if (finished_)
    return fail(Code::kInvalidArgument,
                "append to finished writer for " + store_->object_uri(key_));
  const size_t part = part_size_;
  while (!data.empty()) {
    // Grow by what is written, not by the part size: a small object with a huge part size
    // must not allocate the part.
    if (buf_.capacity() - buf_.size() < data.size() && buf_.capacity() < part)
      buf_.reserve(std::min(part, std::max(buf_.size() + data.size(), 2 * buf_.capacity())));
    size_t n = std::min(part - buf_.size(), data.size());
    buf_.insert(buf_.end(), data.begin(), data.begin() + static_cast<ptrdiff_t>(n));
    data = data.subspan(n);
    size_ += n;
    if (buf_.size() == part) SLUICE_RETURN_IF_ERROR(start_part());
  }
  return ok();
}

Status S3Writer::start_part() {
  if (upload_id_.empty()) {
    S3Request r{kPost, "POST", key_, {{"uploads", ""}}, {}, {}, {}};
    auto resp = store_->send(r);
    if (!resp) return failed(resp.error().with_context("start multipart upload"));
    upload_id_ = parse_upload_id(resp->body);
    if (upload_id_.empty())
      return failed(
          Error(Code::kCorruption, "POST " + store_->object_uri(key_) + "?uploads: no UploadId"));
  }
  SLUICE_RETURN_IF_ERROR(drain(store_->options().part_concurrency - 1));
  int number = static_cast<int>(done_.size() + in_flight_.size()) + 1;
  auto body = std::make_shared<std::vector<std::byte>>(std::move(buf_));
  buf_ = {};
  auto p = std::make_shared<std::promise<Result<std::string>>>();
  in_flight_.push_back(Part{number, p->get_future()});
  S3Store* store = store_;
  std::string key = key_, upload = upload_id_;
  store_->parts().post([store, key, upload, number, body, p] {
    S3Request r{kPut,
                "PUT",
                key,
                {{"partNumber", std::to_string(number)}, {"uploadId", upload}},
                {{"Content-MD5", md5_base64(*body)}},
                *body,
                {}};
    auto resp = store->send(r);
    if (!resp) {
      p->set_value(
          std::unexpected(resp.error().with_context("upload part " + std::to_string(number))));
      return;
    }
    p->set_value(resp->header("etag"));
  });
  return ok();
}

Status S3Writer::drain(size_t keep) {
  while (in_flight_.size() > keep) {
    Part part = std::move(in_flight_.front());
    in_flight_.erase(in_flight_.begin());
    auto etag = part.etag.get();
    if (!etag) return failed(etag.error());
    done_.emplace_back(part.number, std::move(*etag));
  }
  return ok();
}

Status S3Writer::commit() {
  if (finished_)
    return fail(Code::kInvalidArgument,
                "commit of finished writer for " + store_->object_uri(key_));
  if (upload_id_.empty()) {
    S3Request r{kPut, "PUT", key_, {}, {{"Content-MD5", md5_base64(buf_)}}, buf_, {}};
    if (!options_.overwrite) r.headers.emplace_back("If-None-Match", "*");
    auto resp = store_->send(r);
    finished_ = true;
    buf_ = {};
    if (!resp) {
      if (resp.error().code() == Code::kConflict)
        return fail(Code::kAlreadyExists, store_->object_uri(key_) + " already exists");
      return std::unexpected(resp.error());
    }
    return ok();
  }
  if (!buf_.empty()) SLUICE_RETURN_IF_ERROR(start_part());
  SLUICE_RETURN_IF_ERROR(drain(0));
  std::sort(done_.begin(), done_.end());
  std::string xml = "<CompleteMultipartUpload>";
  for (auto& [n, etag] : done_)
    xml += "<Part><PartNumber>" + std::to_string(n) + "</PartNumber><ETag>" + xml_escape(etag) +
           "</ETag></Part>";
  xml += "</CompleteMultipartUpload>";
  auto body = std::as_bytes(std::span(xml.data(), xml.size()));
  S3Request r{
      kPost, "POST", key_, {{"uploadId", upload_id_}}, {{"Content-Type", "application/xml"}},
      body,  {}};
  if (!options_.overwrite) r.headers.emplace_back("If-None-Match", "*");
  auto resp = store_->send(r);
  if (!resp && (resp.error().code() == Code::kConflict))
    return failed(Error(Code::kAlreadyExists, store_->object_uri(key_) + " already exists"));
  if (!resp) return failed(resp.error().with_context("complete multipart upload"));
  // CompleteMultipartUpload can fail with 200 and an <Error> body.
  if (auto code = parse_complete_error(resp->body))
    return failed(Error(Code::kUnavailable,
                        "complete multipart upload of " + store_->object_uri(key_) + ": " + *code));
  finished_ = true;
  upload_id_.clear();
  return ok();
}

void S3Writer::abort() {
  finished_ = true;
  buf_ = {};
  for (auto& p : in_flight_) p.etag.wait();  // parts hold no pointer into this writer
  in_flight_.clear();
  if (!upload_id_.empty()) {
    // Best effort: an upload left behind costs storage until a lifecycle rule removes it.
    S3Request r{kDelete, "DELETE", key_, {{"uploadId", upload_id_}}, {}, {}, {}};
    (void)store_->send(r);
    upload_id_.clear();
  }
}

}  // namespace

Result<std::unique_ptr<store::Store>> open_s3_store(std::string_view uri,
                                                    const S3Options& options) {
  SLUICE_ASSIGN_OR_RETURN(S3Location loc, parse_s3_uri(uri));
  if (options.part_size == 0 || options.part_size > kMaxPartSize)
    return fail(Code::kInvalidArgument, "S3 part size " + std::to_string(options.part_size) +
                                            " is outside 1 byte to 5 GiB (the S3 limit per part)");
  if (options.stall_timeout_s == 0)
    return fail(Code::kInvalidArgument, "S3 stall timeout must be at least 1 second");
  if (options.part_concurrency == 0 || options.max_in_flight == 0)
    return fail(Code::kInvalidArgument,
                "S3 part concurrency and requests in flight must be at least 1");
  if (options.max_attempts == 0)
    return fail(Code::kInvalidArgument, "S3 max attempts must be at least 1");
  return std::unique_ptr<store::Store>(std::make_unique<S3Store>(std::move(loc), options));
}

void register_scheme() {
  store::register_scheme("s3", [](std::string_view uri, const store::StoreOptions& options) {
    const S3Options* o = options.backend.get<S3Options>();
    S3Options opts = o ? *o : S3Options{};
    if (!opts.registry) opts.registry = options.registry;
    return open_s3_store(uri, opts);
  });
}

}  // namespace sluice::s3
