// sluiced:// URIs (sluiced://MEMBER@HOST:PORT/FOLDER/, a peer daemon's object space) as the
// library reads them: peer::parse_object_uri (what the sluiced:// store opens), open_store
// with the store registered (nothing is sent: a store makes no request until asked), the
// client layer's locations (parse_location, then the store part alone), ckpt::open_tier,
// a project location in the ledger (validate_location), and peer://FOLDER/ tiers resolved
// to sluiced:// URIs of the job's members (client::resolve_peer_tiers, reads only: no
// member is asked). The input is the URI, then optionally a newline and a peers file (its
// first member is this node) for peer:// tiers; without one, three members.
// Beyond "no crash": a URI that parses opens as a store named by it, parses the same when
// written back from its parts, holds no control character in its member or address (they
// go into the HTTP request as they are), names the same member and address as a location's
// store, and is a valid project location; a peer:// tier resolves to URIs naming the
// members it was resolved from, and fails only where its folder would fail for any member.
#include <cstddef>
#include <cstdint>
#include <set>

#include "fuzz_util.h"
#include "peer/object_uri.h"
#include "sluice/ckpt/checkpointer.h"
#include "sluice/client/checkpoints.h"
#include "sluice/client/location.h"
#include "sluice/ledger/ledger.h"
#include "sluice/peer/membership.h"
#include "sluice/peer/object_store.h"
#include "sluice/store/store.h"

using namespace sluice;

namespace {

constexpr std::string_view kSecret = "fuzz-node-secret-0123456789";

bool has_control(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  return false;
}

store::StoreOptions store_options(const std::string& node) {
  store::StoreOptions so;
  peer::ObjectStoreOptions po;
  po.node = node;
  po.secret = std::string(kSecret);
  so.backend.set(po);
  return so;
}

void sluiced_uri(std::string_view uri) {
  const store::StoreOptions so = store_options("node-1");
  auto w = peer::parse_object_uri(uri);
  auto s = store::open_store(uri, so);
  if (!w) {
    if (uri.starts_with("sluiced://"))
      SLUICE_FUZZ_CHECK(!s, "a URI that does not parse does not open");
    return;
  }
  SLUICE_FUZZ_CHECK(s && (*s)->uri() == uri, "a URI that parses opens a store named by it");
  SLUICE_FUZZ_CHECK(!w->member.empty() && w->address.find(':') != std::string::npos,
                    "a member and HOST:PORT");
  SLUICE_FUZZ_CHECK(w->prefix.empty() || w->prefix.ends_with('/'), "a folder ends in '/'");
  SLUICE_FUZZ_CHECK(!has_control(w->member) && !has_control(w->address),
                    "no control character reaches the request");
  auto again =
      peer::parse_object_uri("sluiced://" + w->member + "@" + w->address + "/" + w->prefix);
  SLUICE_FUZZ_CHECK(again && again->member == w->member && again->address == w->address &&
                        again->prefix == w->prefix,
                    "a URI written back from its parts parses the same");

  // The client layer: the location's store is the same member's object space.
  auto loc = client::parse_location(std::string(uri));
  SLUICE_FUZZ_CHECK(loc && !loc->local, "a sluiced:// URI is a location");
  auto root = peer::parse_object_uri(loc->store_uri);
  SLUICE_FUZZ_CHECK(
      root && root->member == w->member && root->address == w->address && root->prefix.empty(),
      "a location's store names the URI's member and address");
  SLUICE_FUZZ_CHECK(store::open_store(loc->store_uri, so).has_value(), "a location's store opens");
  auto tier = ckpt::open_tier(uri, so, false);
  SLUICE_FUZZ_CHECK(tier.has_value(), "a sluiced:// URI is a checkpoint tier");
  SLUICE_FUZZ_CHECK(ledger::validate_location("fuzz", uri).has_value(),
                    "a sluiced:// URI is a project location");
}

void peer_tier(std::string_view uri, std::string_view peers_file) {
  if (!uri.starts_with("peer://")) return;
  auto members = peer::parse_host_list(
      peers_file.empty() ? "node-1 10.0.0.1:7470\nnode-2 10.0.0.2:7470\nnode-3 h3:7470"
                         : peers_file,
      "fuzz-peers");
  if (!members || members->empty() || members->size() > 64) return;
  client::PeerTierSettings peers;
  peers.node = (*members)[0].name;
  peers.secret = std::string(kSecret);
  peers.members = *members;
  peers.members_source = "fuzz-peers";
  if (!peer::Membership::make(peers.members, peers.node)) return;
  std::set<std::pair<std::string, std::string>> known;
  for (const peer::Member& m : peers.members) known.emplace(m.name, m.address());
  const std::string folder(uri.substr(7));
  // What any member's URI with this folder does: the member must not change it.
  const bool folder_ok = peer::parse_object_uri("sluiced://m@h:1/" + folder).has_value();
  const store::StoreOptions so = store_options(peers.node);
  auto resolved =
      client::resolve_peer_tiers({std::string(uri)}, "series", 1, peers, so, /*writes=*/false);
  if (!resolved) return;
  for (const std::string& u : *resolved) {
    auto w = peer::parse_object_uri(u);
    SLUICE_FUZZ_CHECK(w.has_value() == folder_ok,
                      "a resolved peer:// tier parses unless its folder would not");
    if (w)
      SLUICE_FUZZ_CHECK(known.contains({w->member, w->address}),
                        "a resolved peer:// tier names a member at its address");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  peer::register_object_scheme();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return -1;
  const std::string_view text = fuzz::text_of(data, size);
  const size_t nl = text.find('\n');
  const std::string_view uri = text.substr(0, nl);
  const std::string_view peers = nl == std::string_view::npos ? "" : text.substr(nl + 1);
  sluiced_uri(uri);
  peer_tier(uri, peers);
  (void)client::names_peer_tier({std::string(uri)});
  return 0;
}
