// The daemon's figures as JSON (sluice/node/stats.h).
#include "sluice/node/stats.h"

#include <nlohmann/json.hpp>

#include "sluice/cache/json.h"
#include "sluice/peer/peer_store.h"

namespace sluice::node {

using nlohmann::json;

namespace {

template <typename S>
using Counters = std::initializer_list<std::pair<const char*, uint64_t S::*>>;
const Counters<ServerStats> kServer = {{"connections", &ServerStats::connections},
                                       {"connections_refused", &ServerStats::connections_refused},
                                       {"requests", &ServerStats::requests},
                                       {"request_errors", &ServerStats::request_errors},
                                       {"handoff_chunks", &ServerStats::handoff_chunks},
                                       {"handoff_bytes", &ServerStats::handoff_bytes},
                                       {"inline_bytes", &ServerStats::inline_bytes},
                                       {"window_bytes", &ServerStats::window_bytes},
                                       {"windows_bytes", &ServerStats::windows_bytes}};
const Counters<ChargingStats> kCharging = {{"admitted_chunks", &ChargingStats::admitted_chunks},
                                           {"admitted_bytes", &ChargingStats::admitted_bytes},
                                           {"refused_chunks", &ChargingStats::refused_chunks},
                                           {"refused_bytes", &ChargingStats::refused_bytes},
                                           {"freed_bytes", &ChargingStats::freed_bytes},
                                           {"uncharged_chunks", &ChargingStats::uncharged_chunks},
                                           {"flush_errors", &ChargingStats::flush_errors}};
const Counters<PeerStatus> kPeer = {{"fetched_chunks", &PeerStatus::fetched_chunks},
                                    {"fetched_bytes", &PeerStatus::fetched_bytes},
                                    {"errors", &PeerStatus::errors}};

// Reads fields of one JSON object; the first mistyped one is remembered as the error.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) bad("", "an object");
  }
  void number(const char* name, uint64_t& into) {
    if (const json* v = find(name)) {
      if (v->is_number_unsigned() || (v->is_number_integer() && v->get<int64_t>() >= 0))
        into = v->get<uint64_t>();
      else
        bad(name, "a count");
    }
  }
  void text(const char* name, std::string& into) {
    if (const json* v = find(name)) {
      if (v->is_string())
        into = v->get<std::string>();
      else
        bad(name, "a string");
    }
  }
  void flag(const char* name, bool& into) {
    if (const json* v = find(name)) {
      if (v->is_boolean())
        into = v->get<bool>();
      else
        bad(name, "true or false");
    }
  }
  // The member `name` when present and not null.
  const json* find(const char* name) const {
    if (!j_.is_object()) return nullptr;
    auto it = j_.find(name);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Status status() const { return error_ ? Status(std::unexpected(*error_)) : Status(); }

 private:
  void bad(std::string_view name, std::string_view what) {
    if (error_) return;
    error_ = Error(Code::kCorruption, "sluiced's stat reply: " + where_ +
                                          (name.empty() ? "" : "\"" + std::string(name) + "\" ") +
                                          "is not " + std::string(what));
  }
  const json& j_;
  std::string where_;
  std::optional<Error> error_;
};

}  // namespace

void to_json(json& j, const DaemonStats& s) {
  j = s.cache;  // cache::to_json
  j["chunk_size"] = s.chunk_size;
  json& server = j["server"] = json::object();
  for (auto [name, at] : kServer) server[name] = s.server.*at;
  if (s.charging) {
    json c = {{"ledger", s.charging->ledger}};
    for (auto [name, at] : kCharging) c[name] = (*s.charging).*at;
    j["charging"] = std::move(c);
  } else {
    j["charging"] = nullptr;
  }
  json peers = json::array();
  for (const PeerStatus& p : s.peers) {
    json x = {{"name", p.name}, {"address", p.address}, {"self", p.self},
              {"up", p.up},     {"state", p.state},     {"last_error", p.last_error}};
    for (auto [name, at] : kPeer) x[name] = p.*at;
    peers.push_back(std::move(x));
  }
  j["peers"] = std::move(peers);
  j["bytes_from"] = {{"backing", s.backing_bytes}, {"peer", s.peer_bytes}};
}

Result<DaemonStats> daemon_stats_from_json(const json& j) {
  DaemonStats s;
  Reader top(j, "");
  SLUICE_RETURN_IF_ERROR(top.status());
  s.cache = cache::cache_stats_from_json(j);
  top.number("chunk_size", s.chunk_size);
  SLUICE_RETURN_IF_ERROR(top.status());
  if (const json* v = top.find("server")) {
    Reader r(*v, "\"server\": ");
    for (auto [name, at] : kServer) r.number(name, s.server.*at);
    SLUICE_RETURN_IF_ERROR(r.status());
  }
  if (const json* v = top.find("charging")) {
    Reader r(*v, "\"charging\": ");
    ChargingStats c;
    r.text("ledger", c.ledger);
    for (auto [name, at] : kCharging) r.number(name, c.*at);
    SLUICE_RETURN_IF_ERROR(r.status());
    s.charging = std::move(c);
  }
  if (const json* v = top.find("peers")) {
    if (!v->is_array())
      return fail(Code::kCorruption, "sluiced's stat reply: \"peers\" is not a list");
    for (const json& x : *v) {
      Reader r(x, "a peer: ");
      PeerStatus p;
      r.text("name", p.name);
      r.text("address", p.address);
      r.flag("self", p.self);
      r.flag("up", p.up);
      r.text("state", p.state);
      r.text("last_error", p.last_error);
      for (auto [name, at] : kPeer) r.number(name, p.*at);
      SLUICE_RETURN_IF_ERROR(r.status());
      // A daemon older than this reader sends no state: the same rule, from the other fields.
      if (p.state.empty())
        p.state =
            peer::PeerState{
                .self = p.self, .up = p.up, .fetched_chunks = p.fetched_chunks, .errors = p.errors}
                .state();
      s.peers.push_back(std::move(p));
    }
  }
  if (const json* v = top.find("bytes_from")) {
    Reader r(*v, "\"bytes_from\": ");
    r.number("backing", s.backing_bytes);
    r.number("peer", s.peer_bytes);
    SLUICE_RETURN_IF_ERROR(r.status());
  }
  return s;
}

}  // namespace sluice::node
