// sigv4_dump: signs requests described as JSON lines on stdin with sluice::s3::sign_v4 and
// prints one JSON line per request on stdout. Used by tests/integration/sigv4_botocore_test.py
// to compare against botocore.
//
// Input, one object per line (every field optional unless noted):
//   "method"          (required) "GET", "PUT", ...
//   "host"            (required) Host header value, e.g. "127.0.0.1:4568"
//   "path"            the wire path, already encoded; if absent it is built from:
//   "bucket"          -> "/" + uri_encode(bucket, true)
//   "key"             raw object key; if present (even "") -> "/bucket/" + uri_encode(key, false)
//   "query"           [[name, value], ...] raw, not encoded
//   "headers"         [[name, value], ...]
//   "payload_sha256"  hash to sign; if absent: sha256 of the body
//   "body_b64"        request body, base64 (used for the payload hash and "content_md5")
//   "access_key", "secret_key", "session_token", "region" (default "us-east-1"),
//   "service" (default "s3"), "time" (unix seconds, required)
// Output, one object per input line:
//   {"authorization", "canonical_request", "string_to_sign", "path", "query_string",
//    "headers": [[name, value], ...], "content_md5"}  or  {"error": "..."} for a bad line.
// Exits 1 if any line was bad, 0 otherwise.
#include <openssl/evp.h>

#include <cstddef>
#include <ctime>
#include <iostream>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "s3/sigv4.h"

namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;
using nlohmann::json;

Pairs pairs_of(const json& j, const char* field) {
  Pairs out;
  if (!j.contains(field)) return out;
  for (const json& p : j.at(field)) {
    if (!p.is_array() || p.size() != 2)
      throw std::invalid_argument(std::string(field) + " entries must be [name, value]");
    out.emplace_back(p.at(0).get<std::string>(), p.at(1).get<std::string>());
  }
  return out;
}

std::string base64_decode(const std::string& in) {
  std::string out(3 * (in.size() / 4) + 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  if (n < 0) throw std::invalid_argument("body_b64 is not base64");
  std::size_t len = static_cast<std::size_t>(n);
  // EVP_DecodeBlock counts the padding as zero bytes; drop them.
  if (!in.empty() && in.back() == '=') --len;
  if (in.size() > 1 && in[in.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

json process(const json& in) {
  using sluice::s3::uri_encode;
  sluice::s3::SigningRequest req;
  req.method = in.at("method").get<std::string>();
  req.host = in.at("host").get<std::string>();
  if (in.contains("path")) {
    req.path = in.at("path").get<std::string>();
  } else {
    req.path = "/" + uri_encode(in.value("bucket", ""), true);
    if (in.contains("key") && !in.at("key").is_null())
      req.path += "/" + uri_encode(in.at("key").get<std::string>(), false);
  }
  req.query = pairs_of(in, "query");
  req.headers = pairs_of(in, "headers");

  const std::string body = base64_decode(in.value("body_b64", ""));
  const auto body_bytes = std::as_bytes(std::span<const char>(body.data(), body.size()));
  req.payload_sha256 = in.contains("payload_sha256") ? in.at("payload_sha256").get<std::string>()
                                                     : sluice::s3::sha256_hex(body_bytes);

  sluice::s3::Credentials creds{in.value("access_key", ""), in.value("secret_key", ""),
                                in.value("session_token", "")};
  const auto now = static_cast<std::time_t>(in.at("time").get<long long>());
  sluice::s3::SignedRequest s = sluice::s3::sign_v4(req, creds, in.value("region", "us-east-1"),
                                                    in.value("service", "s3"), now);

  json out;
  out["authorization"] = "";
  json headers = json::array();
  for (const auto& [name, value] : s.headers) {
    if (name == "Authorization") out["authorization"] = value;
    headers.push_back({name, value});
  }
  out["headers"] = std::move(headers);
  out["canonical_request"] = s.canonical_request;
  out["string_to_sign"] = s.string_to_sign;
  out["path"] = req.path;
  out["query_string"] = sluice::s3::canonical_query(req.query);
  out["content_md5"] = sluice::s3::md5_base64(body_bytes);
  return out;
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  int bad = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    json out;
    try {
      out = process(json::parse(line));
    } catch (const std::exception& e) {
      out = json{{"error", e.what()}};
      ++bad;
    }
    // Invalid UTF-8 in a raw key or value is replaced rather than making dump() throw.
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  }
  std::cout.flush();
  return bad == 0 ? 0 : 1;
}
