// Reading: manifests, listing, restore and verify.
#include "ckpt/checkpointer_impl.h"

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "core/parallel.h"
#include "sluice/core/hash.h"
#include "sluice/core/thread_annotations.h"

namespace sluice::ckpt {

namespace detail {

// The files one restore or verify reads: each local shard is opened once and shared by the
// reading threads (a FileHandle may be used from many threads at once).
class ShardFiles {
 public:
  Result<io::FileHandle*> get(const std::shared_ptr<io::Context>& ctx, const std::string& path) {
    MutexLock lk(mu_);
    auto it = open_.find(path);
    if (it != open_.end()) return it->second.get();
    // A shard replaced by a FIFO or a device must not block or feed the reader.
    std::error_code ec;
    if (std::filesystem::symlink_status(path, ec).type() != std::filesystem::file_type::regular)
      return fail(ec ? Code::kNotFound : Code::kCorruption,
                  path + (ec ? ": " + ec.message() : " is not a regular file"));
    SLUICE_ASSIGN_OR_RETURN(auto fh, io::FileHandle::open(ctx, path, {}));
    auto& slot = open_[path];
    slot = std::make_unique<io::FileHandle>(std::move(fh));
    return slot.get();
  }

 private:
  Mutex mu_;
  std::map<std::string, std::unique_ptr<io::FileHandle>> open_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Reading.

Status CheckpointerImpl::read_shard(size_t i, const std::string& key, uint64_t off,
                                    std::span<std::byte> dst, ShardFiles& files) {
  const Tier& tier = o_.tiers[i];
  size_t n = 0;
  if (local_tier(tier)) {
    // Through the data path: O_DIRECT straight into the caller's memory where aligned.
    SLUICE_ASSIGN_OR_RETURN(io::FileHandle * fh, files.get(o_.io, tier.local_dir + "/" + key));
    SLUICE_ASSIGN_OR_RETURN(n, fh->read(io::Buffer::host(dst.data(), dst.size()), dst.size(), off));
  } else {
    SLUICE_ASSIGN_OR_RETURN(n, tier.store->read_full(key, off, dst));
  }
  if (n != dst.size())
    return fail(Code::kCorruption, key + " on tier " + tier.name + " ends at " +
                                       std::to_string(off + n) + ", before " +
                                       std::to_string(off + dst.size()));
  return ok();
}

Result<Manifest> CheckpointerImpl::manifest_on(size_t i, uint64_t step,
                                               const std::map<std::string, uint64_t>* sizes) {
  const Tier& tier = o_.tiers[i];
  std::map<std::string, uint64_t> listed;
  if (!sizes) {
    SLUICE_ASSIGN_OR_RETURN(auto objs, tier.store->list_all(step_prefix(o_.series, step)));
    for (const auto& obj : objs) listed[obj.key] = obj.size;
    sizes = &listed;
  }
  return read_whole_step(*tier.store, o_.series, step, *sizes, "tier " + tier.name);
}

Result<Manifest> CheckpointerImpl::manifest(uint64_t step) {
  std::optional<Error> first;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    auto m = manifest_on(i, step);
    if (m) return m;
    if (!first || first->code() == Code::kNotFound) first = m.error();
  }
  if (first && first->code() != Code::kNotFound) return std::unexpected(*first);
  // Absent everywhere, or a tier that cannot even be listed (a missing bucket, a missing
  // directory): a listing tells them apart, on this failure path only.
  std::string where;
  for (const auto& t : o_.tiers) {
    store::ListOptions lo;
    lo.prefix = step_prefix(o_.series, step);
    lo.max_keys = 1;
    if (auto listed = t.store->list(lo); !listed && listed.error().code() != Code::kUnsupported)
      return std::unexpected(listed.error().with_context("tier " + t.name));
    where += (where.empty() ? "" : ", ") + t.name;
  }
  return fail(Code::kNotFound, "no step " + std::to_string(step) + " of series " + o_.series +
                                   " on " + (where.empty() ? "any tier" : where));
}

Result<std::vector<StepInfo>> CheckpointerImpl::list() {
  std::map<uint64_t, StepInfo> steps;
  std::optional<Error> unreachable;
  size_t listed = 0;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    // A tier that cannot be listed (S3 down) leaves the others' checkpoints usable.
    auto objs = o_.tiers[i].store->list_all(o_.series + "/step-");
    if (!objs) {
      unreachable = objs.error();
      continue;
    }
    ++listed;
    std::map<std::string, uint64_t> sizes;
    std::vector<uint64_t> with_manifest;
    for (const auto& obj : *objs) {
      sizes[obj.key] = obj.size;
      uint64_t step = 0;
      std::string leaf;
      if (parse_step_key(o_.series, obj.key, step, leaf) && leaf == "manifest.json")
        with_manifest.push_back(step);
    }
    // Only a whole copy counts: a damaged manifest or a lost shard is not a checkpoint here.
    for (uint64_t step : with_manifest) {
      auto m = manifest_on(i, step, &sizes);
      if (!m) continue;
      StepInfo& s = steps[step];
      if (s.tiers.empty()) {
        s.step = step;
        s.bytes = m->bytes();
        s.created_ns = m->created_ns;
      }
      s.tiers.push_back(o_.tiers[i].name);
    }
  }
  if (listed == 0 && unreachable) return std::unexpected(*unreachable);
  std::vector<StepInfo> out;
  for (auto& [step, s] : steps) out.push_back(std::move(s));
  return out;
}

Result<uint64_t> CheckpointerImpl::latest() {
  SLUICE_ASSIGN_OR_RETURN(auto steps, list());
  if (!steps.empty()) return steps.back().step;
  return fail(Code::kNotFound, "series " + o_.series + " has no committed checkpoint on " +
                                   std::to_string(o_.tiers.size()) + " tier(s)");
}

namespace {

// One chunk of one tensor to read and check.
struct ChunkTask {
  const ShardRecord* shard;
  const TensorEntry* tensor;
  size_t chunk;
  std::byte* host_dst;     // null: read into a bounce buffer
  const TensorDest* dest;  // for device destinations
};

}  // namespace

Result<RestoreReport> CheckpointerImpl::restore(uint64_t step, std::span<const TensorDest> dests) {
  const auto t0 = Clock::now();
  std::vector<int> holds(o_.tiers.size(), 0);  // tiers whose committed copy we may read
  std::optional<Manifest> m;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    auto got = manifest_on(i, step);
    if (!got) continue;
    if (!m) m = std::move(*got);
    holds[i] = 1;
  }
  if (!m) return std::unexpected(manifest(step).error());  // NotFound, or the corruption

