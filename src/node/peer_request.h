// The peer port's requests (docs/formats/peer-protocol.md) from what the HTTP server parsed:
// a GET /v1/chunk's query arguments and headers, and a /v1/object request's. Kept apart from
// libmicrohttpd (peer_http.cc) so the parsing is tested and fuzzed without a socket
// (fuzz/peer_request_fuzz.cc). Every value is untrusted; signatures are checked later, by
// the handlers.
#pragma once

#include <functional>
#include <string>

#include "sluice/core/status.h"
#include "sluice/peer/object_store.h"
#include "sluice/peer/peer_store.h"

namespace sluice::node {

// A request's values: a query argument's or a header's (case-insensitive name), or null
// when the request has none of that name.
struct RequestValues {
  std::function<const char*(const char* name)> arg;
  std::function<const char*(const char* name)> header;
};

// GET /v1/chunk: every field is required (InvalidArgument naming the first missing or
// malformed one); `signature` gets X-Sluice-Signature.
Result<peer::ChunkRequest> parse_chunk_request(const RequestValues& v, std::string& signature);

// A /v1/object request made with `method`: missing fields are empty; only a malformed
// X-Sluice-Time is refused (InvalidArgument "bad X-Sluice-Time").
Result<peer::ObjectRequest> parse_object_request(const RequestValues& v, const char* method,
                                                 std::string& signature);

}  // namespace sluice::node
