// Size and duration flags and settings (sluice/core/sizes.h, tools/sluice/size_flag.h): "4K",
// "1.5G", "512MiB", "90s", "7d", and the seconds validator. A size that parses must print as its
// byte count and parse back to it; a duration that parses is not negative.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "size_flag.h"
#include "sluice/core/sizes.h"

using namespace sluice;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(fuzz::text_of(data, size));
  if (auto v = parse_size(text)) {
    auto again = parse_size(std::to_string(*v));
    SLUICE_FUZZ_CHECK(again && *again == *v, "a size's byte count parses to itself");
    (void)format_size(static_cast<double>(*v));
  }
  if (auto d = parse_duration("--fuzz", text))
    SLUICE_FUZZ_CHECK(d->count() >= 0, "a duration is not negative");
  std::string s = text;
  (void)cli::size_validator()(s);
  s = text;
  (void)cli::seconds_validator(0, 3600)(s);
  return 0;
}
