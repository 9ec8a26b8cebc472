// s3/sigv4.h: AWS Signature Version 4 request signing, as S3 checks it (Authorization header,
// payload in a single chunk, signed or UNSIGNED-PAYLOAD).
//
// Contract
//   - Every function here is pure: it reads only its arguments (and the clock value the caller
//     passes in), keeps no state, caches nothing and returns new strings the caller owns. All
//     are safe to call from any thread at the same time. Nothing here does I/O.
//   - The caller owns the request description. sign_v4 does not send anything: it returns the
//     headers the caller must add to the request it sends, and the request it sends must carry
//     exactly the method, Host, path, query string and extra headers that were signed.
//   - The caller builds the wire form: `path` already URI-encoded with uri_encode(key, false)
//     per segment (S3 does not encode twice and does not normalise `.`/`..` or `//`), and the
//     URL query string taken from canonical_query(query), so the query on the wire is byte for
//     byte the one that was signed.
//   - Failure: the inputs cannot be malformed in a way that makes signing fail, so there is no
//     Result here. If OpenSSL itself fails to compute a digest (it cannot on a sane build; it
//     would mean allocation failure or a broken crypto provider), std::runtime_error is thrown.
//
// Canonicalisation (AWS SigV4 documentation, matched against botocore's S3SigV4Auth):
//   - CanonicalRequest = METHOD \n path \n canonical_query \n canonical headers \n \n
//     signed-header list \n payload hash. An empty path is signed (and must be sent) as "/".
//   - Signed headers: `host` (req.host), `x-amz-content-sha256` (req.payload_sha256),
//     `x-amz-date` (from `now`), `x-amz-security-token` when creds.session_token is non-empty,
//     and every header in req.headers. Names are lower-cased and trimmed; values are trimmed and
//     each inner run of ASCII white space becomes one space. Repeated names (in any case) are
//     signed once, their values joined with "," in the order given. Headers sign_v4 produces
//     itself (Host, X-Amz-Date, X-Amz-Content-SHA256, X-Amz-Security-Token, Authorization) are
//     ignored if they also appear in req.headers.
//   - The Authorization value is "AWS4-HMAC-SHA256 Credential=AK/scope, SignedHeaders=...,
//     Signature=..." with ", " between its parts, exactly as botocore writes it (S3 accepts the
//     AWS documentation's "," form too).
//   - Header values are signed as raw bytes: only ASCII white space is trimmed, so keep header
//     values ASCII (non-ASCII header values are not portable HTTP anyway).
#pragma once

#include <cstddef>
#include <ctime>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::s3 {

// SHA-256 of the empty string: the payload hash of a request without a body.
inline constexpr std::string_view kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// The payload hash to sign when the body is not hashed (S3 only; safe only over TLS).
inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

struct Credentials {
  std::string access_key, secret_key, session_token;  // session_token empty: none
};

struct SigningRequest {
  std::string method;  // "GET", "PUT", ...: upper case, exactly as sent
  std::string host;    // value of the Host header as sent, e.g. "127.0.0.1:4568"
  std::string path;    // the path exactly as sent on the wire, already URI-encoded
  // Raw (not encoded) name/value pairs; the value may be empty, e.g. {"uploads", ""}.
  std::vector<std::pair<std::string, std::string>> query;
  // Extra headers to sign (and send), names in any case, e.g. {"Range", "bytes=0-9"}.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256;  // lower-case hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
};

struct SignedRequest {
  // Headers the caller must add: Authorization, x-amz-date, x-amz-content-sha256, and
  // x-amz-security-token when the session token is non-empty.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string canonical_request;  // for debugging and tests
  std::string string_to_sign;
};

// Signs `req` for `service` ("s3") in `region` at time `now` (seconds since the epoch, UTC).
SignedRequest sign_v4(const SigningRequest& req, const Credentials& creds, std::string_view region,
                      std::string_view service, std::time_t now);

// RFC 3986 percent-encoding: unreserved bytes (A-Z a-z 0-9 - . _ ~) are kept, every other
// byte becomes %XX with upper-case hex; '/' is kept when encode_slash is false (object keys in
// paths), encoded when it is true (query names and values). Bytes, not characters: UTF-8 input
// is encoded byte by byte.
std::string uri_encode(std::string_view s, bool encode_slash);

// The canonical query string: each name and value uri_encode(..., true)'d, sorted by encoded
// name then encoded value, joined as "a=b&c=" (a pair with an empty value keeps its '=').
// Use it as the URL query string too, so the wire and the signature agree.
std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query);

// "20130524T000000Z": the x-amz-date form of `now`, in UTC.
std::string amz_date(std::time_t now);

// Lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::span<const std::byte> data);
std::string sha256_hex(std::string_view data);

// Lower-case hex HMAC-SHA256 of `data` under `key` (for tests).
std::string hmac_sha256_hex(std::string_view key, std::string_view data);

// Base64 of the MD5 of `data`: the value of a Content-MD5 header.
std::string md5_base64(std::span<const std::byte> data);

}  // namespace sluice::s3
