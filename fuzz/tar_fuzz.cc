// The tar reader (WebDataset shards): sluice::stream::parse_tar over the input as a shard,
// read through a ByteSource the way the loader reads a store, and parse_tar_sample on every
// sample it finds (the loader reads a sample alone from its index range). Each input is also
// tried with its headers' checksums made right, so the fuzzer reaches the fields behind
// them (GNU long names, base-256 sizes, PAX records).
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "fuzz_util.h"
#include "sluice/stream/tar.h"

using namespace sluice;

namespace {

// Sets the checksum field of the 512-byte header at `h` to the sum of its bytes.
void fix_checksum(std::byte* h) {
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < stream::kTarBlock; ++i) sum += std::to_integer<unsigned char>(h[i]);
  char field[8];
  std::snprintf(field, sizeof field, "%06o", sum & 0777777);
  std::memcpy(h + 148, field, 7);  // six digits and a NUL, then the space left there
}

uint64_t octal(const std::byte* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    auto c = std::to_integer<unsigned char>(p[i]);
    if (c < '0' || c > '7') break;
    v = v * 8 + (c - '0');
  }
  return v;
}

// The input with the checksum of every header a reader would meet made right (walking
// entries by their octal sizes); zero blocks are left alone.
std::vector<std::byte> with_checksums(std::span<const std::byte> in) {
  std::vector<std::byte> out(in.begin(), in.end());
  const uint64_t block = stream::kTarBlock;
  for (uint64_t pos = 0; pos + block <= out.size();) {
    std::byte* h = out.data() + pos;
    bool zero = std::all_of(h, h + block, [](std::byte b) { return b == std::byte{0}; });
    if (zero) {
      pos += block;
      continue;
    }
    fix_checksum(h);
    uint64_t size = octal(h + 124, 12);
    if (size > out.size()) break;
    pos += block + (size + block - 1) / block * block;
  }
  return out;
}

void parse(std::span<const std::byte> shard) {
  stream::ByteSource source = [&](uint64_t offset, size_t n) -> Result<std::span<const std::byte>> {
    if (offset > shard.size()) return fail(Code::kCorruption, "read past the end of the shard");
    return shard.subspan(offset, std::min<uint64_t>(n, shard.size() - offset));
  };
  auto samples = stream::parse_tar(source, 0, shard.size(), "fuzz.tar");
  if (!samples) return;
  uint64_t prev_end = 0;
  stream::TarSample reused;  // the loader parses a slice's samples into one, in turn
  for (const auto& s : *samples) {
    SLUICE_FUZZ_CHECK(
        s.offset >= prev_end && s.length <= shard.size() && s.offset <= shard.size() - s.length,
        "samples lie in the shard, in order");
    prev_end = s.offset + s.length;
    for (const auto& f : s.fields)
      SLUICE_FUZZ_CHECK(
          f.offset >= s.offset && f.offset <= prev_end && f.size <= prev_end - f.offset,
          "a field lies in its sample");
    // The loader reads a sample alone, from its index range: the range must hold it whole.
    auto alone = stream::parse_tar_sample(shard.subspan(s.offset, s.length), s.offset, "fuzz.tar");
    SLUICE_FUZZ_CHECK(alone.has_value(), "a sample parses alone from its range");
    SLUICE_FUZZ_CHECK(alone->key == s.key && alone->fields.size() == s.fields.size(),
                      "alone, a sample has the same key and fields");
    // parse_tar_sample's plain-header path and parse_tar agree on every field.
    SLUICE_FUZZ_CHECK(alone->offset == s.offset && alone->length == s.length,
                      "alone, a sample has the same range");
    for (size_t i = 0; i < s.fields.size(); ++i)
      SLUICE_FUZZ_CHECK(alone->fields[i].name == s.fields[i].name &&
                            alone->fields[i].offset == s.fields[i].offset &&
                            alone->fields[i].size == s.fields[i].size,
                        "alone, each field has the same name, offset and size");
    // Into a TarSample that held the samples before, and a failed parse: nothing of theirs
    // is left in it.
    if (s.length > stream::kTarBlock)
      (void)stream::parse_tar_sample(shard.subspan(s.offset + 1, s.length - 1), s.offset + 1,
                                     "fuzz.tar", reused);
    SLUICE_FUZZ_CHECK(
        stream::parse_tar_sample(shard.subspan(s.offset, s.length), s.offset, "fuzz.tar", reused),
        "a sample parses alone into a used TarSample");
    SLUICE_FUZZ_CHECK(reused.key == s.key && reused.offset == s.offset &&
                          reused.length == s.length && reused.fields.size() == s.fields.size(),
                      "into a used TarSample, the same key, range and fields");
    for (size_t i = 0; i < s.fields.size(); ++i)
      SLUICE_FUZZ_CHECK(reused.fields[i].name == s.fields[i].name &&
                            reused.fields[i].offset == s.fields[i].offset &&
                            reused.fields[i].size == s.fields[i].size,
                        "into a used TarSample, each field the same");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = fuzz::bytes_of(data, size);
  parse(bytes);
  parse(with_checksums(bytes));
  // A range from an index that is not a sample: Corruption, never a crash.
  (void)stream::parse_tar_sample(bytes, 512, "fuzz.tar");
  std::string key, field;
  (void)stream::split_sample_name(fuzz::text_of(data, size), key, field);
  return 0;
}
