// Looking after the cache: pins (and DIR/pins), evict, warm, verify, listing its chunks.
#include "cache/tiered_cache_impl.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <tuple>

namespace sluice::cache {

namespace {

std::function<bool(const ChunkKey&)> key_under(std::string store, std::string prefix) {
  return [store = std::move(store), prefix = std::move(prefix)](const ChunkKey& c) {
    return c.store == store && c.key.starts_with(prefix);
  };
}

}  // namespace

// DIR/pins: one line per pinned prefix, "<store id>\t<prefix>", for every store.
std::string TieredCache::Impl::pins_path() const {
  return options.directory + "/pins";
}

void TieredCache::Impl::load_pins() {
  if (options.directory.empty()) return;
  std::ifstream in(pins_path());
  std::string line;
  MutexLock lock(pin_mu);
  while (std::getline(in, line)) {
    size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    std::string store = line.substr(0, tab), prefix = line.substr(tab + 1);
    if (store == store_id) {
      pinned_prefixes.push_back(prefix);
    } else {
      other_pins.push_back(line);
    }
    // Every store's pins hold in the NVMe tier, whichever store this cache reads.
    if (disk) (void)disk->pin_if(key_under(store, prefix), true);
  }
}

// Writes DIR/pins from the pins now: one writer at a time (two at once interleaved their
// bytes in pins.new), the state read under that writer's turn (so the file ends as the
// last state), made durable before and after the rename.
Status TieredCache::Impl::save_pins() {
  if (options.directory.empty()) return ok();
  MutexLock one_writer(pins_file_mu);
  std::string text;
  {
    MutexLock lock(pin_mu);
    for (const std::string& l : other_pins) text += l + "\n";
    for (const std::string& p : pinned_prefixes) text += store_id + "\t" + p + "\n";
  }
  std::string tmp = pins_path() + ".new";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return fail_errno(errno, "create " + tmp);
    SLUICE_RETURN_IF_ERROR(write_full(fd.get(), std::as_bytes(std::span(text)), tmp));
    if (::fdatasync(fd.get()) != 0) return fail_errno(errno, "fdatasync " + tmp);
  }
  if (::rename(tmp.c_str(), pins_path().c_str()) != 0) return fail_errno(errno, "rename " + tmp);
  UniqueFd dir(::open(options.directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return fail_errno(errno, "open " + options.directory);
  return sync_directory(dir.get(), options.directory);
}

bool TieredCache::Impl::pinned(const std::string& key) const {
  MutexLock lock(pin_mu);
  return std::any_of(pinned_prefixes.begin(), pinned_prefixes.end(),
                     [&](const std::string& p) { return key.starts_with(p); });
}

// Drops the queued NVMe writes of chunks that `match`, so an evict is not undone by writes
// that were waiting; the one being written is waited for (the caller then drops it from
// the NVMe tier). Returns the writes dropped.
template <class Match>
uint64_t TieredCache::Impl::drop_queued(const Match& match) {
  UniqueLock lock(wq_mu);
  uint64_t n = 0;
  for (auto it = wq.empty() ? wq.end() : std::next(wq.begin()); it != wq.end();) {
    if (match((*it)->key)) {
      wq_bytes -= round_up((*it)->length);
      it = wq.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  if (n > 0) wq_room.notify_all();
  if (!wq.empty() && match(wq.front()->key)) {
    const std::shared_ptr<const Chunk> writing = wq.front();
    wq_room.wait(lock,
                 [&]() SLUICE_REQUIRES(wq_mu) { return wq.empty() || wq.front() != writing; });
  }
  return n;
}

// TieredCache::warm for one version: whole chunks from the one holding `offset`.
Result<TieredCache::Warmed> TieredCache::Impl::warm_version(const store::ObjectInfo& info,
                                                            uint64_t offset, uint64_t length) {
  TieredCache::Warmed w{info, 0, 0};
  if (offset >= info.size || length == 0) {
    w.end = std::min(offset, info.size);
    return w;
  }
  const uint64_t cs = options.chunk_size;
  const uint64_t last = (offset + std::min(length, info.size - offset) - 1) / cs;
  w.end = std::min(info.size, (last + 1) * cs);
  AlignedBuffer scratch;  // one run's bytes: 4 KiB-aligned, so NVMe writes go from it
  for (uint64_t index = offset / cs; index <= last;) {
    const uint64_t len = chunk_length(info.size, index);
    ChunkKey key{store_id, info.key, info.etag, index};
    if (resident_now(key)) {
      ++index;
      continue;
    }
    std::vector<Claim> run = claim_run(info, index, w.end);
    if (run.empty()) {  // being read by someone else (or just arrived): wait for it
      SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Chunk> c, fill(info, key, len));
      if (!resident_now(key)) w.not_kept += len;
      ++index;
      continue;
    }
    uint64_t bytes = 0;
    for (const Claim& c : run) bytes += c.length;
    if (scratch.size() < bytes) {
      scratch = AlignedBuffer();  // the old run's memory goes before the new one comes
      auto b = AlignedBuffer::allocate(bytes);
      if (!b) {
        for (Claim& c : run) {
          {
            MutexLock lock(flight_mu);
            flights.erase(c.key.id());
          }
          c.promise.set_value(std::unexpected(b.error()));
        }
        return std::unexpected(b.error());
      }
      scratch = std::move(*b);
    }
    SLUICE_RETURN_IF_ERROR(
        fill_run(info, run, std::span(scratch.data(), bytes), true, /*to_disk=*/true));
    w.fetched += bytes;
    for (const Claim& c : run) {
      if (!resident_now(c.key)) w.not_kept += c.length;
    }
    index += run.size();
  }
  return w;
}

Result<TieredCache::Warmed> TieredCache::warm(std::string_view key, uint64_t offset,
                                              uint64_t length) {
  SLUICE_RETURN_IF_ERROR(store::validate_key(key));
  for (int attempt = 0;; ++attempt) {
    SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, impl_->current(key, attempt > 0));
    Result<Warmed> r = impl_->warm_version(info, offset, length);
    // The object changed under the warm: start over once on the version there now.
    if (!r && r.error().code() == Code::kConflict && attempt == 0) continue;
    return r;
  }
}

Result<uint64_t> TieredCache::pin(std::string_view prefix, bool pinned) {
  if (prefix.find_first_of("\t\n") != std::string_view::npos) {
    return fail(Code::kInvalidArgument, "pin: a prefix cannot hold a tab or a newline");
  }
  {
    MutexLock lock(impl_->pin_mu);
    auto& v = impl_->pinned_prefixes;
    if (pinned) {
      if (std::find(v.begin(), v.end(), prefix) == v.end()) v.emplace_back(prefix);
    } else {
      std::erase(v, std::string(prefix));
    }
  }
  SLUICE_RETURN_IF_ERROR(impl_->save_pins());
  auto match = key_under(impl_->store_id, std::string(prefix));
  uint64_t n = impl_->ram->pin_if(match, pinned);
  if (impl_->disk) n += impl_->disk->pin_if(match, pinned);
  if (!pinned) {
    // Unpinning "ds/val/" must not unpin what a pin on "ds/" still covers.
    std::vector<std::string> still;
    {
      MutexLock lock(impl_->pin_mu);
      for (const std::string& p : impl_->pinned_prefixes) {
        if (prefix.starts_with(p)) still.push_back(p);
      }
    }
    for (const std::string& p : still) {
      auto covered = key_under(impl_->store_id, p);
      (void)impl_->ram->pin_if(covered, true);
      if (impl_->disk) (void)impl_->disk->pin_if(covered, true);
    }
  }
  return n;
}

template <class Match>
uint64_t TieredCache::Impl::drop(const Match& match) {
  uint64_t n = ram->drop_if(match);
  if (disk) n += drop_queued(match) + disk->drop_if(match);
  return n;
}

Result<uint64_t> TieredCache::evict(std::string_view prefix) {
  uint64_t n = impl_->drop(key_under(impl_->store_id, std::string(prefix)));
  impl_->m.commanded.add(n);
  return n;
}

uint64_t TieredCache::drop_other_stores() {
  return impl_->drop([id = impl_->store_id](const ChunkKey& k) { return k.store != id; });
}

Result<VerifyReport> TieredCache::verify() {
  VerifyReport rep;
  if (!impl_->disk) return rep;
  AlignedBuffer buf;
  for (const DiskTier::Entry& e : impl_->disk->entries()) {
    if (buf.size() < e.length) {
      SLUICE_ASSIGN_OR_RETURN(buf, AlignedBuffer::allocate(Impl::round_up(e.length)));
    }
    Status s = impl_->disk->read(e, std::span<std::byte>(buf.data(), e.length));
    if (!s && s.error().code() == Code::kNotFound) continue;  // evicted meanwhile
    ++rep.chunks;
    rep.bytes += e.length;
    if (!s) {
      impl_->m.checksum_failures.add();
      impl_->m.corrupt.add();
      rep.corrupt.push_back(s.error().message());
    }
  }
  return rep;
}

std::vector<CachedChunk> TieredCache::chunks(std::string_view prefix, bool all_stores) const {
  auto wanted = [&](const ChunkKey& k) {
    return (all_stores || k.store == impl_->store_id) && k.key.starts_with(prefix);
  };
  std::map<std::tuple<std::string, std::string, std::string, uint64_t>, CachedChunk> all;
  for (const RamTier::Entry& e : impl_->ram->entries()) {
    const ChunkKey& k = e.chunk->key;
    if (!wanted(k)) continue;
    CachedChunk& c = all[{k.store, k.key, k.etag, k.index}];
    c = CachedChunk{k.store,         k.key, k.etag,    k.index,
                    e.chunk->length, true,  c.on_disk, c.pinned || e.pinned};
  }
  if (impl_->disk) {
    for (const DiskTier::Entry& e : impl_->disk->entries()) {
      const ChunkKey& k = e.key;
      if (!wanted(k)) continue;
      CachedChunk& c = all[{k.store, k.key, k.etag, k.index}];
      c = CachedChunk{k.store,  k.key,    k.etag, k.index,
                      e.length, c.in_ram, true,   c.pinned || e.pinned};
    }
  }
  std::vector<CachedChunk> out;
  for (auto& [k, c] : all) out.push_back(std::move(c));
  return out;
}

}  // namespace sluice::cache
