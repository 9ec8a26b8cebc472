// Checkpoint manifests (manifest.json of a step): sluice::ckpt::decode_manifest on the bytes
// as read from a tier, and on the same document with its checksum made right so the fuzzer
// reaches every invariant behind it. A manifest that decodes must encode to one that decodes
// to the same encoding.
#include <cstddef>
#include <cstdint>

#include "ckpt_json.h"

using namespace sluice;

namespace {

void decode(std::string_view text) {
  auto m = ckpt::decode_manifest(text, "fuzz/manifest.json");
  if (!m) return;
  const std::string once = ckpt::encode_manifest(*m);
  auto again = ckpt::decode_manifest(once, "fuzz/manifest.json (re-encoded)");
  SLUICE_FUZZ_CHECK(again.has_value(), "a decoded manifest re-encodes to one that decodes");
  SLUICE_FUZZ_CHECK(ckpt::encode_manifest(*again) == once, "encode(decode(x)) is stable");
  (void)m->bytes();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::text_of(data, size);
  decode(text);
  if (auto sealed = fuzz::resealed(text)) decode(*sealed);
  return 0;
}