  std::vector<ChunkTask> tasks;
  std::set<std::tuple<unsigned, std::string_view, uint64_t>> taken;
  for (const auto& d : dests) {
    const ShardRecord* shard = nullptr;
    const TensorEntry* tensor = nullptr;
    auto find_in = [&](const ShardRecord& s) {
      for (const auto& t : s.tensors)
        if (t.name == d.name) return &t;
      return static_cast<const TensorEntry*>(nullptr);
    };
    unsigned want = d.rank >= 0 ? static_cast<unsigned>(d.rank) : o_.rank;
    if (want < m->shards.size() && (tensor = find_in(m->shards[want]))) shard = &m->shards[want];
    if (!tensor && d.rank < 0) {
      for (const auto& s : m->shards)
        if (const TensorEntry* t = find_in(s)) {
          if (tensor)
            return fail(Code::kInvalidArgument, "tensor '" + d.name +
                                                    "' is in several shards of step " +
                                                    std::to_string(step) + ": name its rank");
          tensor = t;
          shard = &s;
        }
    }
    if (!tensor)
      return fail(Code::kNotFound, "step " + std::to_string(step) + " of series " + o_.series +
                                       " has no tensor '" + d.name + "'");
    const uint64_t cs = shard->chunk_size, end = d.offset + d.bytes;
    if (d.offset > tensor->bytes || d.bytes > tensor->bytes - d.offset || d.offset % cs ||
        (end != tensor->bytes && end % cs))
      return fail(Code::kInvalidArgument,
                  "tensor '" + d.name + "' has " + std::to_string(tensor->bytes) +
                      " bytes; the destination asks for " + std::to_string(d.bytes) + " at " +
                      std::to_string(d.offset) + " (parts must start and end on chunks of " +
                      std::to_string(cs) + " bytes, or at the tensor's end)");
    if (d.bytes && !d.data)
      return fail(Code::kInvalidArgument, "no destination memory for tensor '" + d.name + "'");
    if (!taken.insert({shard->rank, tensor->name, d.offset}).second)
      return fail(Code::kInvalidArgument, "tensor '" + d.name + "' is asked for twice");
    bool device = d.target && d.target->kind() == mem::MemoryKind::kDevice;
    for (uint64_t c = d.offset / cs; c * cs < end; ++c)
      tasks.push_back({shard, tensor, c,
                       device ? nullptr : static_cast<std::byte*>(d.data) + (c * cs - d.offset),
                       &d});
  }

  RestoreReport report;
  report.bytes_by_tier.assign(o_.tiers.size(), 0);
  Mutex mu;
  ShardFiles files;
  // Bounce buffers for device destinations, one per reading thread at most.
  BufferPool bounce(m->shards.empty() ? kDirectAlignment : m->shards[0].chunk_size,
                    o_.restore_parallel);
  Status done = parallel_for(tasks.size(), o_.restore_parallel, [&](size_t k) -> Status {
    SLUICE_RETURN_IF_ERROR(check_cancel());
    const ChunkTask& t = tasks[k];
    const uint64_t at = t.chunk * t.shard->chunk_size;
    const uint64_t n = std::min(t.shard->chunk_size, t.tensor->bytes - at);
    PooledBuffer buf;
    std::byte* dst = t.host_dst;
    if (!dst) {
      SLUICE_ASSIGN_OR_RETURN(buf, bounce.acquire());
      dst = buf.data();
    }
    std::string why;
    auto served = read_chunk(step, *t.shard, *t.tensor, t.chunk, holds, {dst, n}, files, why);
    {
      MutexLock lk(mu);
      if (!why.empty()) report.problems.push_back(why);
      if (!served) return std::unexpected(served.error());
      report.bytes_by_tier[*served] += n;
      report.bytes += n;
      if (!why.empty()) ++report.chunks_failed_over;
    }
    if (!t.host_dst) {
      SLUICE_ASSIGN_OR_RETURN(
          uint64_t ticket,
          t.dest->target->copy_to_target(
              static_cast<std::byte*>(t.dest->data) + (at - t.dest->offset), dst, n));
      SLUICE_RETURN_IF_ERROR(t.dest->target->wait(ticket));
    }
    return ok();
  });
  if (!done) return std::unexpected(done.error());
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return report;
}

