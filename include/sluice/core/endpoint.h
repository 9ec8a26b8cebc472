// sluice/core/endpoint.h: whether two spellings of a server's URL name the same server.
//
//   same_endpoint("http://127.0.0.1:4568", "http://LOCALHOST:4568/")  // true
//
// Compared: scheme and host (without case), the port (the scheme's default when none is
// given, leading zeros dropped), the path (without trailing slashes). The loopback's names
// (localhost, 127.x.y.z) are one host; user information (user@) is ignored. Names are not
// resolved: two DNS names of one server differ.
#pragma once

#include <string>
#include <string_view>

namespace sluice {

// The comparable form of an endpoint URL: "scheme://host:port/path".
std::string endpoint_identity(std::string_view url);

inline bool same_endpoint(std::string_view a, std::string_view b) {
  return endpoint_identity(a) == endpoint_identity(b);
}

}  // namespace sluice
