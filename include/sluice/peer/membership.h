// sluice/peer/membership.h: the daemons of a job, and which of them owns a chunk.
//
//   auto hosts = peer::parse_host_list(text, "/etc/sluice/peers").value();
//   auto m = peer::Membership::make(hosts, "node07").value();
//   const peer::Member& owner = m.owner("3f2a.../shards/0001.tar#12");
//
// Ownership is rendezvous (highest random weight) hashing: each member scores a chunk with
// XXH3-64 of the chunk's id seeded by the member's name, and the highest score owns it.
// Every daemon with the same member names computes the same owner without talking to the
// others, and a membership change moves only the chunks whose owner joined or left: a new
// member takes about 1/(n+1) of the chunks, all of them from the others, and none move
// between the members that stayed.
//
// Contract: names are unique and non-empty, without control characters, '@' or '/' (a name
// is sent in request headers and written in sluiced:// URIs); a Membership is immutable once
// made, so it may be read from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::peer {

struct Member {
  std::string name;  // identity in the hash: the same on every daemon of the job
  std::string host;  // where its peer port listens (a name or an IP literal)
  uint16_t port = 0;
  // false: the member fetches from the others but owns no chunk (a node with little NVMe,
  // or one joining late). Ownership is hashed over the members that own.
  bool owns = true;
  std::string address() const { return host + ":" + std::to_string(port); }
};

class Membership {
 public:
  // `self` must be one of the members' names, and at least one member must own chunks.
  // InvalidArgument on a duplicate, empty or malformed name.
  static Result<Membership> make(std::vector<Member> members, std::string_view self);

  // The member that owns `chunk_id` (never fails: a membership has at least one member).
  const Member& owner(std::string_view chunk_id) const;
  // Every member that owns chunks, best first for `key` (owner(key) first): the order
  // depends only on the names and the key, so every node computes the same one. A node's
  // copies of something (a checkpoint rank's peer copy) go to the first member other than
  // itself; a replacement node under another name finds them among the first two.
  std::vector<const Member*> ranked(std::string_view key) const;
  const Member& self() const { return members_[self_]; }
  bool is_self(const Member& m) const { return &m == &members_[self_]; }
  const std::vector<Member>& members() const { return members_; }

 private:
  Membership() = default;
  uint64_t score(size_t member, std::string_view key) const;
  std::vector<Member> members_;
  std::vector<uint64_t> seeds_;  // XXH3-64 of each member's name
  size_t self_ = 0;
};

// A host list: one member a line, "NAME HOST:PORT" or "HOST:PORT" (then the name is
// HOST:PORT), optionally followed by "fetch-only" (owns nothing); blank lines and '#'
// comments are skipped. Errors name `source` and the line.
Result<std::vector<Member>> parse_host_list(std::string_view text, std::string_view source);

// Expands a Slurm hostlist ("gpu[01-03,07],login-a", as in SLURM_JOB_NODELIST) into names,
// in order. Ranges keep their zero padding; at most 65536 names.
Result<std::vector<std::string>> expand_hostlist(std::string_view list);

}  // namespace sluice::peer