Result<size_t> CheckpointerImpl::read_chunk(uint64_t step, const ShardRecord& shard,
                                            const TensorEntry& tensor, size_t chunk,
                                            const std::vector<int>& holds, std::span<std::byte> dst,
                                            ShardFiles& files, std::string& why) {
  const std::string key = shard_key(o_.series, step, shard.rank, shard.save_id);
  const uint64_t at = tensor.offset + chunk * shard.chunk_size;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    if (!holds[i]) continue;
    auto st = read_shard(i, key, at, dst, files);
    if (st && xxh3_64(dst.data(), dst.size()) != tensor.chunks[chunk])
      st = fail(Code::kCorruption, key + " on tier " + o_.tiers[i].name + ": chunk " +
                                       std::to_string(chunk) + " of tensor '" + tensor.name +
                                       "' does not match its checksum");
    if (st) return i;
    why += (why.empty() ? "" : "; ") + st.error().message();
  }
  return fail(Code::kCorruption, "chunk " + std::to_string(chunk) + " of tensor '" + tensor.name +
                                     "' (step " + std::to_string(step) + ", rank " +
                                     std::to_string(shard.rank) + ") is intact on no tier: " + why);
}

Result<VerifyReport> CheckpointerImpl::verify(uint64_t step, const VerifyOptions& vo) {
  const int tier = vo.tier;
  if (tier >= static_cast<int>(o_.tiers.size()))
    return fail(Code::kInvalidArgument, "no tier " + std::to_string(tier));
  VerifyReport report;
  Mutex mu;
  ShardFiles files;
  bool any = false;
  for (size_t i = 0; i < o_.tiers.size(); ++i) {
    if (tier >= 0 && static_cast<size_t>(tier) != i) continue;
    auto m = manifest_on(i, step);
    if (!m) {
      if (m.error().code() == Code::kNotFound) {
        if (tier >= 0) return std::unexpected(m.error());  // no copy there: not a bad one
        continue;
      }
      report.problems.push_back(m.error().message());
      ++report.bad_chunks;
      any = true;
      continue;
    }
    any = true;
    std::vector<int> only(o_.tiers.size(), 0);
    only[i] = 1;
    struct Item {
      const ShardRecord* shard;
      const TensorEntry* tensor;
      size_t chunk;
    };
    std::vector<Item> items;
    for (const auto& s : m->shards) {
      const std::string sk = shard_key(o_.series, step, s.rank, s.save_id);
      auto info = o_.tiers[i].store->stat(sk);
      if (!info || info->size != s.bytes) {
        MutexLock lk(mu);
        report.problems.push_back(
            sk + " on tier " + o_.tiers[i].name + ": " +
            (info ? "has " + std::to_string(info->size) + " bytes, not " + std::to_string(s.bytes)
                  : info.error().message()));
      }
      for (const auto& t : s.tensors)
        for (size_t c = 0; c < t.chunks.size(); ++c) items.push_back({&s, &t, c});
    }
    BufferPool pool(m->shards.empty() ? kDirectAlignment : m->shards[0].chunk_size,
                    o_.restore_parallel);
    const uint64_t total = m->bytes();
    uint64_t checked = 0;
    Status done = parallel_for(items.size(), o_.restore_parallel, [&](size_t k) -> Status {
      if (vo.cancel && vo.cancel->load()) return fail(Code::kCancelled, "verify cancelled");
      const Item& it = items[k];
      SLUICE_ASSIGN_OR_RETURN(auto buf, pool.acquire());
      const uint64_t n =
          std::min(it.shard->chunk_size, it.tensor->bytes - it.chunk * it.shard->chunk_size);
      std::string why;
      auto served =
          read_chunk(step, *it.shard, *it.tensor, it.chunk, only, {buf.data(), n}, files, why);
      MutexLock lk(mu);
      ++report.chunks;
      checked += n;
      if (vo.on_progress) vo.on_progress(o_.tiers[i].name, checked, total);
      if (!served) {
        ++report.bad_chunks;
        report.problems.push_back(why);
      }
      return ok();
    });
    if (!done) return std::unexpected(done.error());
  }
  if (!any)
    return fail(Code::kNotFound, "step " + std::to_string(step) + " of series " + o_.series +
                                     " is committed on no tier");
  return report;
}

}  // namespace sluice::ckpt
