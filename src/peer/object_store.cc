// sluiced:// — a peer daemon's object space as a store (the client side).
#include "sluice/peer/object_store.h"

#include <xxhash.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "http/client.h"
#include "object_uri.h"
#include "signing.h"
#include "sluice/peer/peer_store.h"

namespace sluice::peer {

namespace {

using nlohmann::json;

std::string canonical(const ObjectRequest& r) {
  return "sluice-peer-object-v1\n" + r.method + "\n" + r.op + "\n" + r.node + "\n" + r.target +
         "\n" + std::to_string(r.time) + "\n" + r.key + "\n" + r.a + "\n" + r.b + "\n" + r.c +
         "\n" + r.body_xxh3;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

Result<ObjectUri> parse_object_uri(std::string_view uri) {
  std::string_view rest = uri;
  if (!rest.starts_with("sluiced://"))
    return fail(Code::kInvalidArgument, "not a sluiced:// URI: '" + std::string(uri) + "'");
  // The member and address go into the request's headers and URL as they are (a CR LF
  // would add a header), and the owner refuses every field with a control character.
  if (has_control(uri))
    return fail(Code::kInvalidArgument,
                "'" + std::string(uri) + "': a sluiced:// URI holds no control character");
  rest.remove_prefix(10);
  size_t at = rest.find('@'), slash = rest.find('/');
  if (at == std::string_view::npos || (slash != std::string_view::npos && at > slash) || at == 0)
    return fail(Code::kInvalidArgument,
                "'" + std::string(uri) + "': expected sluiced://MEMBER@HOST:PORT/folder/");
  ObjectUri w;
  w.member = std::string(rest.substr(0, at));
  std::string_view addr =
      rest.substr(at + 1, slash == std::string_view::npos ? slash : slash - at - 1);
  if (addr.empty() || addr.find(':') == std::string_view::npos)
    return fail(Code::kInvalidArgument, "'" + std::string(uri) + "': no HOST:PORT");
  w.address = std::string(addr);
  if (slash != std::string_view::npos) w.prefix = std::string(rest.substr(slash + 1));
  if (!w.prefix.empty() && w.prefix.back() != '/') w.prefix += '/';
  if (!w.prefix.empty())
    SLUICE_RETURN_IF_ERROR(store::validate_key(w.prefix.substr(0, w.prefix.size() - 1)));
  return w;
}

namespace {

struct Reply {
  long status = 0;
  std::string body;
  std::string xxh3, signature, etag;
};

class ObjectClient {
 public:
  ObjectClient(ObjectUri w, ObjectStoreOptions o)
      : w_(std::move(w)), o_(std::move(o)), http_(http_options(o_)) {}

  const ObjectUri& where() const { return w_; }
  const ObjectStoreOptions& options() const { return o_; }

  // Sends one signed request and checks the signed reply. `out` receives a read's bytes
  // (up to its size); other bodies land in Reply::body (bounded).
  Result<Reply> call(ObjectRequest r, std::span<const std::byte> body = {},
                     std::span<std::byte> out = {}) {
    r.node = o_.node;
    r.target = w_.member;
    r.time = std::time(nullptr);
    if (!body.empty() || r.op == "part") r.body_xxh3 = hex16(XXH3_64bits(body.data(), body.size()));
    const std::string sig = sign_object_request(r, o_.secret);
    using http::HttpClient;
    http::HttpRequest req;
    req.method = r.method;
    req.url = "http://" + w_.address + "/v1/object?op=" + r.op +
              "&key=" + HttpClient::escape(r.key) + "&a=" + HttpClient::escape(r.a) +
              "&b=" + HttpClient::escape(r.b) + "&c=" + HttpClient::escape(r.c);
    req.headers = {{"X-Sluice-Node", r.node},
                   {"X-Sluice-Target", r.target},
                   {"X-Sluice-Time", std::to_string(r.time)},
                   {"X-Sluice-Signature", sig},
                   {"X-Sluice-Body-Xxh3", r.body_xxh3},
                   {"Content-Type", "application/octet-stream"}};
    req.body = body;
    req.sink = out;
    auto resp = http_.perform(req);
    const std::string what = r.op + " '" + r.key + "' on " + w_.member + " (" + w_.address + ")";
    if (!resp)
      return fail(resp.error().code() == Code::kTimedOut ? Code::kTimedOut : Code::kUnavailable,
                  what + ": " + resp.error().message());
    if (resp->sink_overflow || resp->body_overflow)
      return fail(Code::kCorruption, what + ": the reply is longer than asked for");
    Reply reply;
    reply.status = resp->status;
    reply.body = std::move(resp->body);
    if (reply.status != 200) {
      std::string msg = reply.body.substr(0, 300);
      while (!msg.empty() && msg.back() == '\n') msg.pop_back();
      Code code = reply.status == 404   ? Code::kNotFound
                  : reply.status == 409 ? Code::kAlreadyExists
                  : reply.status == 412 ? Code::kConflict
                  : reply.status == 403 ? Code::kPermissionDenied
                  : reply.status == 400 ? Code::kInvalidArgument
                  : reply.status == 507 ? Code::kNoSpace
                                        : Code::kUnavailable;
      return fail(code, what + ": HTTP " + std::to_string(reply.status) + ": " + msg);
    }
    reply.xxh3 = resp->header("x-sluice-xxh3");
    reply.signature = resp->header("x-sluice-reply-signature");
    reply.etag = resp->header("x-sluice-etag");
    // The body is checked against the owner's signature over its XXH3 and length.
    std::string_view got =
        out.empty() ? std::string_view(reply.body)
                    : std::string_view(reinterpret_cast<const char*>(out.data()), resp->sink_bytes);
    const std::string sum = hex16(XXH3_64bits(got.data(), got.size()));
    uint64_t claimed = 0;
    std::from_chars(reply.xxh3.data(), reply.xxh3.data() + reply.xxh3.size(), claimed, 16);
    if (sum != reply.xxh3 ||
        !equal_in_constant_time(sign_chunk_reply(sig, reply.etag, got.size(), claimed, o_.secret),
                                reply.signature))
      return fail(Code::kCorruption, what + ": the reply fails its checksum or signature");
    if (!out.empty()) reply.body = std::to_string(resp->sink_bytes);
    return reply;
  }

 private:
  static http::HttpOptions http_options(const ObjectStoreOptions& o) {
    http::HttpOptions h;
    h.connect_timeout_ms = static_cast<long>(o.connect_timeout.count());
    h.timeout_ms = static_cast<long>(o.timeout.count());
    h.http_only = true;
    h.max_body_bytes = size_t{64} << 20;  // a listing's JSON; a read goes to the caller's buffer
    return h;
  }

  ObjectUri w_;
  ObjectStoreOptions o_;
  http::HttpClient http_;
};

// An object's fields from the owner's JSON; nullopt where one is missing or of another type
// (a float in an integer field too: converting one out of range is undefined).
std::optional<store::ObjectInfo> info_from(const json& j, std::string key) {
  if (!j.is_object()) return std::nullopt;
  auto size = j.find("size"), etag = j.find("etag"), mtime = j.find("mtime_ns");
  if (size == j.end() || !size->is_number_unsigned() || etag == j.end() || !etag->is_string() ||
      mtime == j.end() || !mtime->is_number_integer())
    return std::nullopt;
  store::ObjectInfo i;
  i.key = std::move(key);
  i.size = size->get<uint64_t>();
  i.etag = etag->get<std::string>();
  i.mtime_ns = mtime->get<int64_t>();
  return i;
}

class ObjectWriter final : public store::Writer {
 public:
  ObjectWriter(ObjectClient& client, std::string key, std::string upload)
      : client_(client), key_(std::move(key)), upload_(std::move(upload)) {}
  ~ObjectWriter() override { abort(); }

  Status append(std::span<const std::byte> data) override { return write_at(size_.load(), data); }
  bool positional() const override { return true; }
  Status write_at(uint64_t offset, std::span<const std::byte> data) override {
    if (done_) return fail(Code::kInvalidArgument, "write to a finished upload of '" + key_ + "'");
    const uint64_t part = std::min(client_.options().part_size, kMaxObjectPart);
    for (uint64_t at = 0; at < data.size(); at += part) {
      auto piece = data.subspan(at, std::min<uint64_t>(part, data.size() - at));
      ObjectRequest r{"PUT", "part", "", "", 0, upload_, std::to_string(offset + at), "", "", ""};
      auto rep = client_.call(std::move(r), piece);
      if (!rep) {
        abort();
        return std::unexpected(rep.error());
      }
    }
    uint64_t end = offset + data.size();
    for (uint64_t cur = size_.load(); end > cur && !size_.compare_exchange_weak(cur, end);) {
    }
    return ok();
  }
  Status commit() override {
    if (done_) return fail(Code::kInvalidArgument, "commit of a finished upload of '" + key_ + "'");
    ObjectRequest r{"POST", "commit", "", "", 0, upload_, std::to_string(size_.load()), "", "", ""};
    auto rep = client_.call(std::move(r));
    done_ = true;
    if (!rep) return std::unexpected(rep.error());
    return ok();
  }
  void abort() override {
    if (done_.exchange(true)) return;
    ObjectRequest r{"DELETE", "abort", "", "", 0, upload_, "", "", "", ""};
    (void)client_.call(std::move(r));  // the owner drops idle uploads anyway
  }
  uint64_t size() const override { return size_.load(); }

 private:
  ObjectClient& client_;
  std::string key_, upload_;
  std::atomic<uint64_t> size_{0};
  std::atomic<bool> done_{false};
};

class ObjectStore final : public store::Store {
 public:
  ObjectStore(std::string uri, ObjectUri w, ObjectStoreOptions o)
      : uri_(std::move(uri)), client_(std::move(w), std::move(o)) {}

  Result<store::ObjectInfo> stat(std::string_view key) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    SLUICE_ASSIGN_OR_RETURN(auto rep,
                            client_.call({"GET", "stat", "", "", 0, full(key), "", "", "", ""}));
    auto info = info_from(json::parse(rep.body, nullptr, false), std::string(key));
    if (!info)
      return fail(Code::kCorruption,
                  "stat of '" + std::string(key) + "' on " + uri_ + ": bad reply");
    return *info;
  }

  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    // One request of at most kMaxObjectPart bytes: read_full loops for the rest.
    auto into = dst.first(std::min<size_t>(dst.size(), kMaxObjectPart));
    if (into.empty()) return size_t{0};
    SLUICE_ASSIGN_OR_RETURN(
        auto rep, client_.call({"GET", "read", "", "", 0, full(key), std::to_string(offset),
                                std::to_string(into.size()), options.if_match, ""},
                               {}, into));
    size_t n = 0;
    std::from_chars(rep.body.data(), rep.body.data() + rep.body.size(), n);
    return n;
  }

  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions& options) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    SLUICE_ASSIGN_OR_RETURN(
        auto rep, client_.call({"POST", "begin", "", "", 0, full(key),
                                options.size_hint ? std::to_string(*options.size_hint) : "",
                                options.overwrite ? "1" : "0", "", ""}));
    json j = json::parse(rep.body, nullptr, false);
    if (!j.is_object() || !j.contains("upload") || !j["upload"].is_string())
      return fail(Code::kCorruption,
                  "create '" + std::string(key) + "' on " + uri_ + ": bad reply");
    return std::unique_ptr<store::Writer>(
        std::make_unique<ObjectWriter>(client_, std::string(key), j["upload"].get<std::string>()));
  }

