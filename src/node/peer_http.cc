// PeerHttpServer: libmicrohttpd in thread-per-connection mode; see peer_http.h.
#include "node/peer_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "node/peer_request.h"
#include "sluice/core/hash.h"

namespace sluice::node {

namespace {

unsigned http_status(Code c) {
  switch (c) {
    case Code::kInvalidArgument:
      return MHD_HTTP_BAD_REQUEST;
    case Code::kPermissionDenied:
      return MHD_HTTP_FORBIDDEN;
    case Code::kNotFound:
      return MHD_HTTP_NOT_FOUND;
    case Code::kConflict:
      return MHD_HTTP_PRECONDITION_FAILED;
    case Code::kUnsupported:  // not the owner of this chunk here: the memberships differ
      return 421;
    case Code::kUnavailable:
    case Code::kTimedOut:
      return MHD_HTTP_SERVICE_UNAVAILABLE;
    default:
      return MHD_HTTP_INTERNAL_SERVER_ERROR;
  }
}

// Owns a response body (a T) until MHD is done with it.
template <class T>
void free_body(void* cls) {
  delete static_cast<T*>(cls);
}

MHD_Result queue_text(MHD_Connection* c, unsigned status, std::string text,
                      const char* type = "text/plain; charset=utf-8") {
  auto* body = new std::vector<std::byte>(text.size());
  std::memcpy(body->data(), text.data(), text.size());
  MHD_Response* r = MHD_create_response_from_buffer_with_free_callback_cls(
      body->size(), body->data(), &free_body<std::vector<std::byte>>, body);
  if (!r) {
    delete body;
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_Result q = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return q;
}

// What libmicrohttpd parsed of a request, for peer_request.h.
RequestValues values_of(MHD_Connection* c) {
  return {
      [c](const char* name) { return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name); },
      [c](const char* name) { return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name); }};
}

}  // namespace

struct PeerHttpServer::Impl {
  PeerHttpOptions o;
  MHD_Daemon* daemon = nullptr;
  uint16_t port = 0;

  void log(const std::string& line) const {
    if (o.log) o.log(line);
  }

