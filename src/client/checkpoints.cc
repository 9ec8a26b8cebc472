// Checkpointers opened from tier URIs (sluice/client/checkpoints.h).
#include "sluice/client/checkpoints.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>

#include "sluice/client/environment.h"
#include "sluice/client/ledger.h"
#include "sluice/peer/object_store.h"

namespace sluice::client {

namespace {

// The sluiced:// URI of `folder` in member `m`'s object space.
std::string member_uri(const peer::Member& m, std::string_view folder) {
  return "sluiced://" + m.name + "@" + m.address() + "/" + std::string(folder);
}

// Of the first members other than this node, the first that answers (one that does not
// passes its turn); the first of them when none does, so the save reports its error.
Result<std::string> writable_peer(const std::string& uri, const std::string& series,
                                  const peer::Membership& m,
                                  const std::vector<const peer::Member*>& order,
                                  const PeerTierSettings& peers, const store::StoreOptions& so) {
  std::vector<std::string> picks;
  for (const peer::Member* x : order)
    if (!m.is_self(*x) && picks.size() < 2) picks.push_back(member_uri(*x, uri.substr(7)));
  if (picks.empty())
    return fail(Code::kInvalidArgument, "tier " + uri + ": no member of " + peers.members_source +
                                            " but this node ('" + peers.node + "') keeps copies");
  for (const std::string& p : picks) {
    auto s = store::open_store(p, so);
    if (s) {
      auto st = (*s)->stat(series + "/.probe");
      if (!st && (st.error().code() == Code::kUnavailable || st.error().code() == Code::kTimedOut))
        continue;
    }
    return p;
  }
  return picks.front();
}

// The ledger's pins on the tier at `uri`, asked anew at each gc (a pin set during a run
// counts), from the ledger writes are charged through; none when there is no ledger.
std::function<Result<std::vector<std::string>>()> pins_of(const Session& session,
                                                          const std::string& uri) {
  std::string location = uri;
  if (location.find("://") == std::string::npos) {
    std::error_code ec;
    location = std::filesystem::absolute(location, ec).string();
  }
  return [session, location]() -> Result<std::vector<std::string>> {
    SLUICE_ASSIGN_OR_RETURN(auto ledger, ledger_for_writes(session));
    if (!ledger) return std::vector<std::string>{};
    SLUICE_ASSIGN_OR_RETURN(auto projects, ledger->projects());
    SLUICE_ASSIGN_OR_RETURN(auto pins, ledger->pins());
    return ledger::Ledger::pins_within(projects, pins, location);
  };
}

}  // namespace

Result<PeerTierSettings> peer_tier_settings(const PeerSpec& given,
                                            const std::vector<std::string>& uris) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  PeerTierSettings out;
  out.node = !given.node.empty() ? given.node : env("SLUICE_NODE_NAME");
  if (out.node.empty()) out.node = short_host_name();
  if (!names_peer_tier(uris)) return out;
  const std::string secret_file =
      !given.secret_file.empty() ? given.secret_file : env("SLUICE_NODE_SECRET_FILE");
  if (secret_file.empty())
    return fail(Code::kInvalidArgument,
                "a sluiced:// or peer:// tier needs the job's node secret: --node-secret-file "
                "FILE (Python: node_secret_file=), or $SLUICE_NODE_SECRET_FILE");
  SLUICE_ASSIGN_OR_RETURN(out.secret, read_node_secret(secret_file));
  for (const std::string& t : uris) {
    if (!t.starts_with("peer://")) continue;
    std::string spec = given.members, source = "--peers";
    if (spec.empty()) spec = env("SLUICE_PEERS"), source = "$SLUICE_PEERS";
    if (spec.empty())
      return fail(Code::kInvalidArgument,
                  "tier " + t +
                      ": a peer:// tier needs the job's members: --peers FILE or --peers slurm "
                      "(Python: peers=), or $SLUICE_PEERS");
    uint16_t port = given.port;
    if (port == 0 && !env("SLUICE_PEER_PORT").empty()) {
      const std::string text = env("SLUICE_PEER_PORT");
      unsigned v = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || p != text.data() + text.size() || v == 0 || v > 65535)
        return fail(Code::kInvalidArgument,
                    "$SLUICE_PEER_PORT '" + text + "' is not a port (1 to 65535)");
      port = static_cast<uint16_t>(v);
    }
    auto members = members_from_environment(spec, port);
    if (!members)
      return std::unexpected(members.error().with_context(source + " (and the peer port)"));
    out.members = std::move(*members);
    out.members_source = source + " " + spec;
    break;
  }
  return out;
}

