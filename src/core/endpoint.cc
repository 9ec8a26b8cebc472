#include "sluice/core/endpoint.h"

#include <algorithm>
#include <cctype>

namespace sluice {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// 127.0.0.1 and the rest of 127/8 in dotted digits, not a DNS name that starts with "127."
bool loopback_v4(std::string_view host) {
  return host.starts_with("127.") && std::all_of(host.begin(), host.end(), [](char c) {
           return c == '.' || std::isdigit(static_cast<unsigned char>(c));
         });
}

}  // namespace

std::string endpoint_identity(std::string_view url) {
  const size_t sep = url.find("://");
  const std::string scheme = sep == std::string_view::npos ? "http" : lower(url.substr(0, sep));
  std::string_view rest = sep == std::string_view::npos ? url : url.substr(sep + 3);
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string path = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
  while (path.ends_with('/')) path.pop_back();
  if (size_t at = authority.rfind('@'); at != std::string_view::npos)
    authority = authority.substr(at + 1);
  size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && authority.find(']', colon) != std::string_view::npos)
    colon = std::string_view::npos;  // a colon inside [v6]
  std::string host = lower(authority.substr(0, colon));
  std::string port(colon == std::string_view::npos ? "" : authority.substr(colon + 1));
  while (port.size() > 1 && port.front() == '0') port.erase(0, 1);
  if (port.empty()) port = scheme == "https" ? "443" : "80";
  if (host == "localhost" || loopback_v4(host)) host = "127.0.0.1";
  return scheme + "://" + host + ":" + port + path;
}

}  // namespace sluice
