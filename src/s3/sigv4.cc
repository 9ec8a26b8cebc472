#include "s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>

namespace sluice::s3 {
namespace {

constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";
constexpr char kHexDigits[] = "0123456789abcdef";
constexpr char kUpperHexDigits[] = "0123456789ABCDEF";

std::string to_hex(const unsigned char* data, std::size_t n) {
  std::string out(n * 2, '\0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kHexDigits[data[i] >> 4];
    out[2 * i + 1] = kHexDigits[data[i] & 0xf];
  }
  return out;
}

// One-shot digest of `n` bytes with `md` into `out` (at least EVP_MAX_MD_SIZE bytes).
unsigned digest(const EVP_MD* md, const void* data, std::size_t n, unsigned char* out) {
  unsigned len = 0;
  if (EVP_Digest(data, n, out, &len, md, nullptr) != 1)
    throw std::runtime_error("sigv4: OpenSSL EVP_Digest failed");
  return len;
}

// Raw HMAC-SHA256 of `data` under `key` (both raw bytes).
std::string hmac_sha256(std::string_view key, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(),
           &len) == nullptr)
    throw std::runtime_error("sigv4: OpenSSL HMAC failed");
  return std::string(reinterpret_cast<const char*>(out.data()), len);
}

bool is_unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Trims `value` and turns every inner run of white space into one space (SigV4 "Trimall").
std::string trim_all(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  bool pending_space = false;
  for (char c : trim(value)) {
    if (is_space(c)) {
      pending_space = true;
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

bool is_generated_header(std::string_view lower_name) {
  return lower_name == "host" || lower_name == "x-amz-date" ||
         lower_name == "x-amz-content-sha256" || lower_name == "x-amz-security-token" ||
         lower_name == "authorization";
}

}  // namespace

std::string uri_encode(std::string_view s, bool encode_slash) {
  std::string out;
  out.reserve(s.size() * 3);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (is_unreserved(c) || (c == '/' && !encode_slash)) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kUpperHexDigits[c >> 4]);
      out.push_back(kUpperHexDigits[c & 0xf]);
    }
  }
  return out;
}

std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query)
    encoded.emplace_back(uri_encode(name, true), uri_encode(value, true));
  // Pairs compare by name, then value: the SigV4 order (not the order of "name=value" strings,
  // which differs when one name is a prefix of another, e.g. "a" and "a-b").
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) {
    if (!out.empty()) out.push_back('&');
    out += name;
    out.push_back('=');
    out += value;
  }
  return out;
}

std::string amz_date(std::time_t now) {
  std::tm tm{};
  if (gmtime_r(&now, &tm) == nullptr) throw std::runtime_error("sigv4: time out of range");
  char buf[32];
  const std::size_t n = std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return std::string(buf, n);
}

std::string sha256_hex(std::span<const std::byte> data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  const unsigned len = digest(EVP_sha256(), data.data(), data.size(), out.data());
  return to_hex(out.data(), len);
}

std::string sha256_hex(std::string_view data) {
  return sha256_hex(std::as_bytes(std::span<const char>(data.data(), data.size())));
}

std::string hmac_sha256_hex(std::string_view key, std::string_view data) {
  const std::string mac = hmac_sha256(key, data);
  return to_hex(reinterpret_cast<const unsigned char*>(mac.data()), mac.size());
}

std::string md5_base64(std::span<const std::byte> data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  const unsigned len = digest(EVP_md5(), data.data(), data.size(), md.data());
  // EVP_EncodeBlock writes 4 characters per 3 bytes (rounded up) plus a NUL.
  std::array<unsigned char, 4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1> b64{};
  const int n = EVP_EncodeBlock(b64.data(), md.data(), static_cast<int>(len));
  return std::string(reinterpret_cast<const char*>(b64.data()), static_cast<std::size_t>(n));
}

SignedRequest sign_v4(const SigningRequest& req, const Credentials& creds, std::string_view region,
                      std::string_view service, std::time_t now) {
  const std::string timestamp = amz_date(now);
  const std::string_view date = std::string_view(timestamp).substr(0, 8);

  // Canonical headers: lower-cased trimmed name -> values joined with ',' in the order given.
  std::map<std::string, std::string> headers;
  auto add = [&headers](const std::string& lower_name, std::string_view value) {
    auto [it, inserted] = headers.try_emplace(lower_name);
    if (!inserted) it->second.push_back(',');
    it->second += trim_all(value);
  };
  add("host", req.host);
  add("x-amz-content-sha256", req.payload_sha256);
  add("x-amz-date", timestamp);
  if (!creds.session_token.empty()) add("x-amz-security-token", creds.session_token);
  for (const auto& [name, value] : req.headers) {
    std::string lower = to_lower(trim(name));
    if (is_generated_header(lower)) continue;
    add(lower, value);
  }

  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : headers) {
    canonical_headers += name;
    canonical_headers.push_back(':');
    canonical_headers += value;
    canonical_headers.push_back('\n');
    if (!signed_headers.empty()) signed_headers.push_back(';');
    signed_headers += name;
  }

  SignedRequest out;
  std::string& cr = out.canonical_request;
  cr += req.method;
  cr.push_back('\n');
  cr += req.path.empty() ? std::string_view("/") : std::string_view(req.path);
  cr.push_back('\n');
  cr += canonical_query(req.query);
  cr.push_back('\n');
  cr += canonical_headers;
  cr.push_back('\n');
  cr += signed_headers;
  cr.push_back('\n');
  cr += req.payload_sha256;

  std::string scope;
  scope.append(date).append("/").append(region).append("/").append(service).append("/aws4_request");

  std::string& sts = out.string_to_sign;
  sts.append(kAlgorithm).append("\n");
  sts.append(timestamp).append("\n");
  sts.append(scope).append("\n");
  sts.append(sha256_hex(cr));

  const std::string k_date = hmac_sha256("AWS4" + creds.secret_key, date);
  const std::string k_region = hmac_sha256(k_date, region);
  const std::string k_service = hmac_sha256(k_region, service);
  const std::string k_signing = hmac_sha256(k_service, "aws4_request");
  const std::string signature = hmac_sha256_hex(k_signing, sts);

  std::string authorization;
  authorization.append(kAlgorithm)
      .append(" Credential=")
      .append(creds.access_key)
      .append("/")
      .append(scope)
      .append(", SignedHeaders=")
      .append(signed_headers)
      .append(", Signature=")
      .append(signature);

  out.headers.emplace_back("Authorization", std::move(authorization));
  out.headers.emplace_back("x-amz-date", timestamp);
  out.headers.emplace_back("x-amz-content-sha256", req.payload_sha256);
  if (!creds.session_token.empty())
    out.headers.emplace_back("x-amz-security-token", creds.session_token);
  return out;
}

}  // namespace sluice::s3
