// The scheme registry behind open_store. file:// and mem:// are built in; every other
// backend registers itself (s3::register_scheme), so this file never names one.
#include <algorithm>
#include <filesystem>
#include <map>

#include "sluice/core/thread_annotations.h"
#include "sluice/store/store.h"
#include "sluice/store/wrapper.h"

namespace sluice::store {
namespace {

Result<std::unique_ptr<Store>> open_file(std::string_view uri, const StoreOptions& options) {
  std::string path(uri.starts_with("file://") ? uri.substr(7) : uri);
  if (path.empty())
    return fail(Code::kInvalidArgument, "store URI '" + std::string(uri) + "' has no path");
  std::error_code ec;
  if (!options.create && !std::filesystem::exists(path, ec))
    return fail(Code::kNotFound, "store directory '" + path + "' does not exist");
  if (options.create) std::filesystem::create_directories(path, ec);
  if (ec) return fail_errno(ec.value(), "create store directory '" + path + "'");
  if (!std::filesystem::is_directory(path, ec))
    return fail(Code::kInvalidArgument, "store path '" + path + "' is not a directory");
  if (options.no_symlinked_root) return make_posix_store_without_symlinks(path);
  return make_posix_store(path);
}

Result<std::unique_ptr<Store>> open_mem(std::string_view uri, const StoreOptions&) {
  std::string name(uri.substr(6));
  if (name.empty()) return fail(Code::kInvalidArgument, "store URI 'mem://' needs a name");
  return open_named_memory_store(name);
}

struct SchemeTable {
  SchemeTable() : factories{{"file", open_file}, {"mem", open_mem}} {}
  Mutex mu;
  std::map<std::string, StoreFactory, std::less<>> factories SLUICE_GUARDED_BY(mu);
};

SchemeTable& table() {
  static SchemeTable* const table = new SchemeTable;  // never destroyed: stores may be opened
                                                      // during exit
  return *table;
}

}  // namespace

void register_scheme(std::string scheme, StoreFactory factory) {
  SchemeTable& t = table();
  MutexLock lock(t.mu);
  t.factories[std::move(scheme)] = std::move(factory);
}

std::vector<std::string> registered_schemes() {
  SchemeTable& t = table();
  MutexLock lock(t.mu);
  std::vector<std::string> out;
  for (auto& [name, f] : t.factories) out.push_back(name);
  return out;
}

Result<std::unique_ptr<Store>> open_store(std::string_view uri, const StoreOptions& options) {
  size_t sep = uri.find("://");
  // A plain path is a file:// store.
  std::string scheme = sep == std::string_view::npos ? "file" : std::string(uri.substr(0, sep));
  StoreFactory factory;
  {
    SchemeTable& t = table();
    MutexLock lock(t.mu);
    if (auto it = t.factories.find(scheme); it != t.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (auto& s : registered_schemes()) known += (known.empty() ? "" : ", ") + s + "://";
    return fail(Code::kInvalidArgument,
                "unsupported store URI '" + std::string(uri) + "': known schemes are " + known);
  }
  SLUICE_ASSIGN_OR_RETURN(auto store, factory(uri, options));
  if (options.registry) store = with_telemetry(std::move(store), *options.registry);
  return store;
}

}  // namespace sluice::store
