// Pipelined reads of a range of one object version (sluice/client/read.h).
#include "sluice/client/read.h"

#include <algorithm>
#include <deque>
#include <future>
#include <system_error>
#include <vector>

#include "sluice/cache/read_ahead.h"
#include "sluice/mem/buffer_pool.h"

namespace sluice::client {

namespace {

// Through a cache, the whole range is declared first: the cache (or sluiced) fetches ahead
// of the reads. At most what one declaration may name (256 GiB at 4 MiB chunks): the rest is
// read without prefetch. Advice only: a refusal costs prefetch.
void declare_ahead(store::Store& src, std::string_view key, uint64_t from, uint64_t to) {
  auto* ahead = src.capability<cache::ReadAhead>();
  if (!ahead || from >= to) return;
  // (kMax - 1) chunks of bytes touch at most kMax chunks wherever they start.
  const uint64_t most =
      (cache::kMaxDeclaredChunks - 1) * std::max<uint64_t>(ahead->chunk_size(), 1);
  cache::PlannedRead whole{std::string(key), from, std::min(to - from, most)};
  (void)ahead->declare(std::span(&whole, 1));
}

}  // namespace

Status read_range(store::Store& src, std::string_view key, const store::ObjectInfo& info,
                  const ReadRangeOptions& o,
                  const std::function<Status(std::span<const std::byte>)>& sink) {
  const uint64_t to = std::min(info.size, o.end.value_or(info.size));
  const uint64_t from = std::min(o.offset, to);
  if (o.window == 0 || o.depth == 0)
    return fail(Code::kInvalidArgument, "read_range: window and depth must be at least 1");
  declare_ahead(src, key, from, to);
  // Each window read on its own thread (on its own connection to sluiced) while the one
  // before is handed over, so the device and the daemon stay busy between requests.
  // Aligned for O_DIRECT: handed-off chunks are read straight into the buffers, not through
  // a bounce buffer and a copy (which cost a quarter of cat's time on a RAM-backed device).
  const size_t window = static_cast<size_t>(std::min<uint64_t>(o.window, to - from));
  std::vector<AlignedBuffer> bufs(o.depth + 1);
  store::ReadOptions ro;
  ro.if_match = info.etag;  // one version from the first byte to the last
  ro.object_size = info.size;
  // A range that starts off a 4 KiB boundary reads up to the next one first, so every later
  // window starts aligned and its whole chunks land on aligned addresses.
  auto window_at = [&](uint64_t at) {
    uint64_t len = std::min<uint64_t>(window, to - at);
    if (at % kDirectAlignment != 0)
      len = std::min<uint64_t>(len, kDirectAlignment - at % kDirectAlignment);
    return len;
  };
  auto read_window = [&](uint64_t at, AlignedBuffer& buf) -> Result<size_t> {
    if (!buf) {
      SLUICE_ASSIGN_OR_RETURN(buf, AlignedBuffer::allocate(std::max<size_t>(window, 1)));
    }
    return src.read_full(key, at, std::span(buf.data(), window_at(at)), ro);
  };
  struct Pending {
    std::future<Result<size_t>> read;
    size_t buf = 0;
    uint64_t at = 0, len = 0;
  };
  // The buffers go round: the reads in flight and the window being handed over always hold
  // depth + 1 different ones.
  std::deque<Pending> pending;
  uint64_t next_at = from;
  size_t next_buf = 0;
  auto launch = [&] {
    Pending p{{}, next_buf, next_at, window_at(next_at)};
    // The first runs on this thread when it is waited for; the others on their own.
    auto policy = pending.empty() ? std::launch::deferred : std::launch::async;
    try {
      p.read = std::async(policy, read_window, p.at, std::ref(bufs[p.buf]));
    } catch (const std::system_error&) {  // no thread to be had: read it when waited for
      p.read = std::async(std::launch::deferred, read_window, p.at, std::ref(bufs[p.buf]));
    }
    next_at += p.len;
    next_buf = (next_buf + 1) % bufs.size();
    pending.push_back(std::move(p));
  };
  auto fill_pipe = [&] {
    while (pending.size() < o.depth && next_at < to) launch();
  };
  // Reads write into bufs: every one started is waited for before they go away.
  auto fail_with = [&](const Error& e) -> Status {
    for (Pending& p : pending) {
      // A deferred read has not started (and would run now if waited for).
      if (p.read.wait_for(std::chrono::seconds(0)) != std::future_status::deferred) p.read.wait();
    }
    return std::unexpected(e);
  };
  fill_pipe();
  while (!pending.empty()) {
    Pending p = std::move(pending.front());
    pending.pop_front();
    Result<size_t> n = p.read.get();
    if (!n) return fail_with(n.error());
    if (*n != p.len)
      return fail_with(Error(Code::kCorruption, "'" + std::string(key) + "' ended at byte " +
                                                    std::to_string(p.at + *n) +
                                                    ", before its size " +
                                                    std::to_string(info.size)));
    fill_pipe();
    if (Status st = sink(std::span<const std::byte>(bufs[p.buf].data(), *n)); !st)
      return fail_with(st.error());
  }
  return ok();
}

}  // namespace sluice::client
