// Resume tokens (`sluice dataset read --resume`, Loader options): sluice::stream::parse_token
// on the text, and on it with its check digits made right ("v3.…" + "." + XXH3 of the body),
// so the fuzzer reaches the fields. A token that parses must print as one that parses the same.
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "fuzz_util.h"
#include "sluice/stream/dataset.h"

using namespace sluice;

namespace {

void parse(std::string_view token) {
  auto p = stream::parse_token(token);
  if (!p) return;
  SLUICE_FUZZ_CHECK(p->position <= p->samples, "a position lies in its epoch");
  auto again = stream::parse_token(stream::make_token(*p));
  SLUICE_FUZZ_CHECK(again.has_value(), "make_token(parse_token(x)) parses");
  SLUICE_FUZZ_CHECK(again->epoch == p->epoch && again->position == p->position &&
                        again->samples == p->samples && again->fingerprint == p->fingerprint &&
                        again->seed == p->seed && again->window == p->window &&
                        again->identity == p->identity,
                    "a token round-trips");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::text_of(data, size);
  parse(text);
  char check[17];
  std::snprintf(check, sizeof check, "%016" PRIx64, xxh3_64(text.data(), text.size()));
  parse(std::string(text) + "." + check);
  return 0;
}
