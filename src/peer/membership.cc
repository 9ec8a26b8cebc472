// Membership: rendezvous hashing over the job's daemons; host lists and Slurm hostlists.
#include "sluice/peer/membership.h"

#include <algorithm>
#include <charconv>
#include <set>

#include <xxhash.h>

namespace sluice::peer {

Result<Membership> Membership::make(std::vector<Member> members, std::string_view self) {
  if (members.empty()) return fail(Code::kInvalidArgument, "peers: the membership is empty");
  Membership m;
  std::set<std::string_view> names;
  bool found = false;
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& x = members[i];
    if (x.name.empty()) return fail(Code::kInvalidArgument, "peers: a member without a name");
    // A name goes into request headers as it is, and into sluiced://NAME@HOST:PORT/ URIs.
    for (char c : x.name)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '@' || c == '/')
        return fail(Code::kInvalidArgument, "peers: member '" + x.name +
                                                "': a name holds no control character, '@' or '/'");
    if (!names.insert(x.name).second)
      return fail(Code::kInvalidArgument, "peers: member '" + x.name + "' is listed twice");
    if (x.name == self) {
      m.self_ = i;
      found = true;
    }
  }
  if (!found) {
    std::string names_listed;
    for (size_t i = 0; i < members.size() && i < 8; ++i)
      names_listed += (i ? ", " : "") + members[i].name;
    if (members.size() > 8) names_listed += ", ...";
    return fail(Code::kInvalidArgument,
                "peers: this node ('" + std::string(self) + "') is not in the membership (" +
                    names_listed +
                    "): this node's name must be one of them (a line with only HOST:PORT is "
                    "named HOST:PORT)");
  }
  if (std::none_of(members.begin(), members.end(), [](const Member& x) { return x.owns; }))
    return fail(Code::kInvalidArgument, "peers: every member is fetch-only: none owns a chunk");
  m.members_ = std::move(members);
  for (const Member& x : m.members_) m.seeds_.push_back(XXH3_64bits(x.name.data(), x.name.size()));
  return m;
}

uint64_t Membership::score(size_t member, std::string_view key) const {
  return XXH3_64bits_withSeed(key.data(), key.size(), seeds_[member]);
}

const Member& Membership::owner(std::string_view chunk_id) const {
  size_t best = members_.size();
  uint64_t best_score = 0;
  for (size_t i = 0; i < members_.size(); ++i) {
    if (!members_[i].owns) continue;
    uint64_t sc = score(i, chunk_id);
    // Ties (astronomically rare) go to the smaller name, so every daemon agrees.
    if (best == members_.size() || sc > best_score ||
        (sc == best_score && members_[i].name < members_[best].name)) {
      best = i;
      best_score = sc;
    }
  }
  return members_[best];
}

std::vector<const Member*> Membership::ranked(std::string_view key) const {
  std::vector<std::pair<uint64_t, const Member*>> scored;
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i].owns) scored.emplace_back(score(i, key), &members_[i]);
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second->name < b.second->name;
  });
  std::vector<const Member*> out;
  for (const auto& [s, m] : scored) out.push_back(m);
  return out;
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

Result<Member> parse_address(std::string_view addr, std::string_view where) {
  size_t colon = addr.rfind(':');
  auto bad = [&](const std::string& why) {
    return fail(Code::kInvalidArgument,
                std::string(where) + ": '" + std::string(addr) + "': " + why);
  };
  if (colon == std::string_view::npos || colon == 0) return bad("expected HOST:PORT");
  unsigned port = 0;
  std::string_view p = addr.substr(colon + 1);
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
  if (ec != std::errc() || end != p.data() + p.size() || port == 0 || port > 65535)
    return bad("the port must be 1-65535");
  Member m;
  m.host = std::string(addr.substr(0, colon));
  for (char c : m.host) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_';
    if (!ok) return bad("the host may hold letters, digits, '-', '.' and '_' only");
  }
  m.port = static_cast<uint16_t>(port);
  return m;
}

}  // namespace