  Result<store::ListPage> list(const store::ListOptions& options) override {
    if (options.max_keys < 1 || options.max_keys > 10000)
      return fail(Code::kInvalidArgument, "list of " + uri_ + ": max_keys must be 1 to 10000");
    const std::string& pre = client_.where().prefix;
    SLUICE_ASSIGN_OR_RETURN(
        auto rep, client_.call({"GET", "list", "", "", 0, pre + options.prefix,
                                options.continuation, std::to_string(options.max_keys), "", ""}));
    json j = json::parse(rep.body, nullptr, false);
    store::ListPage page;
    try {
      for (const json& o : j.at("objects")) {
        std::string k = o.at("key").get<std::string>();
        if (!k.starts_with(pre + options.prefix))
          return fail(Code::kCorruption,
                      "list of " + uri_ + " returned '" + k + "', outside the prefix");
        auto info = info_from(o, k.substr(pre.size()));
        if (!info) return fail(Code::kCorruption, "list of " + uri_ + ": bad reply");
        page.objects.push_back(std::move(*info));
      }
      page.next_token = j.at("next").get<std::string>();
    } catch (const json::exception&) {
      return fail(Code::kCorruption, "list of " + uri_ + ": bad reply");
    }
    return page;
  }

  Status remove(std::string_view key) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    auto rep = client_.call({"DELETE", "remove", "", "", 0, full(key), "", "", "", ""});
    if (!rep) return std::unexpected(rep.error());
    return ok();
  }

  std::string uri() const override { return uri_; }

 private:
  std::string full(std::string_view key) const { return client_.where().prefix + std::string(key); }
  std::string uri_;
  ObjectClient client_;
};

}  // namespace

