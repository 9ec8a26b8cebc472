// The NVMe tier: one file per chunk under DIR/chunks/, and an append-only index log
// (DIR/index.log, docs/formats/cache-index.md) that says which files hold which chunks.
//
// Crash safety without fsync on the hot path: a chunk file is written completely before its
// index record is appended, so after kill -9 a file without a record (a fill cut short) is
// deleted at open and never served. A record whose file is missing or has the wrong size is
// dropped at open. What a power loss could still leave (a record whose bytes did not reach
// the disk) fails its checksum on read and is refetched. The log ends at its first record
// that fails its own checksum (a torn append); it is cut there at open.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/chunk.h"
#include "sluice/core/fd.h"
#include "sluice/telemetry/registry.h"

namespace sluice::io {
class Context;
}

namespace sluice::cache {

class DiskTier {
 public:
  struct Options {
    std::string directory;
    uint64_t capacity = 0;
    uint64_t chunk_size = 4ULL << 20;  // recorded in the index; another size is refused
    PolicyKind policy = PolicyKind::kS3Fifo;
    std::shared_ptr<io::Context> io;
    telemetry::Counter* evictions = nullptr;  // chunks evicted for room; may be null
  };
  // Takes the directory's lock (Unavailable if another process holds it), replays the
  // index, deletes orphan chunk files.
  static Result<std::unique_ptr<DiskTier>> open(Options options);
  ~DiskTier();

  struct Entry {
    ChunkKey key;
    uint64_t file_id = 0;
    uint64_t length = 0;
    uint64_t xxh3 = 0;
    uint64_t object_size = 0;
    int64_t object_mtime_ns = 0;
    bool pinned = false;
    bool ready = false;  // written and recorded; readable
  };

  // The entry of a readable chunk (a hit for the policy), or nullopt.
  std::optional<Entry> find(const ChunkKey& key);
  // Whether the chunk is here or being written (not a hit).
  bool contains(const ChunkKey& key) const;
  // Reads the chunk of `e` into dst (e.length bytes) and checks its checksum. A mismatch is
  // Corruption and drops the chunk; NotFound means it was evicted meanwhile.
  Status read(const Entry& e, std::span<std::byte> dst);
  // Admits and writes a chunk. false: the policy refused it, or it was already there.
  Result<bool> write(const Chunk& chunk, bool pinned);

  size_t drop_if(const std::function<bool(const ChunkKey&)>& match);
  size_t pin_if(const std::function<bool(const ChunkKey&)>& match, bool pinned);
  void declare(std::span<const ChunkId> order);

  std::string path_of(uint64_t file_id) const;
  std::vector<Entry> entries() const;  // ready ones
  uint64_t bytes() const;
  uint64_t chunk_count() const;
  uint64_t capacity() const { return options_.capacity; }
  // How the data path reads chunk files ("direct+io_uring", ...).
  std::string io_path() const;

  // What open found: records replayed, chunk files dropped, the log's torn tail cut.
  struct OpenReport {
    uint64_t restored = 0, dropped = 0, orphans = 0;
    bool truncated_tail = false;
  };
  const OpenReport& open_report() const { return open_report_; }

 private:
  explicit DiskTier(Options options);
  Status lock_directory();
  Status replay();
  Status explain_header(std::span<const std::byte> head, const std::string& path) const;
  Status open_log_for_append();
  // Appends one record; compacts the log when most of it is dead. Serialised by log_mu_.
  Status append_add(const Entry& e);
  Status append_remove(uint64_t file_id);
  Status append_locked(std::span<const std::byte> record);
  Status compact_locked();
  // Removes entries (under mu_) and returns their file ids, to unlink and record outside.
  void forget_locked(ChunkId id, std::vector<uint64_t>& files);
  void discard(const std::vector<uint64_t>& files);

  Options options_;
  UniqueFd lock_fd_;
  OpenReport open_report_;

  mutable std::mutex mu_;
  std::unique_ptr<EvictionPolicy> policy_;      // guarded by mu_
  std::unordered_map<ChunkId, Entry> entries_;  // guarded by mu_
  uint64_t next_file_id_ = 1;                   // guarded by mu_

  // Lock order: log_mu_ may be held while taking mu_ (compaction), never the reverse.
  std::mutex log_mu_;
  UniqueFd log_fd_;           // guarded by log_mu_
  uint64_t log_records_ = 0;  // guarded by log_mu_
};

}  // namespace sluice::cache
