// sluice/ckpt/manifest.h: what a checkpoint is made of, as written beside its shards.
//
// A checkpoint of a series at a step is one shard per rank (the rank's tensors laid end to
// end, each at a 4 KiB-aligned offset) plus a record per shard and, written last, the
// manifest that names every shard. Records and manifests are JSON documents with a format
// version and an XXH3-64 checksum over their canonical form; the layout and every field
// are described in docs/formats/checkpoint-manifest.md.
//
// Keys, under a tier's root (a store):
//   <series>/step-<012 digits>/rank-<05 digits>-<save id>.shard   the rank's tensor bytes
//   <series>/step-<012 digits>/rank-<05 digits>.json    the rank's shard record
//   <series>/step-<012 digits>/manifest.json            the commit record: present = committed
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::store {
class Store;
struct ObjectInfo;
}  // namespace sluice::store

namespace sluice::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr uint64_t kTensorAlignment = 4096;  // every tensor starts at a multiple of this
inline constexpr uint64_t kMaxShardBytes = uint64_t{1} << 48;      // 256 TiB: sums cannot overflow
inline constexpr uint64_t kMaxDocumentBytes = uint64_t{64} << 20;  // a record or manifest

// One tensor in a shard. `chunks` holds the XXH3-64 of each `chunk_size` piece of the
// tensor's bytes (the last one shorter), as 16 hex digits.
struct TensorEntry {
  std::string name;
  std::string dtype;           // "float32", "uint8", ... (see dtype_size)
  std::vector<int64_t> shape;  // empty for a scalar
  uint64_t offset = 0;         // in the shard, a multiple of kTensorAlignment
  uint64_t bytes = 0;
  std::vector<uint64_t> chunks;
  // Permission bits (at most 07777) of a tensor saved from a file (`sluice ckpt save`),
  // restored onto it; 0: none recorded (the field is then left out of the document).
  uint32_t mode = 0;
};

struct ShardRecord {
  std::string series;
  uint64_t step = 0;
  unsigned rank = 0, world = 1;
  uint64_t chunk_size = 0;
  uint64_t bytes = 0;   // the shard object's size
  std::string etag;     // the shard object's etag once published on the tier it describes
  std::string save_id;  // 32 hex digits, fresh for each save attempt of the rank
  std::string run_id;   // the run of the job that wrote it (CheckpointerOptions::run_id)
  int64_t created_ns = 0;
  std::vector<TensorEntry> tensors;
};

struct Manifest {
  std::string series;
  uint64_t step = 0;
  unsigned world = 1;
  int64_t created_ns = 0;
  std::vector<ShardRecord> shards;  // by rank, one per rank
  uint64_t bytes() const;           // every shard's tensor bytes
};

// The size of one element of a dtype, or 0 for a name sluice does not know (kept as given:
// the bytes are still checked against their checksums).
size_t dtype_size(std::string_view dtype);

// Checks a series name: 1 to 128 of [A-Za-z0-9._-], not starting with '.'.
Status validate_series(std::string_view series);

std::string step_prefix(std::string_view series, uint64_t step);  // "<series>/step-…/"
// Shards are named for the save attempt that wrote them (ShardRecord::save_id), so two
// saves of one step, or a crashed attempt and its retry, never write the same object.
std::string shard_key(std::string_view series, uint64_t step, unsigned rank,
                      std::string_view save_id);
inline constexpr uint64_t kMaxStep = 999'999'999'999;  // twelve digits in the keys
std::string record_key(std::string_view series, uint64_t step, unsigned rank);
std::string manifest_key(std::string_view series, uint64_t step);
// The step of a key under "<series>/", if it is a step's key.
bool parse_step_key(std::string_view series, std::string_view key, uint64_t& step,
                    std::string& leaf);

// Encoding. Decoding checks the size and nesting of the text, the format, version,
// checksum and every invariant (offsets aligned and in the shard, no overlap, chunk counts,
// names unique and non-empty, one chunk size for every shard) and returns Corruption
// naming `where` and what is wrong.
std::string encode_record(const ShardRecord& r);
Result<ShardRecord> decode_record(std::string_view text, std::string_view where);
std::string encode_manifest(const Manifest& m);
Result<Manifest> decode_manifest(std::string_view text, std::string_view where);

// A record or manifest from a tier: untrusted, so its size is checked (at most
// kMaxDocumentBytes, else Corruption) before it is read, and the read is pinned to the etag
// it was stat'ed with.
Result<std::string> read_document(store::Store& tier, const std::string& key);
// The same for an object a listing described: its size checked from the listing, and one
// read pinned to the listed etag (no stat). Conflict when it changed since the listing.
Result<std::string> read_document(store::Store& tier, const store::ObjectInfo& listed);

// The one rule for what counts as a checkpoint on a tier: its manifest reads, decodes and
// describes `step` of `series`, and every shard it names is in `sizes` (key -> size, from a
// listing of that tier) at the size the manifest records. list, latest, restore, retention
// (the Checkpointer's and the ledger's gc) and `ckpt ls` all use it, so a step with a damaged
// manifest or a lost or truncated shard is never listed, restored, or kept in place of an
// older whole one. Returns the manifest, or NotFound / Corruption naming the tier (`where`)
// and what is missing.
Result<Manifest> read_whole_step(store::Store& tier, std::string_view series, uint64_t step,
                                 const std::map<std::string, uint64_t>& sizes,
                                 std::string_view where);

// Lays tensors of the given sizes end to end at aligned offsets; returns the shard's size.
uint64_t layout(std::vector<TensorEntry>& tensors);

std::string hex64(uint64_t v);
// Whether `s` is well-formed UTF-8 (names and dtypes must be: the documents are JSON).
bool valid_utf8(std::string_view s);

}  // namespace sluice::ckpt
