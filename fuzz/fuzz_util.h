// What the harnesses share: views of the input, a checked invariant that stops the run the
// way a sanitizer does, and the checksum fix-ups that let the fuzzer past a format's
// checksum to the fields behind it. Harness code only: never linked into sluice.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/hash.h"

namespace sluice::fuzz {

inline std::string_view text_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

inline std::span<const std::byte> bytes_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

// An invariant the harness checks beyond "no crash" (a round trip): a failure aborts, so
// libFuzzer records the input as a crash.
#define SLUICE_FUZZ_CHECK(cond, what)                                                     \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "sluice fuzz: invariant failed at %s:%d: %s (%s)\n", __FILE__, \
                   __LINE__, #cond, what);                                                \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

// The deepest nesting of [ and { in `text` (counting those inside strings too: an upper
// bound). Harnesses re-serialise JSON only below a small depth, as the parsers do: nlohmann's
// dump recurses.
inline int json_depth(std::string_view text) {
  int depth = 0, most = 0;
  for (char c : text) {
    if (c == '[' || c == '{') most = std::max(most, ++depth);
    if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return most;
}

// `bytes` with its last 8 bytes set to the little-endian XXH3-64 of the bytes before them
// (the shard index and the dataset catalog end so).
inline std::vector<std::byte> with_trailing_xxh3(std::span<const std::byte> bytes) {
  std::vector<std::byte> out(bytes.begin(), bytes.end());
  if (out.size() < 8) return out;
  uint64_t sum = xxh3_64(out.data(), out.size() - 8);
  for (int i = 0; i < 8; ++i) out[out.size() - 8 + i] = std::byte(sum >> (8 * i));
  return out;
}

}  // namespace sluice::fuzz
