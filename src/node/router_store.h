// The daemon's backing store: many roots (backing stores opened by URI) behind one Store,
// so one TieredCache serves them all. A key here is "<root id>/<key in the root>", the
// root id being 16 hex digits of XXH3-64 of the root's URI.
//
// Roots are attached by URI (opened once, kept open). Attached roots are remembered in
// DIR/roots ("<id> <uri>" per line, each line checked against its id when read back), so
// chunks cached before a restart can be named again. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "sluice/core/thread_annotations.h"
#include "sluice/store/store.h"

namespace sluice::node {

class RouterStore final : public store::Store {
 public:
  // `roots_file` may be empty (nothing remembered).
  RouterStore(store::StoreOptions options, std::string roots_file);

  static std::string root_id(std::string_view root_uri);

  // Opens `root_uri` if it is not open yet; returns its id.
  Result<std::string> attach(const std::string& root_uri);
  // The URI of a root id, if known (attached now or remembered).
  std::optional<std::string> root_of(std::string_view id) const;

  Result<store::ObjectInfo> stat(std::string_view key) override;
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options) override;
  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions& options) override;
  Result<store::ListPage> list(const store::ListOptions& options) override;
  Status remove(std::string_view key) override;
  std::string uri() const override { return "sluiced://"; }

 private:
  struct Route {
    store::Store* store;
    std::string id;
    std::string key;  // in the root
  };
  Result<Route> route(std::string_view key) const;

  store::StoreOptions options_;
  std::string roots_file_;
  mutable Mutex mu_;
  // The roots open now, by id; and every root known, id -> uri.
  std::map<std::string, std::unique_ptr<store::Store>, std::less<>> open_ SLUICE_GUARDED_BY(mu_);
  std::map<std::string, std::string, std::less<>> known_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::node