std::string sign_object_request(const ObjectRequest& r, std::string_view secret) {
  return hmac_hex(secret, canonical(r));
}

Status verify_object_request(const ObjectRequest& r, std::string_view signature,
                             std::string_view secret, int64_t now, int64_t max_skew_s) {
  for (std::string_view f :
       {std::string_view(r.method), std::string_view(r.op), std::string_view(r.node),
        std::string_view(r.target), std::string_view(r.key), std::string_view(r.a),
        std::string_view(r.b), std::string_view(r.c), std::string_view(r.body_xxh3)})
    if (has_control(f))
      return fail(Code::kInvalidArgument, "a request field holds a control character");
  if (r.time < now - max_skew_s || r.time > now + max_skew_s)
    return fail(Code::kPermissionDenied,
                "object request from '" + r.node + "' signed at " + std::to_string(r.time) +
                    ", over " + std::to_string(max_skew_s) + " s from this node's clock");
  if (!equal_in_constant_time(sign_object_request(r, secret), signature))
    return fail(Code::kPermissionDenied,
                "object request from '" + r.node + "': bad signature (another node secret?)");
  return ok();
}

void register_object_scheme() {
  store::register_scheme(
      "sluiced",
      [](std::string_view uri,
         const store::StoreOptions& so) -> Result<std::unique_ptr<store::Store>> {
        const auto* o = so.backend.get<ObjectStoreOptions>();
        if (!o || o->node.empty() || o->secret.size() < 16)
          return fail(Code::kInvalidArgument,
                      "sluiced:// needs this member's name and the node secret "
                      "(peer::ObjectStoreOptions)");
        if (has_control(o->node))
          return fail(Code::kInvalidArgument,
                      "sluiced://: this member's name '" + o->node + "' holds a control character");
        SLUICE_ASSIGN_OR_RETURN(ObjectUri w, parse_object_uri(uri));
        return std::unique_ptr<store::Store>(
            std::make_unique<ObjectStore>(std::string(uri), std::move(w), *o));
      });
}

}  // namespace sluice::peer