std::string default_checkpoint_tier(const std::string& home) {
  return home + "/ckpt";
}

bool names_peer_tier(const std::vector<std::string>& uris) {
  return std::any_of(uris.begin(), uris.end(), [](const std::string& t) {
    return t.starts_with("sluiced://") || t.starts_with("peer://");
  });
}

Result<std::vector<std::string>> resolve_peer_tiers(const std::vector<std::string>& uris,
                                                    const std::string& series, unsigned world,
                                                    const PeerTierSettings& peers,
                                                    const store::StoreOptions& so, bool writes) {
  std::vector<std::string> out;
  for (const std::string& uri : uris) {
    if (!uri.starts_with("peer://")) {
      out.push_back(uri);
      continue;
    }
    auto refuse = [&](const std::string& why) {
      return fail(Code::kInvalidArgument, "tier " + uri + ": " + why);
    };
    if (peers.members.empty()) return refuse("a peer:// tier needs the job's members (--peers)");
    if (series.empty()) return refuse("a peer:// tier needs --series");
    if (world > 1)
      return refuse(
          "the ranks of a multi-rank save would choose different peers; name one "
          "with sluiced://MEMBER@HOST:PORT/FOLDER/");
    SLUICE_ASSIGN_OR_RETURN(peer::Membership m, peer::Membership::make(peers.members, peers.node));
    std::vector<const peer::Member*> order = m.ranked(series);
    if (order.size() > 3) order.resize(3);
    if (!writes) {
      for (const peer::Member* x : order) out.push_back(member_uri(*x, uri.substr(7)));
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(std::string pick, writable_peer(uri, series, m, order, peers, so));
    out.push_back(std::move(pick));
  }
  return out;
}

Result<std::unique_ptr<ckpt::Checkpointer>> open_checkpointer(const Session& session,
                                                              ckpt::CheckpointerOptions o,
                                                              const CheckpointTiers& tiers) {
  store::StoreOptions so = session.store_options();
  if (names_peer_tier(tiers.uris)) {
    // A peer daemon's object space: this node signs as a member of the job.
    if (tiers.peers.secret.empty())
      return fail(Code::kInvalidArgument,
                  "a sluiced:// or peer:// tier needs the job's node secret (--node-secret-file)");
    peer::register_object_scheme();
    peer::ObjectStoreOptions po;
    po.node = tiers.peers.node;
    po.secret = tiers.peers.secret;
    so.backend.set(po);
  }
  SLUICE_ASSIGN_OR_RETURN(
      std::vector<std::string> uris,
      resolve_peer_tiers(tiers.uris, o.series, o.world, tiers.peers, so, tiers.writes));
  if (uris.empty()) uris.push_back(default_checkpoint_tier(session.options().home));
  for (const auto& uri : uris) {
    // The default tier is sluice's own directory: made on first use by any command.
    SLUICE_ASSIGN_OR_RETURN(ckpt::Tier t,
                            ckpt::open_tier(uri, so, tiers.writes || tiers.uris.empty()));
    t.retention = tiers.retention;
    t.retention.pinned = pins_of(session, uri);
    if (tiers.charge) {
      SLUICE_ASSIGN_OR_RETURN(t.store, session.charged(t.store, ledger::Kind::kCheckpoint));
    }
    t.required = tiers.require_all || o.tiers.empty();
    o.tiers.push_back(std::move(t));
  }
  return ckpt::Checkpointer::open(std::move(o));
}

}  // namespace sluice::client
