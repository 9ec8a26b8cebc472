// The job's daemons (--peers): a host list file ("NAME HOST:PORT [fetch-only]" a line) and
// Slurm's compressed host lists (SLURM_JOB_NODELIST, "gpu[001-128],cpu7"), then the
// membership made of them. The input is the file's text, then optionally a NUL and a
// Slurm list.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "sluice/peer/membership.h"

using namespace sluice;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::text_of(data, size);
  const size_t nul = text.find('\0');
  const std::string_view file = text.substr(0, nul);
  if (auto members = peer::parse_host_list(file, "fuzz-peers")) {
    if (!members->empty()) {
      const std::string self = (*members)[0].name;
      if (auto m = peer::Membership::make(*members, self)) {
        SLUICE_FUZZ_CHECK(!m->members().empty(), "a membership has its members");
        SLUICE_FUZZ_CHECK(m->owner(file).owns, "a chunk's owner owns chunks");
        SLUICE_FUZZ_CHECK(!m->ranked(file).empty(), "every key has an owner");
      }
    }
  }
  if (nul != std::string_view::npos) (void)peer::expand_hostlist(text.substr(nul + 1));
  (void)peer::expand_hostlist(file);
  return 0;
}
