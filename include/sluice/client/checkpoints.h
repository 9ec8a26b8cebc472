// sluice/client/checkpoints.h: a checkpointer opened the way sluice does, from tier URIs:
// a path or file://, s3://bucket/prefix, sluiced://MEMBER@HOST:PORT/FOLDER/ (a peer
// daemon's object space), or peer://FOLDER/ (the job's peers keep the copy; docs/ckpt.md).
//
//   client::CheckpointTiers tiers;
//   tiers.uris = {"/nvme/ckpt", "s3://bucket/ckpt"};
//   ckpt::CheckpointerOptions o;  o.series = "llama";
//   auto cp = client::open_checkpointer(session, std::move(o), tiers).value();
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "sluice/ckpt/checkpointer.h"
#include "sluice/client/environment.h"
#include "sluice/client/session.h"
#include "sluice/core/status.h"
#include "sluice/peer/membership.h"

namespace sluice::client {

// This node's place among the job's daemons, for sluiced:// and peer:// tiers.
struct PeerTierSettings {
  std::string node;    // this node's member name
  std::string secret;  // the job's node secret: this node signs its requests with it
  // The job's daemons, for peer:// tiers; empty: a peer:// tier is refused.
  std::vector<peer::Member> members;
  std::string members_source;  // where they came from, for messages ("--peers FILE")
};

struct CheckpointTiers {
  std::vector<std::string> uris;  // nearest first; empty: HOME/ckpt
  bool require_all = true;        // false: only the first must commit (later: best effort)
  // Applied by the checkpointer after each save (CheckpointerOptions::gc_after_save) and
  // by its gc. open_checkpointer adds the ledger's pins (ckpt::Retention::pinned) to every
  // tier that lies in a project: a pinned step stays whatever keep_last says.
  ckpt::Retention retention;
  PeerTierSettings peers;
  // The caller writes new copies (save, sync): a missing local tier is made. Readers get
  // NotFound instead, so a mistyped path is an error, not an empty tier.
  bool writes = false;
  // Saves are charged to the project owning each tier (Session::charged), and what gc
  // removes uncharged.
  bool charge = false;
};

// The peer settings the tiers `uris` need, from `given` and the environment (PeerSpec):
// the node secret when a tier is a peer daemon's (sluiced:// or peer://), the members when
// one is peer://. InvalidArgument says which setting is missing.
Result<PeerTierSettings> peer_tier_settings(const PeerSpec& given,
                                            const std::vector<std::string>& uris);

// The tier a checkpointer uses when none is named: HOME/ckpt.
std::string default_checkpoint_tier(const std::string& home);

// Whether any of `uris` is a peer daemon's (sluiced:// or peer://): opening it needs this
// node's member name and the job's node secret.
bool names_peer_tier(const std::vector<std::string>& uris);

// The tier URIs with every peer://FOLDER/ resolved to sluiced:// URIs of the members that
// keep `series`' copies. The members' order for a series is the same on every node: a
// write goes to the first member other than this node (the next when it does not answer),
// so the copy is on one of the first three, which reads try in turn (this node among them:
// a replacement node may be the one that kept the copy). Other URIs pass through.
Result<std::vector<std::string>> resolve_peer_tiers(const std::vector<std::string>& uris,
                                                    const std::string& series, unsigned world,
                                                    const PeerTierSettings& peers,
                                                    const store::StoreOptions& options,
                                                    bool writes);

// Opens `options` (series, rank, staging, ...) with the tiers `tiers` names.
Result<std::unique_ptr<ckpt::Checkpointer>> open_checkpointer(const Session& session,
                                                              ckpt::CheckpointerOptions options,
                                                              const CheckpointTiers& tiers);

}  // namespace sluice::client
