// sluice/stream/tar.h: tar archives as WebDataset shards, and the shard index.
//
// A WebDataset shard is a tar archive whose regular files are grouped into samples by
// basename: "train/0001.jpg" and "train/0001.cls" are the fields "jpg" and "cls" of the
// sample "train/0001" (the key is the path up to the first '.' of the file's basename).
// Files of one sample are consecutive. The reader understands POSIX ustar (with the name
// prefix), GNU long names ('L' entries, base-256 sizes) and PAX extended headers ('x', for
// path and size); directories, links and other special entries are skipped, as are files
// without an extension and files whose basename starts with "__" (WebDataset metadata).
//
// The shard index (docs/formats/shard-index.md) lists a shard's samples (key, and the byte
// range from the first file's header to the end of the last file's data), so a reader can
// compute the order of an epoch and seek to any sample without scanning the shard. It is
// written beside the shard as "<shard>.idx" by `sluice dataset pack`.
//
// Every byte read is untrusted: a header with a bad checksum, a size running past the end
// of the shard, or a truncated archive is Corruption naming the shard and the offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::stream {

inline constexpr uint64_t kTarBlock = 512;
inline constexpr size_t kMaxTarName = 4096;  // a longer name (GNU or PAX) is Corruption

// One file of a sample: its field name (the extension) and where its bytes lie in the shard.
struct TarField {
  std::string name;
  uint64_t offset = 0;  // of the data, in the shard
  uint64_t size = 0;
};

// One sample of a shard: the byte range [offset, offset + length) covers the headers and
// data of every file of the sample (length is a multiple of 512).
struct TarSample {
  std::string key;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<TarField> fields;
};

// Where a parser gets bytes: `n` bytes at `offset` of the shard, or fewer at its end.
using ByteSource = std::function<Result<std::span<const std::byte>>(uint64_t offset, size_t n)>;

// Parses the archive bytes [begin, end) given by `source` into samples. `end` is the shard's
// size (or the end of a sample range); `shard` names it in errors. Stops at the end-of-archive
// marker (a zero block) or at `end`.
Result<std::vector<TarSample>> parse_tar(const ByteSource& source, uint64_t begin, uint64_t end,
                                         std::string_view shard);

// Parses one sample's bytes held in memory (a range from an index), whose first byte is at
// `offset` in the shard. Corruption if the bytes do not hold exactly one sample.
Result<TarSample> parse_tar_sample(std::span<const std::byte> bytes, uint64_t offset,
                                   std::string_view shard);
// The same into `out`, whose field list and strings keep their memory from one sample to
// the next: the loader parses up to a million small samples a second with one. After an
// error `out` holds nothing of use.
Status parse_tar_sample(std::span<const std::byte> bytes, uint64_t offset, std::string_view shard,
                        TarSample& out);

// The WebDataset split of a path into key and field: {"a/0001", "jpg"} for "a/0001.jpg";
// false for a name that is not a sample file (no extension, or a "__" basename).
bool split_sample_name(std::string_view path, std::string& key, std::string& field);
// The same as views into `path`.
bool split_sample_name(std::string_view path, std::string_view& key, std::string_view& field);

// Writes a tar archive (POSIX ustar, PAX headers for names over 100 bytes) to `sink`.
class TarWriter {
 public:
  using Sink = std::function<Status(std::span<const std::byte>)>;
  explicit TarWriter(Sink sink) : sink_(std::move(sink)) {}
  // Appends a regular file.
  Status add(std::string_view name, std::span<const std::byte> data, int64_t mtime_s = 0);
  // Appends the end-of-archive marker (two zero blocks).
  Status finish();
  uint64_t bytes() const { return offset_; }

 private:
  Status header(std::string_view name, uint64_t size, char type, int64_t mtime_s);
  Status pad(uint64_t size);
  Sink sink_;
  uint64_t offset_ = 0;
};

// The bytes a file of `size` bytes takes in a tar: one header block plus its data rounded
// up to a block (long names add PAX blocks; see TarWriter).
uint64_t tar_file_bytes(std::string_view name, uint64_t size);

// The shard index: a shard's samples without their fields.
struct ShardIndex {
  uint64_t shard_size = 0;  // the shard the index was written for (checked when read)
  struct Entry {
    std::string key;
    uint64_t offset = 0, length = 0;
  };
  std::vector<Entry> samples;
};

inline constexpr std::string_view kIndexSuffix = ".idx";
inline constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 30;

std::vector<std::byte> encode_index(const ShardIndex& index);
// Checks magic, version, checksum and every entry (ranges inside the shard, in order,
// not overlapping). `what` names the index object in errors.
Result<ShardIndex> decode_index(std::span<const std::byte> bytes, std::string_view what);

}  // namespace sluice::stream
