// sluice/client/copy.h: `sluice cp` as a call. Copies one object, or every object under a
// prefix, between any two locations a Session opens (local paths, s3://, mem://, cache+),
// with xfer::copy_all: nothing partial is ever left at a destination, writes under a
// project are charged to its team, and a source read through the node's cache says what
// the cache (or sluiced) served.
//
//   client::CopyRequest r{.src = "s3://datasets/train/", .dst = "/scratch/train/",
//                         .recursive = true};
//   client::CopySummary s = client::copy(session, r).value();
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sluice/client/session.h"
#include "sluice/core/status.h"
#include "sluice/xfer/copy.h"

namespace sluice::client {

struct CopyRequest {
  // Locations as client::parse_location reads them. One object: a local source must be a
  // regular file (a FIFO or device would never end), and a destination that is a directory
  // or ends in '/' gets the source's name. `recursive`: prefixes (a local source is a
  // directory).
  std::string src, dst;
  bool recursive = false;
  unsigned jobs = 16;      // objects copied at once (recursive)
  uint64_t part_size = 0;  // bytes per part; 0 chooses from each object's size
  unsigned streams = 4;    // parts of one object in flight at once (xfer::CopyOptions)
  bool durable = false;    // make each local file durable before it is renamed into place
  bool cache = false;      // read the source through the node's cache (as cache+ does)
  const std::atomic<bool>* cancel = nullptr;  // stop at the next part; nothing partial left
  std::function<void(const xfer::CopyProgress&)> on_progress;
};

struct CopyFailure {
  std::string source;  // the source object's URI
  Error error;
};

struct CopySummary {
  uint64_t objects = 0, bytes = 0, retries = 0;
  double seconds = 0;
  bool cancelled = false;
  std::vector<CopyFailure> failures;  // the other objects were copied
  // What a recursive copy's listing left out (a local symlink leading out of the source
  // folder): not copied, not a failure; the CLI and Python name each.
  std::vector<store::SkippedKey> skipped;
  bool cached = false;  // read through the embedded cache: where bytes came from
  uint64_t cache_hit_bytes = 0, cache_miss_bytes = 0;
  uint64_t cache_not_kept = 0;  // chunks the NVMe tier could not take (full, failing)
  bool via_daemon = false;      // through sluiced: what came as descriptors, what inline
  uint64_t handoff_bytes = 0, inline_bytes = 0;
};

// Returns the summary even when objects failed or the copy was cancelled; an error only
// when nothing could start (a bad location, a source and destination that overlap, a
// failed listing, a source that is a FIFO). session.options().s3.max_in_flight bounds the
// parts in flight across every object.
Result<CopySummary> copy(const Session& session, const CopyRequest& request);

}  // namespace sluice::client
