// sluice/cache/control.h: looking after a node's cache (what it holds, warm, pin, evict,
// verify), the same calls whether this process owns the cache directory (DirectoryControl,
// the embedded cache) or sluiced does (node::DaemonControl, over its socket).
// client::Session::cache_control() picks the one a node has; `sluice cache` is built on it.
//
// A place in the cache is a backing store's URI (`s3://bucket/prefix`, `file:///`) and a key
// or key prefix in it. An empty store URI, where allowed, means every store the cache holds
// (through sluiced: every root the caller's team may read).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cache/tiered_cache.h"
#include "sluice/core/status.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/node/stats.h"
#include "sluice/store/store.h"

namespace sluice::cache {

// The chunks a listing found; `truncated` when the cache sent only the first of them.
struct ChunkListing {
  std::vector<CachedChunk> chunks;
  bool truncated = false;
};

// What one backing store has in the cache (`sluice cache stat` of a directory).
struct StoreHolding {
  std::string store;  // its URI
  uint64_t objects = 0, chunks = 0, bytes = 0, pinned_chunks = 0;
};
// `chunks` (in a listing's order: by store, then key) summed per store, in store order.
std::vector<StoreHolding> holdings_by_store(const std::vector<CachedChunk>& chunks);

// The daemon behind a DaemonControl.
struct DaemonStatus {
  std::string socket, team;
  int64_t pid = 0;
  node::DaemonStats stats;  // its CACHE_STAT reply (docs/formats/daemon-stats.md)
};

struct ControlStatus {
  CacheStats stats;
  std::optional<DaemonStatus> daemon;  // set through sluiced
};

// What warming a range did (Control::warm).
struct Warmed {
  uint64_t size = 0;      // the object's size
  uint64_t end = 0;       // where the chunks warmed end (the object's size at most)
  uint64_t fetched = 0;   // bytes read from the source for it
  uint64_t not_kept = 0;  // bytes of its chunks no tier kept (full of pinned chunks, a quota)
  std::string etag;       // the version warmed
};

// Every call may be made from many threads at once (client::warm warms `jobs` objects
// together).
class Control {
 public:
  virtual ~Control() = default;

  virtual Result<ControlStatus> status() = 0;
  // The cached chunks of keys under `prefix` of `store_uri` (empty: of every store).
  virtual Result<ChunkListing> chunks(std::string_view store_uri, std::string_view prefix) = 0;
  // Makes the chunks holding [offset, offset + length) of `key` resident without carrying a
  // byte to this process (TieredCache::warm).
  virtual Result<Warmed> warm(std::string_view store_uri, std::string_view key, uint64_t offset,
                              uint64_t length) = 0;
  // Drops, or pins (unpins), every cached chunk under `prefix`: the number of chunks.
  virtual Result<uint64_t> evict(std::string_view store_uri, std::string_view prefix) = 0;
  virtual Result<uint64_t> pin(std::string_view store_uri, std::string_view prefix,
                               bool pinned) = 0;
  // Re-reads every NVMe chunk and checks it; corrupt ones are dropped. Unavailable through
  // sluiced, which checks every chunk it reads.
  virtual Result<VerifyReport> verify() = 0;
  // `store_uri` as read through this cache: listing it plans a warm.
  virtual Result<std::shared_ptr<store::Store>> store(std::string_view store_uri) = 0;
};

// The embedded cache: this process opens the cache directory (which no other process may
// hold). Looking (status, a listing of every store, verify) opens it without a source and
// evicts nothing, whatever size it was filled under; a call on one store opens the cache in
// front of it, with `options`. One cache is open at a time: a call on another store while
// a store() handed out is still held is Unavailable (the directory is held for the first).
class DirectoryControl final : public Control {
 public:
  using OpenStore = std::function<Result<std::unique_ptr<store::Store>>(const std::string& uri)>;
  DirectoryControl(CacheOptions options, OpenStore open_store);
  ~DirectoryControl() override;

  Result<ControlStatus> status() override;
  Result<ChunkListing> chunks(std::string_view store_uri, std::string_view prefix) override;
  Result<Warmed> warm(std::string_view store_uri, std::string_view key, uint64_t offset,
                      uint64_t length) override;
  Result<uint64_t> evict(std::string_view store_uri, std::string_view prefix) override;
  Result<uint64_t> pin(std::string_view store_uri, std::string_view prefix, bool pinned) override;
  Result<VerifyReport> verify() override;
  Result<std::shared_ptr<store::Store>> store(std::string_view store_uri) override;

 private:
  // The cache in front of `store_uri` (empty: of the directory alone), opened if another is.
  Result<std::shared_ptr<TieredCache>> open(std::string_view store_uri);

  CacheOptions options_;
  OpenStore open_store_;
  Mutex mu_;
  std::string open_uri_ SLUICE_GUARDED_BY(mu_);
  std::shared_ptr<TieredCache> cache_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::cache
