// Dataset catalogs (docs/formats/dataset-catalog.md): the node-local file the workers of a
// node share instead of listing a dataset again. sluice::stream::decode_catalog on the bytes
// and on them with the trailing checksum made right; a catalog that decodes must round-trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "stream/catalog.h"

using namespace sluice;

namespace {

// The identity the seeds were written for (fuzz/make_seeds.cc).
constexpr std::string_view kIdentity = "fuzz://dataset/ prefix=train/";

void decode(std::span<const std::byte> bytes) {
  auto c = stream::decode_catalog(bytes, kIdentity, "fuzz.catalog");
  if (!c) return;
  auto again = stream::decode_catalog(stream::encode_catalog(*c, kIdentity), kIdentity,
                                      "fuzz.catalog (re-encoded)");
  SLUICE_FUZZ_CHECK(again.has_value(), "a decoded catalog re-encodes to one that decodes");
  SLUICE_FUZZ_CHECK(again->objects.size() == c->objects.size() &&
                        again->tables.size() == c->tables.size() && again->tar == c->tar,
                    "the catalog survives");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = fuzz::bytes_of(data, size);
  decode(bytes);
  decode(fuzz::with_trailing_xxh3(bytes));
  return 0;
}
