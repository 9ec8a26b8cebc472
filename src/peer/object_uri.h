// sluiced:// URIs (sluice/peer/object_store.h), as the sluiced:// store parses them; apart
// so that fuzz/sluiced_uri_fuzz.cc can check what they parse to.
#pragma once

#include <string>
#include <string_view>

#include "sluice/core/status.h"

namespace sluice::peer {

// "sluiced://MEMBER@HOST:PORT/FOLDER/": the member, its address (HOST:PORT) and the folder
// (empty, or a valid key prefix ending in '/').
struct ObjectUri {
  std::string member, address, prefix;
};

// InvalidArgument naming the URI when it is not one.
Result<ObjectUri> parse_object_uri(std::string_view uri);

}  // namespace sluice::peer