  MHD_Result serve_chunk(MHD_Connection* c) {
    std::string signature;
    auto req = parse_chunk_request(values_of(c), signature);
    if (!req) return queue_text(c, MHD_HTTP_BAD_REQUEST, req.error().message() + "\n");
    auto body = o.chunk(*req, signature);  // logs what it refuses
    if (!body)
      return queue_text(c, http_status(body.error().code()), body.error().message() + "\n");
    MHD_Response* r = nullptr;
    if (body->fd.valid()) {
      // MHD owns the descriptor from here (closed when the response is destroyed) and sends
      // it with sendfile.
      int fd = body->fd.release();
      r = MHD_create_response_from_fd_at_offset64(body->length, fd, body->file_offset);
      if (!r) ::close(fd);
    } else {
      auto* bytes = new FrameBytes(std::move(body->bytes));
      r = MHD_create_response_from_buffer_with_free_callback_cls(bytes->size(), bytes->data(),
                                                                 &free_body<FrameBytes>, bytes);
      if (!r) delete bytes;
    }
    if (!r) return MHD_NO;
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(body->xxh3));
    MHD_add_response_header(r, "X-Sluice-Xxh3", sum);
    MHD_add_response_header(r, "X-Sluice-Etag", body->etag.c_str());
    MHD_add_response_header(r, "X-Sluice-Reply-Signature", body->reply_signature.c_str());
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    MHD_Result q = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return q;
  }

  // An object request being received: its body grows as MHD hands it over.
  struct ObjectCall {
    Impl* self;
    std::vector<std::byte> body;
    uint64_t reserved = 0;  // of max_body_bytes
    std::string refusal;    // set when the body is refused; answered once it is drained
    ~ObjectCall() { self->body_bytes.fetch_sub(reserved); }
  };
  std::atomic<uint64_t> body_bytes{0};

  static void on_completed(void* /*cls*/, MHD_Connection* /*c*/, void** state,
                           enum MHD_RequestTerminationCode /*why*/) {
    if (*state && *state != &seen_headers) delete static_cast<ObjectCall*>(*state);
    *state = nullptr;
  }

  MHD_Result serve_object(MHD_Connection* c, const char* method, ObjectCall& call) {
    std::string sig;
    auto r = parse_object_request(values_of(c), method, sig);
    if (!r) return queue_text(c, MHD_HTTP_BAD_REQUEST, r.error().message() + "\n");
    ObjectReply reply = o.object(*r, sig, call.body);
    if (reply.status != 200) return queue_text(c, reply.status, reply.body);
    const uint64_t sum = xxh3_64(reply.body.data(), reply.body.size());
    const std::string signature =
        peer::sign_chunk_reply(sig, reply.etag, reply.body.size(), sum, o.secret);
    auto* bytes = new std::string(std::move(reply.body));
    MHD_Response* resp = MHD_create_response_from_buffer_with_free_callback_cls(
        bytes->size(), bytes->data(), [](void* b) { delete static_cast<std::string*>(b); }, bytes);
    if (!resp) {
      delete bytes;
      return MHD_NO;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(sum));
    MHD_add_response_header(resp, "X-Sluice-Xxh3", hex);
    MHD_add_response_header(resp, "X-Sluice-Etag", reply.etag.c_str());
    MHD_add_response_header(resp, "X-Sluice-Reply-Signature", signature.c_str());
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, reply.content_type.c_str());
    MHD_Result q = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return q;
  }

  // The object space: the first call (headers) decides whether a body may come; later
  // calls take the body; the last one (no more data) answers.
  MHD_Result on_object(MHD_Connection* c, const char* method, const char* upload_data,
                       size_t* upload_size, void** state) {
    if (*state == nullptr) {
      auto call = std::make_unique<ObjectCall>();
      call->self = this;
      const char* cl =
          MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      uint64_t len = 0;
      if (cl) std::from_chars(cl, cl + std::strlen(cl), len);
      if (len > 0) {
        if (std::strcmp(method, "PUT") != 0 || len > peer::kMaxObjectPart) {
          call->refusal = "a body only with PUT, at most 16 MiB\n";
        } else if (body_bytes.fetch_add(len) + len > o.max_body_bytes) {
          body_bytes.fetch_sub(len);
          call->refusal = "busy: too many uploads in progress\n";
        } else {
          call->reserved = len;
          call->body.reserve(len);
        }
      }
      *state = call.release();
      return MHD_YES;
    }
    auto* call = static_cast<ObjectCall*>(*state);
    if (*upload_size != 0) {
      if (call->refusal.empty() && call->body.size() + *upload_size <= call->reserved) {
        const auto* d = reinterpret_cast<const std::byte*>(upload_data);
        call->body.insert(call->body.end(), d, d + *upload_size);
      } else if (call->refusal.empty()) {
        call->refusal = "the body is longer than its Content-Length\n";
      }
      *upload_size = 0;
      return MHD_YES;
    }
    if (!call->refusal.empty())
      return queue_text(
          c,
          call->refusal.starts_with("busy") ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_BAD_REQUEST,
          call->refusal);
    return serve_object(c, method, *call);
  }

  static inline int seen_headers = 0;

  static MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method,
                               const char* /*version*/, const char* upload_data,
                               size_t* upload_size, void** state) {
    auto* self = static_cast<Impl*>(cls);
    if (std::string_view(url) == "/v1/object" && self->o.object) {
      try {
        return self->on_object(c, method, upload_data, upload_size, state);
      } catch (const std::exception& e) {  // bad_alloc from a body or a reply
        self->log(std::string("HTTP ") + url + ": " + e.what());
        return queue_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal error\n");
      }
    }
    // Anything else but GET is refused on the headers, before a body is read.
    if (std::strcmp(method, "GET") != 0)
      return queue_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n");
    if (*state == nullptr) {  // headers only so far: answer once the request is whole
      *state = &seen_headers;
      return MHD_YES;
    }
    if (*upload_size != 0) {
      *upload_size = 0;  // a GET with a body: refused without reading it
      return queue_text(c, MHD_HTTP_BAD_REQUEST, "requests carry no body\n");
    }
    std::string_view path(url);
    try {
      if (path == "/metrics" && self->o.metrics)
        return queue_text(c, MHD_HTTP_OK, self->o.metrics(), "text/plain; version=0.0.4");
      if (path == "/v1/chunk" && self->o.chunk) return self->serve_chunk(c);
    } catch (const std::exception& e) {  // bad_alloc from a reply's buffer
      self->log(std::string("HTTP ") + url + ": " + e.what());
      return queue_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal error\n");
    }
    return queue_text(c, MHD_HTTP_NOT_FOUND, "no such path\n");
  }

  static void on_log(void* cls, const char* fmt, va_list ap) {
    auto* self = static_cast<Impl*>(cls);
    char line[512];
    std::vsnprintf(line, sizeof line, fmt, ap);
    std::string s(line);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    self->log("http: " + printable(s));
  }
};

Result<std::unique_ptr<PeerHttpServer>> PeerHttpServer::start(PeerHttpOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(impl->o.port);
  if (::inet_pton(AF_INET, impl->o.host.c_str(), &addr.sin_addr) != 1)
    return fail(Code::kInvalidArgument,
                "peer listen address '" + impl->o.host + "' is not an IPv4 literal");
  impl->daemon = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
      // The logger first: libmicrohttpd warns about any option given before it.
      impl->o.port, nullptr, nullptr, &Impl::on_request, impl.get(), MHD_OPTION_EXTERNAL_LOGGER,
      &Impl::on_log, impl.get(), MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_CONNECTION_LIMIT,
      impl->o.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT, impl->o.max_per_ip,
      MHD_OPTION_CONNECTION_TIMEOUT, impl->o.timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      static_cast<size_t>(32 << 10), MHD_OPTION_NOTIFY_COMPLETED, &Impl::on_completed, impl.get(),
      MHD_OPTION_END);
  if (!impl->daemon)
    return fail(Code::kUnavailable, "cannot listen on " + impl->o.host + ":" +
                                        std::to_string(impl->o.port) +
                                        " for peers (address in use, or not this host's?)");
  const MHD_DaemonInfo* info = MHD_get_daemon_info(impl->daemon, MHD_DAEMON_INFO_BIND_PORT);
  impl->port = info ? info->port : impl->o.port;
  return std::unique_ptr<PeerHttpServer>(new PeerHttpServer(std::move(impl)));
}

PeerHttpServer::PeerHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeerHttpServer::~PeerHttpServer() {
  if (impl_->daemon) MHD_stop_daemon(impl_->daemon);
}
uint16_t PeerHttpServer::port() const {
  return impl_->port;
}

}  // namespace sluice::node
