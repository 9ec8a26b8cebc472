// The checkpointer's entry points: tier states, opening tiers, opening a checkpointer.
#include "ckpt/checkpointer_impl.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

namespace sluice::ckpt {

const char* to_string(TierState s) {
  switch (s) {
    case TierState::kPending:
      return "pending";
    case TierState::kWriting:
      return "writing";
    case TierState::kCommitted:
      return "committed";
    case TierState::kFailed:
      return "failed";
    case TierState::kSkipped:
      return "skipped";
  }
  return "unknown";
}

Result<Tier> open_tier(std::string_view uri, const store::StoreOptions& options, bool create) {
  Tier t;
  t.name = std::string(uri);
  std::string_view path = uri;
  bool local = uri.find("://") == std::string_view::npos;
  if (uri.starts_with("file://")) {
    path.remove_prefix(7);
    local = true;
  }
  if (local) {
    if (path.empty()) return fail(Code::kInvalidArgument, "empty checkpoint tier path");
    std::error_code ec;
    if (!create && !std::filesystem::is_directory(std::string(path), ec))
      return fail(Code::kNotFound, "checkpoint tier " + std::string(path) + " is not a directory");
    if (create) std::filesystem::create_directories(std::string(path), ec);
    if (ec)
      return fail(Code::kIoError, "cannot create checkpoint tier directory " + std::string(path) +
                                      ": " + ec.message());
    auto abs = std::filesystem::canonical(std::string(path), ec);
    if (ec)
      return fail(Code::kIoError, "checkpoint tier " + std::string(path) + ": " + ec.message());
    t.local_dir = abs.string();
    SLUICE_ASSIGN_OR_RETURN(auto s, store::open_store("file://" + t.local_dir, options));
    t.store = std::move(s);
  } else {
    // "s3://bucket/ckpt" is the folder ckpt/ of the bucket, not a key prefix "ckpt".
    std::string root(uri);
    size_t slash = root.find('/', root.find("://") + 3);
    if (slash != std::string::npos && slash + 1 < root.size() && root.back() != '/') root += '/';
    SLUICE_ASSIGN_OR_RETURN(auto s, store::open_store(root, options));
    t.store = std::move(s);
  }
  return t;
}

Result<std::unique_ptr<Checkpointer>> Checkpointer::open(CheckpointerOptions o) {
  SLUICE_RETURN_IF_ERROR(validate_series(o.series));
  if (o.tiers.empty())
    return fail(Code::kInvalidArgument, "a checkpointer needs at least one tier");
  std::set<std::string> roots;
  for (const auto& t : o.tiers) {
    if (!t.store)
      return fail(Code::kInvalidArgument, "checkpoint tier " + t.name + " has no store");
    // One place named twice would commit once and then fail as "already committed".
    if (!roots.insert(t.local_dir.empty() ? t.store->uri() : t.local_dir).second)
      return fail(Code::kInvalidArgument, "checkpoint tier " + t.name + " is given twice");
  }
  if (o.world > 1 && o.run_id.empty())
    return fail(Code::kInvalidArgument,
                "a checkpointer of several ranks needs a run_id shared by every rank");
  if (o.world == 0 || o.rank >= o.world)
    return fail(Code::kInvalidArgument, "rank " + std::to_string(o.rank) +
                                            " is not in a world of " + std::to_string(o.world));
  if (o.chunk_size == 0 || o.chunk_size % kTensorAlignment || o.chunk_size > (uint64_t{1} << 30))
    return fail(Code::kInvalidArgument, "chunk size must be a multiple of 4 KiB up to 1 GiB");
  if (o.segment_bytes == 0 || o.segment_bytes % kTensorAlignment ||
      o.segment_bytes > (uint64_t{1} << 30))
    return fail(Code::kInvalidArgument, "segment size must be a multiple of 4 KiB up to 1 GiB");
  const uint64_t unit = 2 * o.segment_bytes;
  o.staging_bytes = std::max(unit, (o.staging_bytes + unit - 1) / unit * unit);
  if (!o.io) {
    SLUICE_ASSIGN_OR_RETURN(o.io, io::Context::open());
  }
  SLUICE_ASSIGN_OR_RETURN(AlignedBuffer mem, AlignedBuffer::allocate(o.staging_bytes));
  // Touched now, once: first touch runs at about 2 GiB/s here and must not land in a save.
  std::memset(mem.data(), 0, mem.size());
  auto ring = std::make_unique<StagingRing>(std::move(mem), o.segment_bytes);
  return std::unique_ptr<Checkpointer>(new CheckpointerImpl(std::move(o), std::move(ring)));
}

}  // namespace sluice::ckpt
