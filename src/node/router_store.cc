#include "node/router_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <xxhash.h>

#include "sluice/core/fd.h"

namespace sluice::node {

std::string RouterStore::root_id(std::string_view root_uri) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(root_uri.data(), root_uri.size())));
  return hex;
}

RouterStore::RouterStore(store::StoreOptions options, std::string roots_file)
    : options_(std::move(options)), roots_file_(std::move(roots_file)) {
  if (roots_file_.empty()) return;
  std::ifstream in(roots_file_);
  std::string line;
  while (std::getline(in, line)) {
    size_t sp = line.find(' ');
    if (sp != 16) continue;
    std::string id = line.substr(0, sp), uri = line.substr(sp + 1);
    if (root_id(uri) == id) known_.emplace(std::move(id), std::move(uri));  // else torn: skip
  }
}

Result<std::string> RouterStore::attach(const std::string& root_uri) {
  std::string id = root_id(root_uri);
  MutexLock lock(mu_);
  auto k = known_.find(id);
  if (k != known_.end() && k->second != root_uri)
    return fail(Code::kConflict, "root '" + root_uri + "' has the same id as '" + k->second + "'");
  if (open_.contains(id)) return id;
  // A root names a directory of keys: "s3://b/ds" holds "ds/fan", never "dsfan" (object
  // stores take a prefix as it is given, so the separator is added here).
  std::string open_uri = root_uri;
  size_t sep = open_uri.find("://");
  if (!open_uri.starts_with("file://") && sep != std::string::npos &&
      open_uri.find('/', sep + 3) != std::string::npos && !open_uri.ends_with('/'))
    open_uri += '/';
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, store::open_store(open_uri, options_));
  open_.emplace(id, std::move(s));
  if (k == known_.end()) {
    known_.emplace(id, root_uri);
    if (!roots_file_.empty()) {
      // One write(2) per line with O_APPEND: a crash leaves whole lines, or a torn last
      // one that fails its id check when read back.
      UniqueFd fd(::open(roots_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
      std::string line = id + " " + root_uri + "\n";
      if (fd.valid()) {
        (void)write_full(fd.get(), std::as_bytes(std::span(line.data(), line.size())), roots_file_);
      }
    }
  }
  return id;
}

std::optional<std::string> RouterStore::root_of(std::string_view id) const {
  MutexLock lock(mu_);
  auto it = known_.find(id);
  if (it == known_.end()) return std::nullopt;
  return it->second;
}

Result<RouterStore::Route> RouterStore::route(std::string_view key) const {
  size_t slash = key.find('/');
  std::string_view id = key.substr(0, slash);
  MutexLock lock(mu_);
  auto it = open_.find(id);
  if (slash == std::string_view::npos || it == open_.end())
    return fail(Code::kNotFound, "'" + std::string(key) + "': no such root is open");
  return Route{it->second.get(), std::string(id), std::string(key.substr(slash + 1))};
}

Result<store::ObjectInfo> RouterStore::stat(std::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(Route r, route(key));
  SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, r.store->stat(r.key));
  info.key = std::string(key);
  return info;
}

Result<size_t> RouterStore::read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                                 const store::ReadOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(Route r, route(key));
  return r.store->read(r.key, offset, dst, options);
}

Result<std::unique_ptr<store::Writer>> RouterStore::create(std::string_view key,
                                                           const store::WriteOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(Route r, route(key));
  return r.store->create(r.key, options);
}

Result<store::ListPage> RouterStore::list(const store::ListOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(Route r, route(options.prefix));
  store::ListOptions o = options;
  o.prefix = r.key;
  SLUICE_ASSIGN_OR_RETURN(store::ListPage page, r.store->list(o));
  for (store::ObjectInfo& info : page.objects) info.key = r.id + "/" + info.key;
  for (store::SkippedKey& s : page.skipped) s.key = r.id + "/" + s.key;
  return page;
}

Status RouterStore::remove(std::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(Route r, route(key));
  return r.store->remove(r.key);
}

}  // namespace sluice::node
