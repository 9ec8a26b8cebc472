#include "object_space.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "sluice/core/hash.h"

namespace sluice::node {

namespace {

using nlohmann::json;

unsigned status_of(Code c) {
  switch (c) {
    case Code::kNotFound:
      return 404;
    case Code::kAlreadyExists:
      return 409;
    case Code::kConflict:
      return 412;
    case Code::kPermissionDenied:
      return 403;
    case Code::kInvalidArgument:
      return 400;
    case Code::kNoSpace:
    case Code::kQuotaExceeded:
      return 507;
    case Code::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

Result<uint64_t> number(std::string_view s, std::string_view what) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size())
    return fail(Code::kInvalidArgument,
                std::string(what) + " '" + std::string(s) + "' is not a number");
  return v;
}

std::string fresh_upload_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

json info_json(const store::ObjectInfo& i) {
  return {{"key", i.key}, {"size", i.size}, {"etag", i.etag}, {"mtime_ns", i.mtime_ns}};
}

}  // namespace

Result<std::unique_ptr<ObjectSpace>> ObjectSpace::open(ObjectSpaceOptions o) {
  if (!o.membership)
    return fail(Code::kInvalidArgument, "an object space needs the job's membership");
  if (o.secret.size() < 16)
    return fail(Code::kInvalidArgument, "an object space needs the node secret");
  std::error_code ec;
  std::filesystem::create_directories(o.directory, ec);
  if (ec)
    return fail(Code::kIoError, "object space directory " + o.directory + ": " + ec.message());
  SLUICE_ASSIGN_OR_RETURN(
      auto s, store::open_store("file://" + std::filesystem::absolute(o.directory).string()));
  return std::unique_ptr<ObjectSpace>(new ObjectSpace(std::move(o), std::move(s)));
}

ObjectSpace::ObjectSpace(ObjectSpaceOptions o, std::unique_ptr<store::Store> s)
    : o_(std::move(o)), store_(std::move(s)) {}

ObjectSpace::~ObjectSpace() = default;  // open uploads are aborted with their writers

ObjectReply ObjectSpace::handle(const peer::ObjectRequest& r, std::string_view signature,
                                std::span<const std::byte> body) {
  auto refuse = [](const Error& e) {
    return ObjectReply{status_of(e.code()), e.message() + "\n", "", "text/plain"};
  };
  if (auto st = peer::verify_object_request(r, signature, o_.secret, std::time(nullptr)); !st)
    return refuse(st.error());
  const auto& ms = o_.membership->members();
  if (std::none_of(ms.begin(), ms.end(), [&](const peer::Member& m) { return m.name == r.node; }))
    return refuse(Error(Code::kPermissionDenied, "'" + r.node + "' is not a member of this job"));
  if (r.target != o_.membership->self().name)
    return refuse(Error(Code::kPermissionDenied, "request for '" + r.target + "' sent to '" +
                                                     o_.membership->self().name + "'"));
  auto reply = dispatch(r, body);
  if (!reply) return refuse(reply.error());
  return std::move(*reply);
}

Result<ObjectReply> ObjectSpace::dispatch(const peer::ObjectRequest& r,
                                          std::span<const std::byte> body) {
  auto want = [&](const char* method) -> Status {
    if (r.method != method)
      return fail(Code::kInvalidArgument, "op " + r.op + " takes " + method + ", not " + r.method);
    if (!body.empty() && r.op != "part")
      return fail(Code::kInvalidArgument, "op " + r.op + " takes no body");
    return ok();
  };
  if (r.op == "stat") {
    SLUICE_RETURN_IF_ERROR(want("GET"));
    SLUICE_ASSIGN_OR_RETURN(auto info, store_->stat(r.key));
    return ObjectReply{200, info_json(info).dump(), info.etag};
  }
  if (r.op == "read") {
    SLUICE_RETURN_IF_ERROR(want("GET"));
    SLUICE_ASSIGN_OR_RETURN(uint64_t offset, number(r.a, "offset"));
    SLUICE_ASSIGN_OR_RETURN(uint64_t length, number(r.b, "length"));
    if (length > peer::kMaxObjectPart)
      return fail(Code::kInvalidArgument, "a read of " + r.b + " bytes (at most 16 MiB at once)");
    SLUICE_ASSIGN_OR_RETURN(auto info, store_->stat(r.key));
    if (!r.c.empty() && r.c != info.etag)
      return fail(Code::kConflict, "'" + r.key + "' is no longer version " + r.c);
    ObjectReply reply{200, std::string(length, '\0'), info.etag, "application/octet-stream"};
    store::ReadOptions ro;
    ro.if_match = info.etag;
    SLUICE_ASSIGN_OR_RETURN(
        size_t n,
        store_->read_full(r.key, offset, std::as_writable_bytes(std::span(reply.body)), ro));
    reply.body.resize(n);
    return reply;
  }
  if (r.op == "list") {
    SLUICE_RETURN_IF_ERROR(want("GET"));
    store::ListOptions lo;
    lo.prefix = r.key;
    lo.continuation = r.a;
    SLUICE_ASSIGN_OR_RETURN(uint64_t max, number(r.b, "max_keys"));
    lo.max_keys = std::clamp<uint64_t>(max, 1, 1000);
    SLUICE_ASSIGN_OR_RETURN(auto page, store_->list(lo));
    json objects = json::array();
    for (const auto& i : page.objects) objects.push_back(info_json(i));
    return ObjectReply{200,
                       json{{"objects", std::move(objects)}, {"next", page.next_token}}.dump()};
  }
  if (r.op == "remove") {
    SLUICE_RETURN_IF_ERROR(want("DELETE"));
    SLUICE_RETURN_IF_ERROR(store_->remove(r.key));
    return ObjectReply{200, "{}"};
  }
  if (r.op == "begin") {
    SLUICE_RETURN_IF_ERROR(want("POST"));
    return begin(r);
  }
  if (r.op == "part") {
    SLUICE_RETURN_IF_ERROR(want("PUT"));
    return part(r, body);
  }
  if (r.op == "commit") {
    SLUICE_RETURN_IF_ERROR(want("POST"));
    return finish(r, true);
  }
  if (r.op == "abort") {
    SLUICE_RETURN_IF_ERROR(want("DELETE"));
    return finish(r, false);
  }
  return fail(Code::kInvalidArgument, "no op '" + r.op + "'");
}

void ObjectSpace::drop_idle() {
  const auto cutoff = std::chrono::steady_clock::now() - o_.upload_idle;
  std::erase_if(uploads_, [&](const auto& kv) {
    return kv.second->busy == 0 && kv.second->last_used < cutoff;  // its writer aborts
  });
}

Result<ObjectReply> ObjectSpace::begin(const peer::ObjectRequest& r) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(r.key));
  store::WriteOptions wo;
  wo.overwrite = r.b != "0";
  if (!r.a.empty()) {
    SLUICE_ASSIGN_OR_RETURN(uint64_t hint, number(r.a, "size hint"));
    wo.size_hint = hint;  // file:// reserves the blocks: a full disk fails here, not midway
  }
  {
    MutexLock lk(mu_);
    drop_idle();
    if (uploads_.size() >= o_.max_uploads)
      return fail(Code::kUnavailable,
                  "too many uploads open on this node (" + std::to_string(o_.max_uploads) + ")");
  }
  SLUICE_ASSIGN_OR_RETURN(auto writer, store_->create(r.key, wo));
  auto u = std::make_shared<Upload>();
  u->key = r.key;
  u->node = r.node;
  u->writer = std::move(writer);
  u->last_used = std::chrono::steady_clock::now();
  const std::string id = fresh_upload_id();
  MutexLock lk(mu_);
  uploads_[id] = std::move(u);
  return ObjectReply{200, json{{"upload", id}}.dump()};
}

