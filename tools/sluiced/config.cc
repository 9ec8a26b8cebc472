#include "config.h"

#include <cstdint>
#include <cstdio>

#include "common.h"

namespace sluice::sluiced {

using Json = nlohmann::json;

namespace {

// A team's own S3 credentials: "aws_profile" (from ~/.aws, as the CLI reads it), or
// "aws_access_key_id" and "aws_secret_access_key" (and "aws_session_token"); the daemon's
// endpoint and region. nullopt when the team names none.
Result<std::optional<store::StoreOptions>> team_credentials(const Json& t, const std::string& where,
                                                            const client::AwsSettings& daemon_aws,
                                                            const s3::S3Options& daemon_s3) {
  auto str = [&](const char* k) -> Result<std::string> {
    if (!t.contains(k)) return std::string();
    if (!t[k].is_string())
      return fail(Code::kInvalidArgument, where + ": \"" + k + "\" must be a string");
    return t[k].get<std::string>();
  };
  SLUICE_ASSIGN_OR_RETURN(std::string profile, str("aws_profile"));
  SLUICE_ASSIGN_OR_RETURN(std::string key_id, str("aws_access_key_id"));
  SLUICE_ASSIGN_OR_RETURN(std::string secret, str("aws_secret_access_key"));
  SLUICE_ASSIGN_OR_RETURN(std::string token, str("aws_session_token"));
  if (profile.empty() && key_id.empty() && secret.empty()) return std::nullopt;
  s3::S3Options so = daemon_s3;
  if (!profile.empty()) {
    if (!key_id.empty() || !secret.empty())
      return fail(Code::kInvalidArgument, where + ": give aws_profile or the keys, not both");
    client::AwsSettings f = daemon_aws;
    f.profile = profile;
    SLUICE_ASSIGN_OR_RETURN(so, client::s3_options_from_environment(f));
  } else {
    if (key_id.empty() || secret.empty())
      return fail(Code::kInvalidArgument,
                  where + ": aws_access_key_id and aws_secret_access_key go together");
    so.access_key = key_id;
    so.secret_key = secret;
    so.session_token = token;
  }
  store::StoreOptions out;
  out.backend.set(so);
  return std::optional<store::StoreOptions>(std::move(out));
}

}  // namespace

Result<std::vector<node::TeamGrant>> parse_teams(const Json& teams, const std::string& file,
                                                 const client::AwsSettings& daemon_aws,
                                                 const s3::S3Options& daemon_s3) {
  std::vector<node::TeamGrant> out;
  auto bad = [&](const std::string& why) {
    return fail(Code::kInvalidArgument, file + ": teams: " + why);
  };
  if (!teams.is_array()) return bad("must be a list");
  for (const Json& t : teams) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
      return bad("each team needs a \"name\"");
    node::TeamGrant g;
    g.name = t["name"].get<std::string>();
    if (!t.contains("uids") || !t["uids"].is_array())
      return bad(g.name + ": \"uids\" must be a list");
    for (const Json& u : t["uids"]) {
      if (!u.is_number_unsigned() || u.get<uint64_t>() > UINT32_MAX)
        return bad(g.name + ": uids are unsigned integers");
      g.uids.push_back(u.get<uint32_t>());
    }
    if (!t.contains("roots") || !t["roots"].is_array())
      return bad(g.name + ": \"roots\" must be a list");
    for (const Json& r : t["roots"]) {
      if (!r.is_string()) return bad(g.name + ": roots are URI strings");
      g.roots.push_back(r.get<std::string>());
    }
    SLUICE_ASSIGN_OR_RETURN(g.credentials,
                            team_credentials(t, file + ": team " + g.name, daemon_aws, daemon_s3));
    out.push_back(std::move(g));
  }
  return out;
}

