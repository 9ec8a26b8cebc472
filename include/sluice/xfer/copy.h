// sluice/xfer/copy.h: copying objects between any two stores (file, s3, mem, and every
// store to come), with one concurrency budget, progress and cancellation.
//
// What a copy guarantees:
// - Nothing partial is published. The destination object appears only once every byte
//   arrived (the destination Writer commits only then); a failure or a cancel aborts the
//   writer, which leaves nothing behind (no temporary file, no multipart upload).
// - One version of the source. Every part is read pinned to the ETag and the size the
//   source reported first (ReadOptions::if_match and object_size), so an object replaced
//   mid-copy fails with Conflict instead of producing a blend; a source that ends early
//   (a file that shrank) fails with a message giving both sizes.
// - Bounded memory and concurrency. At most `concurrency` part reads are in flight across
//   every object of the copy, each holding one part-sized buffer, and never more than
//   `max_buffer_bytes` of buffers in all. Buffers are reused, not allocated per part.
// - The first part of each object is read alone: a refused or missing object costs one
//   request, and the rest of the parts are read only once that version has been seen.
// - Untrusted listings are checked: a listed key outside the requested prefix fails the
//   plan (the server is broken); one that makes no valid destination key (S3 allows "a//b"
//   and "x/../y") is set aside as a failure of that object, naming the key.
//
// Threads: the copy runs on threads it owns and returns when every object is done or
// failed. `on_progress` is called from one of them. Stores must be safe for concurrent
// calls (every sluice store is).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/store/store.h"

namespace sluice::xfer {

struct CopyProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t objects_done = 0, objects_failed = 0, objects_total = 0;
};

struct CopyOptions {
  // Part reads in flight at once, across all objects: the one concurrency budget.
  unsigned concurrency = 16;
  // Objects in progress at once (copy_all); each holds an open Writer. More jobs than
  // `concurrency` only queue for the budget: 32 jobs over 16 reads cost 40% more CPU and
  // ran 0.9x as fast as 16 on 64 KiB objects here.
  unsigned jobs = 16;
  // Parts of one object in flight at once (within `concurrency`), as rclone's and s5cmd's
  // per-file streams. On loopback s3rver, 8 or 16 streams on one 256 MiB object ran slower
  // than 4 (the server's and the client's threads contend for two cores); a far server
  // with a per-stream limit wants more.
  // 0: as many as `concurrency` (what tier-to-tier checkpoint copies use); `sluice cp` and
  // client::copy ask for 4.
  unsigned streams = 0;
  // Bytes per part read; 0 chooses from the object's size (part_size_for).
  uint64_t part_size = 0;
  // With part_size 0: the chosen part size is rounded up to a multiple of this, so parts
  // start on the source's chunk bounds (a cache's chunk size). A part that ends inside a
  // chunk shares it with the next, which reads it again where the cache cannot keep it.
  uint64_t part_align = 0;
  // The most bytes of part buffers held at once; fewer parts are read in parallel when
  // concurrency * part_size would exceed it. One part is always allowed.
  // 256 MiB: on s3rver and RGW here, more bytes in flight bought no speed, and each new
  // buffer costs its first touch (about 2 GiB/s).
  uint64_t max_buffer_bytes = uint64_t{256} << 20;
  bool overwrite = true;  // false: an existing destination fails with AlreadyExists
  // The copy gets its source's modification time (where the destination can keep it).
  bool keep_mtime = false;
  bool durable = true;  // see store::WriteOptions::durable
  // Called about every `progress_interval` while copying, and once at the end.
  std::function<void(const CopyProgress&)> on_progress;
  std::chrono::milliseconds progress_interval{200};
  // When this becomes true the copy stops at the next part boundary: open writers are
  // aborted, objects not started are skipped, and the report says cancelled.
  const std::atomic<bool>* cancel = nullptr;
};

// One object to copy. `info`, when known (from a listing), saves a stat of the source.
struct CopyItem {
  std::string src_key;
  std::string dst_key;
  std::optional<store::ObjectInfo> info;
};

struct CopyFailure {
  std::string src_key;
  Error error;
};

struct CopyReport {
  uint64_t objects = 0;  // copied
  uint64_t bytes = 0;    // bytes of the objects copied
  std::vector<CopyFailure> failures;
  bool cancelled = false;  // stopped by CopyOptions::cancel; objects not started are neither
                           // copied nor failed
  double seconds = 0;
};

// The part size used when CopyOptions::part_size is 0: the object shared among its streams,
// between 8 MiB and 32 MiB, in whole MiB. Fewer, larger requests cost less per byte on
// object stores (8 MiB parts ran at 0.5-0.7x the speed of 32 MiB ones on s3rver and RGW);
// 64 MiB ones bought nothing once a part is written as it lands.
uint64_t part_size_for(uint64_t object_size, unsigned streams = 4);

// Copies `src_key` of `src` to `dst_key` of `dst`. Returns what was copied (the source's
// info), or the error: Cancelled when stopped by options.cancel.
Result<store::ObjectInfo> copy(store::Store& src, std::string_view src_key, store::Store& dst,
                               std::string_view dst_key, const CopyOptions& options = {});

// Copies every item, `options.jobs` at a time. Never fails as a whole: each failure is in
// the report, named by its source key.
CopyReport copy_all(store::Store& src, store::Store& dst, std::span<const CopyItem> items,
                    const CopyOptions& options = {});

// What to copy, the listed objects that cannot be copied (named, with the reason), and what
// the listing left out (a file:// symlink leading out of the root: store.h's ListPage).
struct CopyPlan {
  std::vector<CopyItem> items;
  std::vector<CopyFailure> rejected;
  std::vector<store::SkippedKey> skipped;
};

// Plans the copy of every object under `src_prefix` of `src` to `dst_prefix` + the rest of
// its key (keys ending in '/', the "folder" markers of object stores, are skipped), in
// listing order. A key that makes an invalid destination key goes to `rejected`. Errors:
// the listing's, or InvalidArgument naming a listed key that lies outside the prefix.
Result<CopyPlan> plan_prefix(store::Store& src, std::string_view src_prefix,
                             std::string_view dst_prefix);

}  // namespace sluice::xfer
