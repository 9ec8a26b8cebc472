// sluice/client/object.h: the one object (or prefix) a user's text names, opened the way
// sluice does, for calls that take a URI rather than a store and a key (`sluice cat`, the
// Python module's open, read_into and ls).
//
//   auto obj = client::open_object(session, "s3://bucket/shard-0001.tar", {}).value();
//   auto info = obj.store->stat(obj.key).value();
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "sluice/client/session.h"
#include "sluice/core/status.h"
#include "sluice/store/store.h"

namespace sluice::client {

struct ObjectRef {
  std::unique_ptr<store::Store> store;
  std::string key;      // the object's key in `store` (a prefix for listings)
  std::string text;     // as given, for messages
  bool cached = false;  // read through the node's cache
};

struct ObjectOpen {
  // Read through the node's cache (sluiced, else the embedded cache), as "cache+" asks.
  bool through_cache = false;
  // For a writer: a missing local directory is made. Readers get NotFound for it.
  bool writes = false;
  // The text names a prefix (a listing): an empty key or one ending in '/' is allowed.
  bool prefix = false;
};

// The store and key `text` names: a local path (its directory as a file:// store and its
// name), a store URI (s3://bucket/key, mem://name/key, file:///dir/key), or either with
// "cache+" in front. InvalidArgument for text that names a prefix where an object is asked
// for (or "cache+" with `writes`: writes never go through the cache).
Result<ObjectRef> open_object(const Session& session, const std::string& text,
                              const ObjectOpen& how = {});

// Every object under the prefix `text` names (a local directory: every file under it),
// keys relative to the store `open_object` opens for it. `recursive` false: only the
// objects directly under it, and the folders below as keys ending in '/' (size 0). What the
// listing left out (a local symlink leading out of the folder: store.h's ListPage) is
// appended to `skipped` when given.
Result<std::vector<store::ObjectInfo>> list_objects(
    const Session& session, const std::string& text, bool recursive,
    std::vector<store::SkippedKey>* skipped = nullptr);

}  // namespace sluice::client