Result<Json> apply_config(Args& a, std::string_view text, const std::string& file,
                          const FlagGiven& given) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return fail(Code::kInvalidArgument, file + ": not a JSON object");
  auto str = [&](const char* name, const char* flag, std::string& into) -> Status {
    if (!j.contains(name) || given(flag)) return ok();
    if (!j[name].is_string())
      return fail(Code::kInvalidArgument, file + ": \"" + name + "\" must be a string");
    into = j[name].get<std::string>();
    return ok();
  };
  auto num = [&](const char* name, const char* flag, unsigned& into) -> Status {
    if (!j.contains(name) || given(flag)) return ok();
    if (!j[name].is_number_unsigned() || j[name].get<uint64_t>() > UINT32_MAX)
      return fail(Code::kInvalidArgument, file + ": \"" + name + "\" must be a count");
    into = j[name].get<unsigned>();
    return ok();
  };
  auto boolean = [&](const char* name, const char* flag, bool& into) -> Status {
    if (!j.contains(name) || given(flag)) return ok();
    if (!j[name].is_boolean())
      return fail(Code::kInvalidArgument, file + ": \"" + name + "\" must be true or false");
    into = j[name].get<bool>();
    return ok();
  };
  auto strings = [&](const char* name, const char* flag, std::vector<std::string>& into) -> Status {
    if (!j.contains(name) || given(flag)) return ok();
    auto bad = [&] {
      return fail(Code::kInvalidArgument, file + ": \"" + name + "\" must be a list of strings");
    };
    if (!j[name].is_array()) return bad();
    std::vector<std::string> out;
    for (const Json& v : j[name]) {
      if (!v.is_string()) return bad();
      out.push_back(v.get<std::string>());
    }
    into = std::move(out);
    return ok();
  };
  SLUICE_RETURN_IF_ERROR(str("socket", "--socket", a.socket));
  SLUICE_RETURN_IF_ERROR(str("cache_dir", "--cache-dir", a.cache.dir));
  SLUICE_RETURN_IF_ERROR(str("cache_ram", "--cache-ram", a.cache.ram));
  SLUICE_RETURN_IF_ERROR(boolean("prefault_ram", "--prefault-ram", a.prefault_ram));
  SLUICE_RETURN_IF_ERROR(str("cache_size", "--cache-size", a.cache.disk));
  SLUICE_RETURN_IF_ERROR(str("chunk_size", "--chunk-size", a.cache.chunk));
  SLUICE_RETURN_IF_ERROR(str("policy", "--policy", a.cache.policy));
  SLUICE_RETURN_IF_ERROR(str("endpoint_url", "--endpoint-url", a.aws.endpoint_url));
  SLUICE_RETURN_IF_ERROR(str("region", "--region", a.aws.region));
  SLUICE_RETURN_IF_ERROR(str("profile", "--profile", a.aws.profile));
  SLUICE_RETURN_IF_ERROR(num("revalidate_ms", "--revalidate-ms", a.cache.revalidate_ms));
  SLUICE_RETURN_IF_ERROR(num("max_connections", "--max-connections", a.max_connections));
  SLUICE_RETURN_IF_ERROR(
      num("max_connections_per_uid", "--max-connections-per-uid", a.max_per_uid));
  SLUICE_RETURN_IF_ERROR(num("idle_timeout_s", "--idle-timeout", a.idle_s));
  SLUICE_RETURN_IF_ERROR(str("window_memory", "--window-memory", a.window_memory));
  SLUICE_RETURN_IF_ERROR(str("ledger", "--ledger", a.ledger));
  SLUICE_RETURN_IF_ERROR(str("peer_listen", "--peer-listen", a.peer_listen));
  SLUICE_RETURN_IF_ERROR(str("peers", "--peers", a.peers));
  SLUICE_RETURN_IF_ERROR(str("node_name", "--node-name", a.node_name));
  SLUICE_RETURN_IF_ERROR(str("node_secret_file", "--node-secret-file", a.secret_file));
  SLUICE_RETURN_IF_ERROR(str("objects_dir", "--objects-dir", a.objects_dir));
  SLUICE_RETURN_IF_ERROR(num("peer_timeout_ms", "--peer-timeout-ms", a.peer_timeout_ms));
  SLUICE_RETURN_IF_ERROR(strings("peer_file_roots", "--peer-file-root", a.peer_file_roots));
  SLUICE_RETURN_IF_ERROR(num("access_ttl_s", "--access-ttl", a.access_ttl_s));
  return j.contains("teams") ? j["teams"] : Json();
}

Status configure_peers(const Args& a, node::PeerConfig& p) {
  if (!a.peer_file_roots.empty() && a.peers.empty())
    return fail(Code::kInvalidArgument, "--peer-file-root (peer_file_roots) needs --peers");
  if (a.peer_listen.empty()) {
    if (!a.peers.empty())
      return fail(Code::kInvalidArgument, "--peers needs --peer-listen HOST:PORT");
    return ok();
  }
  size_t colon = a.peer_listen.rfind(':');
  unsigned port = 0;
  if (colon == std::string::npos ||
      std::sscanf(a.peer_listen.c_str() + colon + 1, "%u", &port) != 1 || port > 65535)
    return fail(Code::kInvalidArgument,
                "--peer-listen '" + a.peer_listen + "': expected HOST:PORT (an IPv4 address)");
  p.listen = true;
  p.host = a.peer_listen.substr(0, colon);
  p.port = static_cast<uint16_t>(port);
  p.timeout = std::chrono::milliseconds(a.peer_timeout_ms);
  p.file_roots = a.peer_file_roots;
  if (a.peers.empty()) return ok();  // /metrics only
  auto members = client::members_from_environment(a.peers, p.port);
  if (!members) return std::unexpected(members.error().with_context("--peers (and --peer-listen)"));
  std::string self = a.node_name.empty() ? client::short_host_name() : a.node_name;
  SLUICE_ASSIGN_OR_RETURN(peer::Membership m, peer::Membership::make(std::move(*members), self));
  p.membership = std::make_shared<const peer::Membership>(std::move(m));
  if (a.secret_file.empty())
    return fail(Code::kInvalidArgument, "--peers needs --node-secret-file FILE");
  SLUICE_ASSIGN_OR_RETURN(p.secret, client::read_node_secret(a.secret_file));
  return ok();
}

}  // namespace sluice::sluiced
