// Settings from the environment (see environment.h).
#include "sluice/client/environment.h"

#include <INIReader.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "sluice/core/fd.h"

namespace sluice::client {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string home_file(const char* env_name, const char* rel) {
  std::string p = env(env_name);
  if (!p.empty()) return p;
  std::string home = env("HOME");
  return home.empty() ? "" : home + "/" + rel;
}

}  // namespace

Result<s3::S3Options> s3_options_from_environment(const AwsSettings& flags) {
  s3::S3Options o;
  std::string profile = !flags.profile.empty() ? flags.profile : env("AWS_PROFILE");
  if (profile.empty()) profile = "default";

  std::string cred_path = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  std::string conf_path = home_file("AWS_CONFIG_FILE", ".aws/config");
  std::optional<INIReader> creds, conf;
  std::error_code ec;
  for (auto [path, reader] : {std::pair{&cred_path, &creds}, std::pair{&conf_path, &conf}}) {
    if (path->empty() || !std::filesystem::exists(*path, ec)) continue;
    reader->emplace(*path);
    if ((*reader)->ParseError() != 0)
      return fail(Code::kInvalidArgument, "cannot parse AWS file " + *path + " (line " +
                                              std::to_string((*reader)->ParseError()) + ")");
  }
  // In ~/.aws/config a named profile's section is "profile NAME"; the default is "default".
  std::string conf_section = profile == "default" ? "default" : "profile " + profile;
  bool in_creds = creds && creds->HasSection(profile);
  bool in_conf = conf && conf->HasSection(conf_section);
  bool explicit_profile = !flags.profile.empty() || !env("AWS_PROFILE").empty();
  if (explicit_profile && profile != "default" && !in_creds && !in_conf)
    return fail(Code::kNotFound,
                "AWS profile '" + profile + "' is in neither " + cred_path + " nor " + conf_path);
  auto from_files = [&](const char* key) -> std::string {
    if (in_creds) {
      std::string v = creds->Get(profile, key, "");
      if (!v.empty()) return v;
    }
    if (in_conf) return conf->Get(conf_section, key, "");
    return "";
  };

  if (flags.profile.empty() && !env("AWS_ACCESS_KEY_ID").empty()) {
    o.access_key = env("AWS_ACCESS_KEY_ID");
    o.secret_key = env("AWS_SECRET_ACCESS_KEY");
    o.session_token = env("AWS_SESSION_TOKEN");
    if (o.secret_key.empty())
      return fail(Code::kInvalidArgument,
                  "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
  } else {
    o.access_key = from_files("aws_access_key_id");
    o.secret_key = from_files("aws_secret_access_key");
    o.session_token = from_files("aws_session_token");
    if (!o.access_key.empty() && o.secret_key.empty())
      return fail(
          Code::kInvalidArgument,
          "AWS profile '" + profile + "' has aws_access_key_id but no aws_secret_access_key");
  }

  o.region = flags.region;
  for (const char* e : {"AWS_REGION", "AWS_DEFAULT_REGION"})
    if (o.region.empty()) o.region = env(e);
  if (o.region.empty()) o.region = from_files("region");
  if (o.region.empty()) o.region = "us-east-1";

  o.endpoint = flags.endpoint_url;
  for (const char* e : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})
    if (o.endpoint.empty()) o.endpoint = env(e);
  if (o.endpoint.empty()) o.endpoint = from_files("endpoint_url");
  o.path_style = !o.endpoint.empty();
  if (!o.endpoint.empty() && !o.endpoint.starts_with("http://") &&
      !o.endpoint.starts_with("https://"))
    return fail(Code::kInvalidArgument,
                "endpoint URL '" + o.endpoint + "' must start with http:// or https://");
  return o;
}

std::string home_from_environment() {
  if (std::string h = env("SLUICE_HOME"); !h.empty()) return h;
  if (std::string home = env("HOME"); !home.empty()) return home + "/.sluice";
  return ".sluice";
}

LedgerChoice ledger_from_environment(const std::string& flag) {
  if (!flag.empty()) return {flag, "--ledger"};
  if (std::string uri = env("SLUICE_LEDGER"); !uri.empty()) return {uri, "$SLUICE_LEDGER"};
  return {};
}

uint64_t default_cache_ram(Profile profile) {
  switch (profile) {
    case Profile::kCommand:
      return 0;
    case Profile::kDaemon:
      return uint64_t{1} << 30;
    case Profile::kLibrary:
      return uint64_t{1} << 30;
  }
  return 0;
}

Result<SessionOptions> session_options_from_environment(const SessionOverrides& given,
                                                        Profile profile) {
  SessionOptions o;
  o.home = given.home.empty() ? home_from_environment() : given.home;
  cache::CacheOptions& c = o.cache;
  c.directory = given.cache_dir.empty() ? o.home + "/cache" : given.cache_dir;
  c.ram_bytes = given.cache_ram.value_or(default_cache_ram(profile));
  c.disk_bytes = given.cache_size.value_or(c.disk_bytes);
  c.chunk_size = given.chunk_size.value_or(c.chunk_size);
  c.policy = given.policy.value_or(c.policy);
  c.revalidate_after = given.revalidate_after.value_or(c.revalidate_after);
  c.offline = given.offline;
  // A daemon touches its RAM tier up front (CacheOptions::prefault_ram); a command or a
  // program's embedded cache would pay that on every start.
  c.prefault_ram = profile == Profile::kDaemon;
  o.daemon_socket = given.daemon_socket;
  if (given.with_s3) {
    SLUICE_ASSIGN_OR_RETURN(o.s3, s3_options_from_environment(given.aws));
  }
  o.ledger = ledger_from_environment(given.ledger);
  return o;
}

Result<std::vector<peer::Member>> members_from_environment(const std::string& spec,
                                                           uint16_t slurm_port) {
  if (spec != "slurm") {
    SLUICE_ASSIGN_OR_RETURN(std::string text, read_small_file(spec, "peers file"));
    return peer::parse_host_list(text, spec);
  }
  const std::string list = env("SLURM_JOB_NODELIST");
  if (list.empty())
    return fail(Code::kInvalidArgument, "peers \"slurm\": SLURM_JOB_NODELIST is not set");
  if (slurm_port == 0)
    return fail(Code::kInvalidArgument, "peers \"slurm\": no port for the members");
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> names, peer::expand_hostlist(list));
  std::vector<peer::Member> members;
  for (std::string& n : names) members.push_back(peer::Member{n, n, slurm_port});
  return members;
}

// The node secret: the file's first line, at least 16 bytes, in a file only its owner reads.
Result<std::string> read_node_secret(const std::string& path) {
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) return fail_errno(errno, "node secret file " + path);
  if (sb.st_mode & 077)
    return fail(Code::kPermissionDenied,
                "node secret file " + path + " is readable by others: chmod 600 it");
  SLUICE_ASSIGN_OR_RETURN(std::string text, read_small_file(path, "node secret file"));
  std::string secret = text.substr(0, text.find('\n'));
  while (!secret.empty() && (secret.back() == '\r' || secret.back() == ' ')) secret.pop_back();
  if (secret.size() < 16)
    return fail(Code::kInvalidArgument, "node secret in " + path + " is under 16 bytes");
  return secret;
}

std::string short_host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string s = host;
  return s.substr(0, s.find('.'));
}

}  // namespace sluice::client
