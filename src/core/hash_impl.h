// One XXH3 implementation, compiled from Debian's xxhash.h with XXH_INLINE_ALL (so every
// function is local to the including file) into functions named for `tag`. hash.cc
// includes it as is, hash_avx2.cc with AVX2 enabled; hash.cc picks one at run time.
#pragma once

#include <cstddef>
#include <cstdint>

#define SLUICE_XXH3_FUNCTIONS(tag)                                  \
  uint64_t xxh3_64_##tag(const void* p, size_t n) {                 \
    return XXH3_64bits(p, n);                                       \
  }                                                                 \
  void xxh3_reset_##tag(void* s) {                                  \
    XXH3_64bits_reset(static_cast<XXH3_state_t*>(s));               \
  }                                                                 \
  void xxh3_update_##tag(void* s, const void* p, size_t n) {        \
    XXH3_64bits_update(static_cast<XXH3_state_t*>(s), p, n);        \
  }                                                                 \
  uint64_t xxh3_digest_##tag(const void* s) {                       \
    return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(s)); \
  }
