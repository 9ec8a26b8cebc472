// Where the user pointed a command: a local path, or a store URI and the key or prefix in
// it. Shared by cp, cat and cache.
#pragma once

#include <string>
#include <string_view>

#include "sluice/core/status.h"

namespace sluice::cli {

struct Location {
  bool local = false;
  bool cached = false;    // written with "cache+" in front: read through the tiered cache
  std::string store_uri;  // "s3://bucket", "mem://name" (without "cache+"); empty if local
  std::string path;       // the local path, or the key or prefix within the store
  std::string text;       // as given, for messages
};

// "scheme://" at the start, with a scheme as RFC 3986 spells one; empty for a plain path.
std::string_view scheme_of(std::string_view s);

// A URI names a store by its scheme and first component (s3://BUCKET, mem://NAME), and the
// key or prefix in it by the rest; whether the scheme is known is open_store's to say.
// "cache+" in front of any of them (cache+s3://b/k, cache+file:///data/x) sets `cached`.
Result<Location> parse_location(const std::string& s);

}  // namespace sluice::cli
