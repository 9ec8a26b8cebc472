// sluice/client/environment.h: SessionOptions from the process's environment and the
// files the AWS CLI reads, the way every sluice tool finds its settings.
//
// The rest of the library reads no environment: a program that embeds sluice either fills
// SessionOptions itself or calls these, explicitly, once.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sluice/client/session.h"
#include "sluice/core/status.h"
#include "sluice/peer/membership.h"
#include "sluice/s3/store.h"

namespace sluice::client {

// $SLUICE_HOME, else ~/.sluice, else ./.sluice.
std::string home_from_environment();

// Settings given on a command line, which win over the environment.
struct AwsSettings {
  std::string profile;       // --profile
  std::string endpoint_url;  // --endpoint-url
  std::string region;        // --region
};

// S3 settings as the AWS CLI finds them. Precedence: `given`; then AWS_ACCESS_KEY_ID /
// AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (unless a profile was given), AWS_REGION /
// AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL; then the profile
// (AWS_PROFILE or "default") in AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials) and
// AWS_CONFIG_FILE (~/.aws/config). A custom endpoint selects path-style addressing. A
// named profile that exists in neither file is NotFound; no credentials at all means
// unsigned (anonymous) requests.
Result<s3::S3Options> s3_options_from_environment(const AwsSettings& given = {});

// The ledger: `flag` (a --ledger) when given, else $SLUICE_LEDGER when set, else the
// embedded one in the session's home.
LedgerChoice ledger_from_environment(const std::string& flag = {});

// Whose defaults a session takes where neither the caller nor the environment sets one.
// They differ on purpose, in the embedded cache's RAM tier (docs/library.md):
enum class Profile {
  kCommand,  // one sluice command: it reads each byte once, so no RAM tier
  kDaemon,   // sluiced: long-lived, every process on the node reads through it: 1 GiB
  kLibrary,  // a program embedding sluice (Python): 1 GiB, for a loop that reads its data
             // again (epochs) with no daemon on the node
};

// The embedded cache's RAM tier a profile gets by default.
uint64_t default_cache_ram(Profile profile);

// What a caller sets (flags, keyword arguments, a config file). Each set field wins over
// the environment, which wins over the profile's defaults.
struct SessionOverrides {
  std::string home;  // empty: home_from_environment()
  AwsSettings aws;
  bool with_s3 = true;  // false: no S3 settings are read (a command that opens no store)
  std::string ledger;   // a --ledger; empty: $SLUICE_LEDGER, else HOME/ledger.db
  // sluiced's socket. Empty: HOME/sluiced.sock; "none": never the daemon.
  std::string daemon_socket;
  std::string cache_dir;  // empty: HOME/cache
  std::optional<uint64_t> cache_ram, cache_size, chunk_size;
  std::optional<cache::PolicyKind> policy;
  std::optional<std::chrono::milliseconds> revalidate_after;
  bool offline = false;
};

// The library's composition root: SessionOptions from what the caller set, the environment
// ($SLUICE_HOME, $SLUICE_LEDGER, the AWS variables and files) and the profile's defaults.
// Every sluice executable and binding builds its session here, so a setting means the same
// in each. InvalidArgument names a bad setting (an endpoint that is not http(s), a missing
// AWS profile, ...).
Result<SessionOptions> session_options_from_environment(const SessionOverrides& given,
                                                        Profile profile);

// How a job's daemons are found, as the caller gave it; each empty field falls back to the
// environment a launcher sets (docs/ckpt.md, "Peer tiers"): $SLUICE_NODE_NAME (else the short
// host name), $SLUICE_NODE_SECRET_FILE, $SLUICE_PEERS (a host list file, or "slurm"),
// $SLUICE_PEER_PORT (with "slurm").
struct PeerSpec {
  std::string node;
  std::string secret_file;
  std::string members;
  uint16_t port = 0;
};

// The job's node daemons: `spec` is a host list file (peer::parse_host_list), or "slurm":
// the hosts of $SLURM_JOB_NODELIST, each listening on `slurm_port` (0: refused).
Result<std::vector<peer::Member>> members_from_environment(const std::string& spec,
                                                           uint16_t slurm_port);

// The job's node secret from a file: its first line, at least 16 bytes, in a file only its
// owner may read (PermissionDenied otherwise: chmod 600 it).
Result<std::string> read_node_secret(const std::string& path);

// This host's name up to the first dot: a node's member name unless one is given.
std::string short_host_name();

}  // namespace sluice::client
