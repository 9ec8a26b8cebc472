// sluiced's settings: its flags, and the JSON config file that fills those not given as
// flags (docs/sluiced.md). Apart from main.cc so the config file's parsing is tested and
// fuzzed without starting a daemon (fuzz/sluiced_config_fuzz.cc).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "sluice/client/environment.h"
#include "sluice/core/status.h"
#include "sluice/node/server.h"
#include "sluice/s3/store.h"

namespace sluice::sluiced {

// Every setting, as the flags give them.
struct Args {
  cli::CacheFlags cache;
  client::AwsSettings aws;
  std::string socket, config;
  std::string peer_listen, peers, node_name, secret_file, objects_dir;
  std::vector<std::string> peer_file_roots;  // file:// roots served to (and asked of) peers
  std::string ledger;
  unsigned peer_timeout_ms = 10000;
  unsigned access_ttl_s = 60;
  unsigned max_connections = 256, max_per_uid = 64;
  unsigned idle_s = 300;
  std::string window_memory = "512M";
  bool prefault_ram = true;
};

// Whether a flag ("--socket") was given on the command line: a flag given wins over the
// config file.
using FlagGiven = std::function<bool(const char* flag)>;

// Fills the settings of `a` not given as flags from the config file's text (`file` names it
// in errors): a JSON object whose members are the flags' settings. Returns its "teams", or
// null when it has none. InvalidArgument for text that is not a JSON object or a member of
// the wrong type.
Result<nlohmann::json> apply_config(Args& a, std::string_view text, const std::string& file,
                                    const FlagGiven& given);

// Teams from the config file: [{"name": "vision", "uids": [1001], "roots": ["s3://b/"]}],
// each optionally with its own S3 credentials: "aws_profile" (from ~/.aws, as the CLI reads
// it), or "aws_access_key_id" and "aws_secret_access_key" (and "aws_session_token"), with
// the daemon's endpoint and region.
Result<std::vector<node::TeamGrant>> parse_teams(const nlohmann::json& teams,
                                                 const std::string& file,
                                                 const client::AwsSettings& daemon_aws,
                                                 const s3::S3Options& daemon_s3);

// The HTTP port and the membership from --peer-listen, --peers, --node-name and the secret
// (the peers file and the secret file are read here), and the file roots peers may read.
Status configure_peers(const Args& a, node::PeerConfig& p);

}  // namespace sluice::sluiced
