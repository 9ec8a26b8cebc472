// What `sluice doctor` reads from /proc and /sys (a block device's stat, a process's io, a
// thread's stat line, whose command name may hold any byte but NUL) and the ceiling file it
// keeps of a device's measured sweep (Ceiling::from_json). The input is given to each
// parser; a ceiling that parses is asked for its best point and knee, and must round-trip.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "sluice/doctor/diagnose.h"
#include "sluice/doctor/observe.h"

using namespace sluice;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::text_of(data, size);
  (void)doctor::parse_disk_stat(text);
  (void)doctor::parse_proc_io(text);
  (void)doctor::parse_task_stat(text);
  if (fuzz::json_depth(text) > 32) return 0;
  if (auto c = doctor::Ceiling::from_json(std::string(text))) {
    (void)c->best();
    (void)c->best_at(4096, 32);
    (void)c->knee();
    auto again = doctor::Ceiling::from_json(c->json());
    SLUICE_FUZZ_CHECK(again.has_value() && again->points.size() == c->points.size(),
                      "a ceiling round-trips");
  }
  return 0;
}
