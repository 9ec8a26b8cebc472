// sluice/client/location.h: what a user's text names: a local path, or a store URI and the
// key or prefix in it.
//
//   auto loc = client::parse_location("cache+s3://datasets/vision/shard-01.tar").value();
//   // loc.store_uri == "s3://datasets", loc.path == "vision/shard-01.tar", loc.cached
//
// A URI names a store by its scheme and first component (s3://BUCKET, mem://NAME), and the
// key or prefix in it by the rest; whether the scheme is known is open_store's to say.
// "cache+" in front of any of them (cache+s3://b/k, cache+file:///data/x) asks for reads
// through the node's cache. A plain path or file:// is local.
#pragma once

#include <string>
#include <string_view>

#include "sluice/core/status.h"

namespace sluice::client {

struct Location {
  bool local = false;
  bool cached = false;    // written with "cache+" in front: read through the node's cache
  std::string store_uri;  // "s3://bucket", "mem://name" (without "cache+"); empty if local
  std::string path;       // the local path, or the key or prefix within the store
  std::string text;       // as given, for messages
};

// "scheme://" at the start, with a scheme as RFC 3986 spells one; empty for a plain path.
std::string_view scheme_of(std::string_view s);

// InvalidArgument for text that names no path, bucket or store, or "cache+" on a plain path.
Result<Location> parse_location(const std::string& text);

// A key (or prefix) in a store, as the node's cache knows it.
struct StoreKey {
  std::string store_uri, key;
};
// What `text` (a URI, cache+ or not, or a local path) names in a store: a URI's store and
// key; a local path's from the root, as cached reads of local files name them ("file:///"
// and the absolute path without its first '/'; a '/' at the end is kept).
Result<StoreKey> store_key(const std::string& text);

}  // namespace sluice::client
