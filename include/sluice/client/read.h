// sluice/client/read.h: reading a range of one object version as fast as the store allows
// (`sluice cat`): windows read ahead on their own threads while the one before is handed to
// the caller, in order.
//
//   auto info = store->stat("shard-0001.tar").value();
//   client::read_range(*store, "shard-0001.tar", info, {}, [&](std::span<const std::byte> b) {
//     return write_somewhere(b);
//   });
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>

#include "sluice/core/status.h"
#include "sluice/store/store.h"

namespace sluice::client {

struct ReadRangeOptions {
  uint64_t offset = 0;
  std::optional<uint64_t> end;  // exclusive; unset: the object's end
  size_t window = 32 << 20;     // bytes per read (eight 4 MiB chunks)
  size_t depth = 2;             // reads in flight while the caller takes the one before
};

// Reads bytes [offset, end) of `key`, pinned to `info`'s version (a change midway is
// Conflict), and hands them to `sink` in order, window by window; the sink's error stops
// the read (every read started is waited for first). Through a cache (a store with
// cache::ReadAhead) the range is declared first, so the cache, or sluiced, fetches ahead.
// Windows are 4 KiB-aligned buffers starting on 4 KiB object offsets after the first, so
// chunks a daemon hands off land without a bounce buffer. Corruption when the object ends
// before info.size.
Status read_range(store::Store& src, std::string_view key, const store::ObjectInfo& info,
                  const ReadRangeOptions& options,
                  const std::function<Status(std::span<const std::byte>)>& sink);

}  // namespace sluice::client
