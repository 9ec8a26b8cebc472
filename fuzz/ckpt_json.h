// Checkpoint records and manifests carry an XXH3-64 over their canonical form
// (docs/formats/checkpoint-manifest.md); a fuzzer cannot forge it, so each harness also
// decodes the input with its checksum made right.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "sluice/ckpt/manifest.h"

namespace sluice::fuzz {

// `text` as a JSON object with "checksum" set to what the decoder computes; nullopt when it is
// not a JSON object (or nested too deeply to re-serialise safely).
inline std::optional<std::string> resealed(std::string_view text) {
  if (json_depth(text) > 16) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return std::nullopt;
  doc.erase("checksum");
  const std::string body = doc.dump();
  doc["checksum"] = ckpt::hex64(xxh3_64(body.data(), body.size()));
  return doc.dump(1);
}

}  // namespace sluice::fuzz
