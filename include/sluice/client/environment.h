// sluice/client/environment.h: SessionOptions from the process's environment and the
// files the AWS CLI reads, the way every sluice tool finds its settings.
//
// The rest of the library reads no environment: a program that embeds sluice either fills
// SessionOptions itself or calls these, explicitly, once.
#pragma once

#include <cstdint>
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
