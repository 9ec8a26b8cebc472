// The object a user's text names (sluice/client/object.h).
#include "sluice/client/object.h"

#include <filesystem>
#include <set>

#include "sluice/client/location.h"

namespace sluice::client {

namespace fs = std::filesystem;

Result<ObjectRef> open_object(const Session& session, const std::string& text,
                              const ObjectOpen& how) {
  SLUICE_ASSIGN_OR_RETURN(Location loc, parse_location(text));
  ObjectRef ref;
  ref.text = text;
  ref.cached = loc.cached || how.through_cache;
  if (ref.cached && how.writes)
    return fail(Code::kInvalidArgument,
                "'" + text + "': writes never go through the node's cache (drop cache+)");
  std::string store_uri;
  if (ref.cached) {
    SLUICE_ASSIGN_OR_RETURN(StoreKey k, store_key(text));
    store_uri = k.store_uri;
    ref.key = k.key;
  } else if (loc.local && how.prefix) {
    store_uri = "file://" + loc.path;
  } else if (loc.local) {
    fs::path p(loc.path);
    store_uri = "file://" + (p.has_parent_path() ? p.parent_path().string() : std::string("."));
    ref.key = p.filename().string();
  } else {
    store_uri = loc.store_uri;
    ref.key = loc.path;
  }
  if (!how.prefix && (ref.key.empty() || ref.key.ends_with('/')))
    return fail(Code::kInvalidArgument, "'" + text + "' names a prefix, not an object");
  OpenOptions oo{.create = how.writes};
  if (ref.cached) {
    SLUICE_ASSIGN_OR_RETURN(ref.store, session.open_cached(store_uri, oo));
  } else {
    SLUICE_ASSIGN_OR_RETURN(ref.store, session.open_store(store_uri, oo));
  }
  return ref;
}

Result<std::vector<store::ObjectInfo>> list_objects(const Session& session, const std::string& text,
                                                    bool recursive,
                                                    std::vector<store::SkippedKey>* skipped) {
  SLUICE_ASSIGN_OR_RETURN(ObjectRef ref, open_object(session, text, {.prefix = true}));
  SLUICE_ASSIGN_OR_RETURN(auto all, ref.store->list_all(ref.key, skipped));
  if (recursive) return all;
  // One level: the objects directly under the prefix, and each folder below it once.
  std::vector<store::ObjectInfo> out;
  std::set<std::string> folders;
  for (auto& o : all) {
    size_t slash = o.key.find('/', ref.key.size());
    if (slash == std::string::npos) {
      out.push_back(std::move(o));
    } else if (folders.insert(o.key.substr(0, slash + 1)).second) {
      out.push_back(store::ObjectInfo{.key = o.key.substr(0, slash + 1)});
    }
  }
  return out;
}

}  // namespace sluice::client
