// Locations from user text (see location.h).
#include "sluice/client/location.h"

#include <cctype>
#include <filesystem>

namespace sluice::client {

std::string_view scheme_of(std::string_view s) {
  size_t sep = s.find("://");
  if (sep == std::string_view::npos || sep == 0) return {};
  std::string_view scheme = s.substr(0, sep);
  if (!std::islower(static_cast<unsigned char>(scheme[0]))) return {};
  for (char c : scheme)
    if (!std::islower(static_cast<unsigned char>(c)) &&
        !std::isdigit(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.')
      return {};
  return scheme;
}

Result<Location> parse_location(const std::string& given) {
  Location loc{.text = given};
  std::string s = given;
  if (s.starts_with("cache+") && !scheme_of(s).empty()) {
    loc.cached = true;
    s = s.substr(6);
  }
  std::string_view scheme = scheme_of(s);
  if (scheme.empty() || scheme == "file") {
    if (loc.cached && scheme.empty())
      return fail(Code::kInvalidArgument,
                  "'" + given + "': cache+ needs a scheme (cache+file://...)");
    loc.local = true;
    loc.path = scheme.empty() ? s : s.substr(7);
    if (loc.path.empty()) return fail(Code::kInvalidArgument, "'" + given + "' names no path");
    return loc;
  }
  std::string rest = s.substr(scheme.size() + 3);
  size_t slash = rest.find('/');
  if (rest.empty() || slash == 0)
    return fail(Code::kInvalidArgument,
                "'" + given + "' names no " + (scheme == "s3" ? "bucket" : "store"));
  loc.store_uri = std::string(scheme) + "://" + rest.substr(0, slash);
  if (slash != std::string::npos) loc.path = rest.substr(slash + 1);
  return loc;
}

Result<StoreKey> store_key(const std::string& text) {
  SLUICE_ASSIGN_OR_RETURN(Location loc, parse_location(text));
  if (!loc.local) return StoreKey{loc.store_uri, loc.path};
  std::error_code ec;  // a path the file system refuses is an error, not a throw
  std::filesystem::path p = std::filesystem::weakly_canonical(loc.path, ec);
  if (ec) return fail_errno(ec.value(), "resolve '" + loc.path + "'");
  StoreKey k{"file:///", p.string().substr(1)};
  if (loc.path.ends_with('/') && !k.key.empty() && !k.key.ends_with('/')) k.key += '/';
  return k;
}

}  // namespace sluice::client
