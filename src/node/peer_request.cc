#include "node/peer_request.h"

#include <charconv>
#include <cstring>

namespace sluice::node {

namespace {

Result<uint64_t> arg_u64(const RequestValues& v, const char* name) {
  const char* s = v.arg(name);
  uint64_t out = 0;
  if (!s) return fail(Code::kInvalidArgument, std::string("missing ") + name);
  auto [end, ec] = std::from_chars(s, s + std::strlen(s), out);
  if (ec != std::errc() || *end != '\0' || *s == '\0')
    return fail(Code::kInvalidArgument, std::string(name) + " must be an unsigned integer");
  return out;
}

Result<std::string> required(const std::function<const char*(const char*)>& lookup,
                             const char* name) {
  const char* s = lookup(name);
  if (!s) return fail(Code::kInvalidArgument, std::string("missing ") + name);
  return std::string(s);
}

}  // namespace

Result<peer::ChunkRequest> parse_chunk_request(const RequestValues& v, std::string& signature) {
  peer::ChunkRequest r;
  SLUICE_ASSIGN_OR_RETURN(r.root, required(v.arg, "root"));
  SLUICE_ASSIGN_OR_RETURN(r.key, required(v.arg, "key"));
  SLUICE_ASSIGN_OR_RETURN(r.etag, required(v.arg, "etag"));
  SLUICE_ASSIGN_OR_RETURN(r.index, arg_u64(v, "index"));
  SLUICE_ASSIGN_OR_RETURN(r.offset, arg_u64(v, "offset"));
  SLUICE_ASSIGN_OR_RETURN(r.length, arg_u64(v, "length"));
  const char* verify = v.arg("verify");
  r.verify = verify && std::strcmp(verify, "1") == 0;
  SLUICE_ASSIGN_OR_RETURN(r.node, required(v.header, "X-Sluice-Node"));
  SLUICE_ASSIGN_OR_RETURN(r.target, required(v.header, "X-Sluice-Target"));
  SLUICE_ASSIGN_OR_RETURN(std::string t, required(v.header, "X-Sluice-Time"));
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), r.time);
  if (ec != std::errc() || end != t.data() + t.size())
    return fail(Code::kInvalidArgument, "X-Sluice-Time must be unix seconds");
  SLUICE_ASSIGN_OR_RETURN(signature, required(v.header, "X-Sluice-Signature"));
  return r;
}

Result<peer::ObjectRequest> parse_object_request(const RequestValues& v, const char* method,
                                                 std::string& signature) {
  auto text = [](const char* s) { return std::string(s ? s : ""); };
  peer::ObjectRequest r;
  r.method = method;
  r.op = text(v.arg("op"));
  r.key = text(v.arg("key"));
  r.a = text(v.arg("a"));
  r.b = text(v.arg("b"));
  r.c = text(v.arg("c"));
  r.node = text(v.header("X-Sluice-Node"));
  r.target = text(v.header("X-Sluice-Target"));
  r.body_xxh3 = text(v.header("X-Sluice-Body-Xxh3"));
  std::string t = text(v.header("X-Sluice-Time"));
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), r.time);
  if (ec != std::errc() || p != t.data() + t.size())
    return fail(Code::kInvalidArgument, "bad X-Sluice-Time");
  signature = text(v.header("X-Sluice-Signature"));
  return r;
}

}  // namespace sluice::node
