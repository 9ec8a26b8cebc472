// XXH3 with AVX2. Compiled with -mavx2 (CMakeLists.txt): nothing else may live in this
// file, since any inline function it instantiated could be picked by the linker for code
// that runs on CPUs without AVX2. hash.cc calls it only where the CPU has AVX2.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include "core/hash_impl.h"

namespace sluice::detail {
SLUICE_XXH3_FUNCTIONS(avx2)
}  // namespace sluice::detail
