// Peer-protocol requests (docs/formats/peer-protocol.md): what a daemon's HTTP port takes
// from another daemon or from anyone who can reach it. The input is one or two requests as
// libmicrohttpd would hand them over, in a line format: the method, then "name=value" lines
// (a name starting with "X-" is a header, any other a query argument), then optionally "--"
// and a second request. parse_chunk_request and parse_object_request read them, and those
// that parse are checked with the node secret (verify_chunk_request, verify_object_request):
// once with the signature sent, once signed with the secret, which must pass unless a field
// holds a control character. Two requests that differ must never share a signature.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "fuzz_util.h"
#include "node/peer_request.h"
#include "sluice/peer/object_store.h"
#include "sluice/peer/peer_store.h"

using namespace sluice;

namespace {

constexpr std::string_view kSecret = "fuzz-node-secret-0123456789";
constexpr int64_t kNow = 1'700'000'000;

struct Values {
  std::map<std::string, std::string, std::less<>> args, headers;
  node::RequestValues view() const {
    auto lookup = [](const std::map<std::string, std::string, std::less<>>& m) {
      return [&m](const char* name) -> const char* {
        auto it = m.find(std::string_view(name));
        return it == m.end() ? nullptr : it->second.c_str();  // as MHD: a C string
      };
    };
    return {lookup(args), lookup(headers)};
  }
};

// One request of the line format; `text` is left at the next one.
Values consume(std::string_view& text, std::string& method) {
  Values v;
  bool first = true;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (line == "--") break;
    if (first) {
      method = std::string(line);
      first = false;
      continue;
    }
    const size_t eq = line.find('=');
    std::string name(line.substr(0, eq));
    std::string value(eq == std::string_view::npos ? "" : line.substr(eq + 1));
    value = value.c_str();  // as MHD hands values over: C strings
    (name.starts_with("X-") ? v.headers : v.args)[name] = value;
  }
  return v;
}

bool same(const peer::ChunkRequest& a, const peer::ChunkRequest& b) {
  return a.node == b.node && a.target == b.target && a.root == b.root && a.key == b.key &&
         a.etag == b.etag && a.index == b.index && a.offset == b.offset && a.length == b.length &&
         a.verify == b.verify && a.time == b.time;
}

bool same(const peer::ObjectRequest& a, const peer::ObjectRequest& b) {
  return a.method == b.method && a.op == b.op && a.node == b.node && a.target == b.target &&
         a.time == b.time && a.key == b.key && a.a == b.a && a.b == b.b && a.c == b.c &&
         a.body_xxh3 == b.body_xxh3;
}

void chunk(const Values& first, const Values& second) {
  std::string signature, other_signature;
  auto r = node::parse_chunk_request(first.view(), signature);
  if (!r) return;
  (void)peer::verify_chunk_request(*r, signature, kSecret, kNow);
  peer::ChunkRequest signed_now = *r;
  signed_now.time = kNow;
  Status s = peer::verify_chunk_request(signed_now, peer::sign_chunk_request(signed_now, kSecret),
                                        kSecret, kNow);
  SLUICE_FUZZ_CHECK(s || s.error().code() == Code::kInvalidArgument,
                    "a chunk request signed with the secret verifies");
  auto r2 = node::parse_chunk_request(second.view(), other_signature);
  if (!r2 || !s) return;
  r2->time = kNow;
  if (!same(signed_now, *r2) &&
      peer::verify_chunk_request(*r2, peer::sign_chunk_request(*r2, kSecret), kSecret, kNow))
    SLUICE_FUZZ_CHECK(
        peer::sign_chunk_request(signed_now, kSecret) != peer::sign_chunk_request(*r2, kSecret),
        "two chunk requests never share a signature");
}

void object(const Values& first, const Values& second, const char* method) {
  std::string signature, other_signature;
  auto r = node::parse_object_request(first.view(), method, signature);
  if (!r) return;
  (void)peer::verify_object_request(*r, signature, kSecret, kNow);
  peer::ObjectRequest signed_now = *r;
  signed_now.time = kNow;
  Status s = peer::verify_object_request(signed_now, peer::sign_object_request(signed_now, kSecret),
                                         kSecret, kNow);
  SLUICE_FUZZ_CHECK(s || s.error().code() == Code::kInvalidArgument,
                    "an object request signed with the secret verifies");
  auto r2 = node::parse_object_request(second.view(), method, other_signature);
  if (!r2 || !s) return;
  r2->time = kNow;
  if (!same(signed_now, *r2) &&
      peer::verify_object_request(*r2, peer::sign_object_request(*r2, kSecret), kSecret, kNow))
    SLUICE_FUZZ_CHECK(
        peer::sign_object_request(signed_now, kSecret) != peer::sign_object_request(*r2, kSecret),
        "two object requests never share a signature");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text = fuzz::text_of(data, size);
  std::string method, other_method;
  Values first = consume(text, method);
  Values second = consume(text, other_method);
  chunk(first, second);
  object(first, second, method.c_str());
  return 0;
}