Result<std::vector<Member>> parse_host_list(std::string_view text, std::string_view source) {
  std::vector<Member> out;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    std::string where = std::string(source) + ":" + std::to_string(line_no);
    std::vector<std::string_view> words;
    for (std::string_view rest = line; !rest.empty();) {
      size_t sp = rest.find_first_of(" \t");
      words.push_back(rest.substr(0, sp));
      rest = sp == std::string_view::npos ? std::string_view() : trim(rest.substr(sp));
    }
    bool owns = true;
    if (words.size() > 1 && words.back() == "fetch-only") {
      owns = false;
      words.pop_back();
    }
    if (words.size() > 2)
      return fail(Code::kInvalidArgument,
                  where + ": expected 'NAME HOST:PORT [fetch-only]' or 'HOST:PORT [fetch-only]'");
    SLUICE_ASSIGN_OR_RETURN(Member m, parse_address(words.back(), where));
    m.name = std::string(words.front());
    m.owns = owns;
    out.push_back(std::move(m));
    if (out.size() > 65536) return fail(Code::kInvalidArgument, where + ": over 65536 members");
  }
  if (out.empty()) return fail(Code::kInvalidArgument, std::string(source) + ": no members");
  return out;
}

namespace {

// Expands one bracket list ("01-03,07") after `prefix`, then `suffix` (itself expanded).
Status expand_into(std::string_view item, std::vector<std::string>& out) {
  size_t open = item.find('[');
  if (open == std::string_view::npos) {
    if (item.find(']') != std::string_view::npos)
      return fail(Code::kInvalidArgument, "hostlist: unmatched ']' in '" + std::string(item) + "'");
    out.emplace_back(item);
    return ok();
  }
  size_t close = item.find(']', open);
  if (close == std::string_view::npos)
    return fail(Code::kInvalidArgument, "hostlist: unmatched '[' in '" + std::string(item) + "'");
  std::string_view prefix = item.substr(0, open), ranges = item.substr(open + 1, close - open - 1);
  std::string_view rest = item.substr(close + 1);
  while (true) {
    size_t comma = ranges.find(',');
    std::string_view r = ranges.substr(0, comma);
    size_t dash = r.find('-');
    std::string_view lo_s = r.substr(0, dash);
    std::string_view hi_s = dash == std::string_view::npos ? lo_s : r.substr(dash + 1);
    uint64_t lo = 0, hi = 0;
    auto num = [](std::string_view s, uint64_t& v) {
      auto [e, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      return !s.empty() && ec == std::errc() && e == s.data() + s.size();
    };
    if (!num(lo_s, lo) || !num(hi_s, hi) || hi < lo)
      return fail(Code::kInvalidArgument, "hostlist: bad range '" + std::string(r) + "'");
    if (hi - lo >= 65536 || out.size() + (hi - lo) >= 65536)
      return fail(Code::kInvalidArgument, "hostlist: over 65536 names");
    size_t width = lo_s.size();
    for (uint64_t v = lo; v <= hi; ++v) {
      std::string n = std::to_string(v);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      std::vector<std::string> tails;
      SLUICE_RETURN_IF_ERROR(expand_into(rest, tails));
      for (const std::string& t : tails) out.push_back(std::string(prefix) + n + t);
      if (out.size() > 65536) return fail(Code::kInvalidArgument, "hostlist: over 65536 names");
    }
    if (comma == std::string_view::npos) break;
    ranges.remove_prefix(comma + 1);
  }
  return ok();
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view list) {
  std::vector<std::string> out;
  // Split on commas outside brackets.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1)
      return fail(Code::kInvalidArgument, "hostlist '" + std::string(list) + "': bad brackets");
    if (c == ',' && depth == 0) {
      std::string_view item = trim(list.substr(start, i - start));
      if (!item.empty()) SLUICE_RETURN_IF_ERROR(expand_into(item, out));
      start = i + 1;
    }
  }
  if (depth != 0)
    return fail(Code::kInvalidArgument, "hostlist '" + std::string(list) + "': bad brackets");
  if (out.empty()) return fail(Code::kInvalidArgument, "hostlist is empty");
  return out;
}

}  // namespace sluice::peer
