#include "sluice/core/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>
#include <new>

#include "core/hash_impl.h"

namespace sluice {

namespace detail {
SLUICE_XXH3_FUNCTIONS(base)
#if SLUICE_XXH3_AVX2
uint64_t xxh3_64_avx2(const void* p, size_t n);
void xxh3_reset_avx2(void* s);
void xxh3_update_avx2(void* s, const void* p, size_t n);
uint64_t xxh3_digest_avx2(const void* s);
#endif
}  // namespace detail

namespace {

struct Path {
  uint64_t (*one)(const void*, size_t);
  void (*reset)(void*);
  void (*update)(void*, const void*, size_t);
  uint64_t (*digest)(const void*);
  const char* name;
};

const Path& path() {
  static const Path p = [] {
#if SLUICE_XXH3_AVX2
    __builtin_cpu_init();  // in case the first hash runs in a static initializer
    if (__builtin_cpu_supports("avx2")) {
      return Path{detail::xxh3_64_avx2, detail::xxh3_reset_avx2, detail::xxh3_update_avx2,
                  detail::xxh3_digest_avx2, "avx2"};
    }
#endif
    return Path{detail::xxh3_64_base, detail::xxh3_reset_base, detail::xxh3_update_base,
                detail::xxh3_digest_base, "sse2"};
  }();
  return p;
}

constexpr std::align_val_t kStateAlign{64};

}  // namespace

uint64_t xxh3_64(const void* data, size_t size) {
  return path().one(data, size);
}

std::string xxh3_hex(std::string_view text) {
  char h[17];
  std::snprintf(h, sizeof h, "%016llx",
                static_cast<unsigned long long>(xxh3_64(text.data(), text.size())));
  return h;
}

const char* xxh3_path() {
  return path().name;
}

Xxh3Stream::Xxh3Stream() : state_(::operator new(sizeof(XXH3_state_t), kStateAlign)) {
  reset();
}

Xxh3Stream::~Xxh3Stream() {
  ::operator delete(state_, kStateAlign);
}

void Xxh3Stream::reset() {
  path().reset(state_);
}

void Xxh3Stream::update(const void* data, size_t size) {
  path().update(state_, data, size);
}

uint64_t Xxh3Stream::digest() const {
  return path().digest(state_);
}

}  // namespace sluice
