// The shared HTTP client (client.h).
#include "http/client.h"

#include <curl/curl.h>

#include <strings.h>
#include <algorithm>
#include <cctype>
#include <cstring>

#include "sluice/core/thread_annotations.h"

namespace sluice::http {

std::string HttpResponse::header(std::string_view name) const {
  for (auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

struct HttpClient::Pool {
  HttpOptions options;
  Mutex mu;
  CondVar cv;
  unsigned in_use SLUICE_GUARDED_BY(mu) = 0;
  // Multi handles whose connection caches keep live connections, for reuse: each request
  // runs a fresh easy handle on one of them (see perform).
  std::vector<CURLM*> idle SLUICE_GUARDED_BY(mu);
};

namespace {

struct Transfer {
  const HttpRequest* req;
  HttpResponse* resp;
  CURL* handle;
  size_t max_body = 0;
  size_t upload_pos = 0;
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) {  // a new response (after 100 Continue or a redirect)
    t->resp->headers.clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' '))
    value.remove_suffix(1);
  t->resp->headers.emplace_back(std::move(name), std::string(value));
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 200 && status < 300 && !t->req->sink.empty()) {
    auto& r = *t->resp;
    if (r.sink_bytes + len > t->req->sink.size()) {
      r.sink_overflow = true;
      return 0;  // aborts the transfer: never write past the caller's buffer
    }
    std::memcpy(t->req->sink.data() + r.sink_bytes, data, len);
    r.sink_bytes += len;
    if (t->req->on_sink) {
      try {
        t->req->on_sink(r.sink_bytes);
      } catch (...) {  // never through libcurl's C frames: the transfer fails instead
        return 0;
      }
    }
    return len;
  }
  const size_t most = t->max_body;
  if (most && t->resp->body.size() + len > most) {
    t->resp->body_overflow = true;
    return 0;  // aborts the transfer
  }
  t->resp->body.append(data, len);
  return len;
}

// libcurl rewinds the body to resend a request on a fresh connection (a reused keep-alive
// connection the server had closed); without this the resend fails with
// CURLE_SEND_FAIL_REWIND.
int on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->req->body.size())
    return CURL_SEEKFUNC_CANTSEEK;
  t->upload_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t on_upload(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t left = t->req->body.size() - t->upload_pos;
  size_t len = std::min(left, size * n);
  std::memcpy(buf, t->req->body.data() + t->upload_pos, len);
  t->upload_pos += len;
  return len;
}

// Runs the one transfer `h` on `m`, whose connection cache it uses, to its end.
CURLcode run_transfer(CURLM* m, CURL* h) {
  if (curl_multi_add_handle(m, h) != CURLM_OK) return CURLE_FAILED_INIT;
  CURLcode rc = CURLE_FAILED_INIT;
  for (int running = 1; running;) {
    if (curl_multi_perform(m, &running) != CURLM_OK) break;
    // Returns at libcurl's own deadlines (timeouts) too.
    if (running && curl_multi_poll(m, nullptr, 0, 1000, nullptr) != CURLM_OK) break;
  }
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(m, &left))
    if (msg->msg == CURLMSG_DONE && msg->easy_handle == h) rc = msg->data.result;
  curl_multi_remove_handle(m, h);
  return rc;
}

Error transport_error(CURLcode rc, const char* detail) {
  std::string msg = detail && *detail ? std::string(detail) : curl_easy_strerror(rc);
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
      return Error(Code::kTimedOut, msg);
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SEND_FAIL_REWIND:
    case CURLE_SSL_CONNECT_ERROR:
      return Error(Code::kUnavailable, msg);
    default:
      return Error(Code::kIoError, msg);
  }
}

}  // namespace

HttpClient::HttpClient(const HttpOptions& options) : pool_(std::make_unique<Pool>()) {
  // curl_global_init is not thread-safe on old curls; do it once, before any handle.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  pool_->options = options;
  if (pool_->options.max_in_flight == 0) pool_->options.max_in_flight = 1;
}

HttpClient::~HttpClient() {
  for (CURLM* m : pool_->idle) curl_multi_cleanup(m);
}

Result<HttpResponse> HttpClient::perform(const HttpRequest& req) {
  // A fresh easy handle per request, its connection kept in the connection cache of a multi
  // handle that one request uses at a time. A reused easy handle is unsafe with libcurl
  // before 8.1.0 (Debian 12 has 7.88): it keeps a pointer to the previous transfer's last
  // header, freed when the next transfer starts, and a reply whose first header line is
  // folded (starts with a space) reads it (curl issue 11101; found by
  // fuzz/peer_object_reply_fuzz.cc). Any server could crash the process that way.
  CURLM* m = nullptr;
  {
    UniqueLock lock(pool_->mu);
    pool_->cv.wait(lock, [&]() SLUICE_REQUIRES(pool_->mu) {
      return pool_->in_use < pool_->options.max_in_flight;
    });
    ++pool_->in_use;
    if (!pool_->idle.empty()) {
      m = pool_->idle.back();
      pool_->idle.pop_back();
    }
  }
  CURL* h = curl_easy_init();
  auto release = [&](bool reuse) {
    if (h) curl_easy_cleanup(h);  // the request's pointers go with it
    MutexLock lock(pool_->mu);
    --pool_->in_use;
    if (m && reuse) {
      pool_->idle.push_back(m);  // keeps the live connection and DNS cache
    } else if (m) {
      curl_multi_cleanup(m);
    }
    pool_->cv.notify_one();
  };
  if (!m) m = curl_multi_init();
  if (!m || !h) {
    release(false);
    return fail(Code::kInternal, "curl_multi_init or curl_easy_init failed");
  }

  HttpResponse resp;
  Transfer t{&req, &resp, h, pool_->options.max_body_bytes};
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(h, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, pool_->options.connect_timeout_ms);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, pool_->options.low_speed_time_s);
  if (pool_->options.timeout_ms > 0)
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, pool_->options.timeout_ms);
  if (pool_->options.http_only) curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  if (req.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_upload);
    curl_easy_setopt(h, CURLOPT_READDATA, &t);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else if (req.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else if (req.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  struct curl_slist* headers = nullptr;
  for (auto& [k, v] : req.headers)
    headers = curl_slist_append(headers, (v.empty() ? k + ";" : k + ": " + v).c_str());
  // No "Expect: 100-continue" round trip before uploads, and no body rewriting.
  headers = curl_slist_append(headers, "Expect:");
  // An empty POST sends no form content type, unless the caller gave one.
  const bool typed = std::any_of(req.headers.begin(), req.headers.end(), [](const auto& kv) {
    return strcasecmp(kv.first.c_str(), "Content-Type") == 0;
  });
  if (req.method == "POST" && req.body.empty() && !typed)
    headers = curl_slist_append(headers, "Content-Type:");
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);

  CURLcode rc = run_transfer(m, h);
  curl_slist_free_all(headers);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp.status);
  const bool overflow = resp.sink_overflow || resp.body_overflow;
  if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && overflow)) {
    Error e = transport_error(rc, errbuf);
    release(false);
    return std::unexpected(std::move(e));
  }
  release(!overflow);
  return resp;
}

std::string HttpClient::escape(std::string_view text) {
  // The handle argument is ignored by libcurl since 7.82.
  char* e = curl_easy_escape(nullptr, text.data(), static_cast<int>(text.size()));
  std::string out = e ? e : "";
  curl_free(e);
  return out;
}

}  // namespace sluice::http