Result<ObjectReply> ObjectSpace::part(const peer::ObjectRequest& r,
                                      std::span<const std::byte> body) {
  SLUICE_ASSIGN_OR_RETURN(uint64_t offset, number(r.a, "offset"));
  char sum[17];
  std::snprintf(sum, sizeof sum, "%016llx",
                static_cast<unsigned long long>(xxh3_64(body.data(), body.size())));
  if (r.body_xxh3 != sum) return fail(Code::kInvalidArgument, "the part's body fails its checksum");
  std::shared_ptr<Upload> u;
  {
    MutexLock lk(mu_);
    auto it = uploads_.find(r.key);
    if (it == uploads_.end() || it->second->node != r.node)
      return fail(Code::kNotFound, "no upload " + r.key + " of '" + r.node + "'");
    u = it->second;
    ++u->busy;
    u->last_used = std::chrono::steady_clock::now();
  }
  Status st = u->writer->write_at(offset, body);  // file:// writers take parts concurrently
  MutexLock lk(mu_);
  --u->busy;
  if (!st) {
    uploads_.erase(r.key);  // a failed writer is aborted: the upload is over
    return std::unexpected(st.error());
  }
  return ObjectReply{200, "{}"};
}

Result<ObjectReply> ObjectSpace::finish(const peer::ObjectRequest& r, bool commit) {
  std::shared_ptr<Upload> u;
  {
    MutexLock lk(mu_);
    auto it = uploads_.find(r.key);
    if (it == uploads_.end() || it->second->node != r.node)
      return fail(Code::kNotFound, "no upload " + r.key + " of '" + r.node + "'");
    if (it->second->busy)
      return fail(Code::kConflict, "upload " + r.key + " still has parts being written");
    u = it->second;
    uploads_.erase(it);
  }
  if (!commit) return ObjectReply{200, "{}"};  // u's writer aborts as it goes
  SLUICE_ASSIGN_OR_RETURN(uint64_t size, number(r.a, "size"));
  if (u->writer->size() != size)
    return fail(Code::kInvalidArgument, "upload of '" + u->key + "' holds " +
                                            std::to_string(u->writer->size()) + " bytes, not " +
                                            std::to_string(size));
  SLUICE_RETURN_IF_ERROR(u->writer->commit());
  SLUICE_ASSIGN_OR_RETURN(auto info, store_->stat(u->key));
  return ObjectReply{200, info_json(info).dump(), info.etag};
}

}  // namespace sluice::node
