// What the peer protocols' signatures are made of (chunk requests, the object space).
#pragma once

#include <string>
#include <string_view>

namespace sluice::peer {

// Lowercase hex of HMAC-SHA256(secret, msg); empty if OpenSSL fails.
std::string hmac_hex(std::string_view secret, std::string_view msg);
// A byte below 0x20 or 0x7f: fields with them are refused, so the newlines that join the
// fields of a signed message always separate fields.
bool has_control(std::string_view s);
// Compares two signatures without leaking where they differ; false when `a` is empty.
bool equal_in_constant_time(std::string_view a, std::string_view b);

}  // namespace sluice::peer
