// Checkpoint shard records (rank-NNNNN.json) and live-save markers (rank-….live): what a
// restore, a list or a gc reads from a tier. sluice::ckpt::decode_record on the bytes and on
// the document with its checksum made right; a record that decodes must round-trip. The
// marker text goes through live_marker_holds, which must not trust it.
#include <cstddef>
#include <cstdint>

#include "ckpt_json.h"
#include "sluice/ckpt/live.h"

using namespace sluice;

namespace {

void decode(std::string_view text) {
  auto r = ckpt::decode_record(text, "fuzz/rank-00000.json");
  if (!r) return;
  const std::string once = ckpt::encode_record(*r);
  auto again = ckpt::decode_record(once, "fuzz/rank-00000.json (re-encoded)");
  SLUICE_FUZZ_CHECK(again.has_value(), "a decoded record re-encodes to one that decodes");
  SLUICE_FUZZ_CHECK(ckpt::encode_record(*again) == once, "encode(decode(x)) is stable");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::text_of(data, size);
  decode(text);
  if (auto sealed = fuzz::resealed(text)) decode(*sealed);
  // A marker's age decides when its owner cannot be found; the text must never crash it.
  (void)ckpt::live_marker_holds(text, 1'000'000'000'000'000'000, 1'000'000'010'000'000'000);
  (void)ckpt::is_live_leaf(text);
  uint64_t step = 0;
  std::string leaf;
  (void)ckpt::parse_step_key("series", text, step, leaf);
  (void)ckpt::validate_series(text);
  return 0;
}
