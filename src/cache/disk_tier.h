// The NVMe tier: chunks in segment files under DIR/chunks/, and an append-only index log
// (DIR/index.log, docs/formats/cache-index.md) that says where each chunk lies.
//
// A segment holds chunks of one object version only (a process handed a segment's
// descriptor can read nothing it could not read anyway), appended at 4 KiB-aligned offsets
// and never rewritten: up to 256 MiB of a large object's chunks share one file, so filling
// a large object creates one file per 256 MiB instead of one per chunk (inode allocation
// and directory updates dominated cold fills). An evicted chunk's pages are freed at once
// with FALLOC_FL_PUNCH_HOLE; a segment whose last chunk goes is unlinked. Where the file
// system cannot punch holes, every chunk gets its own segment. Segments are not appended
// to after a restart.
//
// Crash safety without fsync on the hot path: a chunk is written completely before its
// index record is appended, so after kill -9 bytes without a record (a fill cut short) are
// freed at open and never served. A record whose segment is missing or too short is
// dropped at open. What a power loss could still leave (a record whose bytes did not reach
// the disk) fails its checksum on read and is refetched. The log ends at its first record
// that fails its own checksum (a torn append); it is cut there at open.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/chunk.h"
#include "sluice/core/fd.h"
#include "sluice/core/thread_annotations.h"
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
    // Charging (CacheOptions::admit_chunk): `admit` is asked before a chunk is written,
    // with its bytes on disk (nullopt: it is not kept; else the chunk's charge tag, kept in
    // its entry); `adopt` gives the tag of each chunk found at open; `freed` is told the tag
    // and bytes when a chunk with a non-zero tag leaves. Null: nothing is charged.
    std::function<std::optional<uint32_t>(const ChunkKey&, uint64_t bytes)> admit;
    std::function<uint32_t(const ChunkKey&, uint64_t bytes)> adopt;
    std::function<void(uint32_t tag, uint64_t bytes)> freed;
  };
  // The chunk size recorded in `directory`'s index; none when it has no index yet.
  static Result<std::optional<uint64_t>> recorded_chunk_size(const std::string& directory);
  // Takes the directory's lock (Unavailable if another process holds it), replays the
  // index, deletes orphan chunk files.
  static Result<std::unique_ptr<DiskTier>> open(Options options);
  ~DiskTier();

  struct Entry {
    ChunkKey key;
    uint64_t file_id = 0;  // segment << 16 | 4 KiB page of the segment where it starts
    uint64_t length = 0;
    uint64_t xxh3 = 0;
    uint64_t object_size = 0;
    int64_t object_mtime_ns = 0;
    bool pinned = false;
    bool ready = false;   // written and recorded; readable
    uint32_t charge = 0;  // its charge tag (Options::admit); not recorded in the index
  };

  // The entry of a readable chunk (a hit for the policy), or nullopt.
  std::optional<Entry> find(const ChunkKey& key);
  // Whether the chunk is here or being written (not a hit).
  bool contains(const ChunkKey& key) const;
  // Reads the chunk of `e` into dst (e.length bytes) and checks its checksum. A mismatch is
  // Corruption and drops the chunk; NotFound means it was evicted meanwhile.
  Status read(const Entry& e, std::span<std::byte> dst);
  // Admits and writes a chunk. false: the policy refused it, or it was already there.
  // Safe from many threads at once. Chunks of one object written with the same `lane`
  // append to one segment; give concurrent writers of one object different lanes, or
  // their appends take turns on the segment's inode lock (an extending write holds it).
  Result<bool> write(const ChunkView& chunk, bool pinned, uint64_t lane = 0);

  // `write` in steps, for bytes that arrive over time (a download written as it lands):
  // `begin` admits and places the chunk (its view's bytes are only measured; nullopt: not
  // kept), `put_bytes` writes its bytes (again, to replace them) and keeps their checksum
  // (`xxh3` when the caller has it, else computed), and `finish` records the chunk with the
  // checksum of what the last `put_bytes` wrote, or gives its place back when `written`
  // failed. Until finished the chunk holds its room and is invisible to readers; it may be
  // evicted meanwhile (finish then frees it). Every begun chunk must be finished, once:
  // a Pending can only be moved, and `finish` takes it.
  struct Pending {
    Entry entry;  // entry.xxh3: of the bytes the last put_bytes wrote
    Pending(Entry e) : entry(std::move(e)) {}
    Pending(Pending&&) = default;
    Pending& operator=(Pending&&) = default;
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
  };
  Result<std::optional<Pending>> begin(const ChunkView& chunk, bool pinned, uint64_t lane = 0);
  Status put_bytes(Pending& p, std::span<const std::byte> bytes,
                   std::optional<uint64_t> xxh3 = std::nullopt);
  Result<bool> finish(Pending&& p, Status written);

  size_t drop_if(const std::function<bool(const ChunkKey&)>& match);
  size_t pin_if(const std::function<bool(const ChunkKey&)>& match, bool pinned);
  void declare(std::span<const ChunkId> order);

  // The segment file holding the chunk `file_id`, and where in it the chunk starts.
  std::string path_of(uint64_t file_id) const;
  static uint64_t offset_of(uint64_t file_id);
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
  // Open: the log's live records, the segments they name, then the index and policy.
  struct LogReplay {
    std::unordered_map<uint64_t, Entry> live;  // by file id
    std::vector<uint64_t> order;               // file ids, oldest add first (again after a remove)
    uint64_t max_id = 0;                       // the highest file id any add named
  };
  Status replay();
  Result<LogReplay> read_log();
  std::unordered_map<uint64_t, uint64_t> scan_segments(const LogReplay& log);  // -> sizes
  void restore(const LogReplay& log, const std::unordered_map<uint64_t, uint64_t>& kept);
  Status explain_header(std::span<const std::byte> head, const std::string& path) const;
  Status open_log_for_append();
  // Appends one record; compacts the log when most of it is dead. Serialised by log_mu_.
  Status append_remove(uint64_t file_id);
  Status append_locked(std::span<const std::byte> record) SLUICE_REQUIRES(log_mu_);
  Status compact_locked() SLUICE_REQUIRES(log_mu_);
  // A chunk forgotten: its pages to free (or its segment to unlink, when it was the last
  // chunk there) and its removal to record, outside mu_.
  struct Gone {
    uint64_t file_id = 0, length = 0;
    bool last = false;
    uint32_t charge = 0;  // for Options::freed
  };
  // Removes entries and returns what to free and record outside.
  void forget_locked(ChunkId id, std::vector<Gone>& gone) SLUICE_REQUIRES(mu_);
  void discard(const std::vector<Gone>& gone);
  // A segment and page for a chunk of `e`'s object written in `lane`.
  uint64_t place_locked(const Entry& e, uint64_t lane) SLUICE_REQUIRES(mu_);
  // Frees [offset, offset + length) of a segment's file (punches a hole).
  void free_pages(const std::string& path, uint64_t offset, uint64_t length);

  Options options_;
  UniqueFd lock_fd_;
  OpenReport open_report_;

  mutable Mutex mu_;
  std::unique_ptr<EvictionPolicy> policy_ SLUICE_GUARDED_BY(mu_);
  std::unordered_map<ChunkId, Entry> entries_ SLUICE_GUARDED_BY(mu_);
  uint64_t next_segment_ SLUICE_GUARDED_BY(mu_) = 1;  // never reused
  struct Segment {
    uint64_t chunks = 0;    // live chunks (written or being written)
    std::string appending;  // its key in appending_ while chunks are appended to it
  };
  std::unordered_map<uint64_t, Segment> segments_ SLUICE_GUARDED_BY(mu_);  // by number
  // Where the next chunk of a multi-chunk object version goes, by object and lane.
  struct Appending {
    uint64_t segment = 0, next_page = 0;
  };
  std::unordered_map<std::string, Appending> appending_ SLUICE_GUARDED_BY(mu_);
  bool punch_holes_ = true;  // the file system frees a punched range (probed at open)

  // Lock order: log_mu_ may be held while taking mu_ (compaction), never the reverse.
  Mutex log_mu_;
  UniqueFd log_fd_ SLUICE_GUARDED_BY(log_mu_);
  uint64_t log_records_ SLUICE_GUARDED_BY(log_mu_) = 0;
};

}  // namespace sluice::cache
