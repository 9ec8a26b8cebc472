// Shard indexes ("<shard>.idx", docs/formats/shard-index.md): what the loader reads to seek
// to a sample without scanning its shard. sluice::stream::decode_index on the bytes and on
// them with the trailing checksum made right; an index that decodes must round-trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "sluice/stream/tar.h"

using namespace sluice;

namespace {

void decode(std::span<const std::byte> bytes) {
  auto index = stream::decode_index(bytes, "fuzz.idx");
  if (!index) return;
  auto again = stream::decode_index(stream::encode_index(*index), "fuzz.idx (re-encoded)");
  SLUICE_FUZZ_CHECK(again.has_value(), "a decoded index re-encodes to one that decodes");
  SLUICE_FUZZ_CHECK(again->shard_size == index->shard_size, "shard size survives");
  SLUICE_FUZZ_CHECK(again->samples.size() == index->samples.size(), "samples survive");
  for (size_t i = 0; i < index->samples.size(); ++i) {
    const auto &a = index->samples[i], &b = again->samples[i];
    SLUICE_FUZZ_CHECK(a.key == b.key && a.offset == b.offset && a.length == b.length,
                      "each sample survives");
    SLUICE_FUZZ_CHECK(a.offset <= index->shard_size && a.length <= index->shard_size - a.offset,
                      "a decoded range lies inside the shard");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = fuzz::bytes_of(data, size);
  decode(bytes);
  decode(fuzz::with_trailing_xxh3(bytes));
  return 0;
}
