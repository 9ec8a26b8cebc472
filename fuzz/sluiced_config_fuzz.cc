// sluiced's config file (--config; docs/sluiced.md): the JSON object that fills the settings
// not given as flags, and its teams. apply_config, parse_teams, then what the daemon derives
// from the settings before it serves: cache options, the window memory size, the peer
// listen address. Team credentials that name an AWS profile read files named by the AWS
// environment variables, pointed at paths that do not exist; a peers file is never read.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "cache_flags.h"
#include "config.h"
#include "fuzz_util.h"
#include "sluice/core/sizes.h"

using namespace sluice;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // No AWS file of this machine is read: a profile is looked up in files that are not there.
  setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/sluice-fuzz/credentials", 1);
  setenv("AWS_CONFIG_FILE", "/nonexistent/sluice-fuzz/config", 1);
  for (const char* v : {"AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                        "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                        "AWS_ENDPOINT_URL_S3", "SLURM_JOB_NODELIST"})
    unsetenv(v);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::text_of(data, size);
  sluiced::Args a;
  // The first byte says which flags were given on the command line (they win).
  const uint8_t given_mask = size > 0 ? data[0] : 0;
  auto given = [&](const char* flag) {
    return (given_mask >> (std::string_view(flag).size() % 8)) & 1;
  };
  auto teams = sluiced::apply_config(a, text, "fuzz.json", given);
  if (!teams) return 0;
  if (!teams->is_null()) (void)sluiced::parse_teams(*teams, "fuzz.json", a.aws, s3::S3Options{});
  client::SessionOverrides overrides;
  (void)cli::apply_cache_flags(a.cache, overrides);
  (void)parse_size(a.window_memory);
  if (a.peers.empty()) {  // a peers file would be read: only the listen address here
    node::PeerConfig peer;
    (void)sluiced::configure_peers(a, peer);
  }
  return 0;
}
