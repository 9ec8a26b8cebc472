// XXH3-64 (seed 0): the checksum of cache chunks, checkpoint chunks and every chunk handed
// between processes and nodes. Computed with the widest vector unit the CPU has, chosen
// once at run time: AVX2 where present (2-3x the SSE2 code Debian's libxxhash runs on
// x86-64: a warm read from the cache's NVMe tier spent half its CPU verifying), else SSE2.
// The values are XXH3_64bits's whichever path runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace sluice {

uint64_t xxh3_64(const void* data, size_t size);
inline uint64_t xxh3_64(std::span<const std::byte> bytes) {
  return xxh3_64(bytes.data(), bytes.size());
}
// The XXH3-64 of `text` as 16 lower-case hex digits: the check field of text formats
// (resume tokens, dataset records).
std::string xxh3_hex(std::string_view text);

// The same hash over bytes given in pieces.
class Xxh3Stream {
 public:
  Xxh3Stream();  // reset
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void reset();
  void update(const void* data, size_t size);
  void update(std::span<const std::byte> bytes) { update(bytes.data(), bytes.size()); }
  uint64_t digest() const;

 private:
  void* state_;  // an XXH3_state_t, 64-byte aligned, owned
};

// The code path this process hashes with: "avx2" or "sse2".
const char* xxh3_path();

}  // namespace sluice
