// `sluice ckpt`: save files as a checkpoint, list, show, verify, restore and clean up.
// Every file is one tensor of dtype uint8 named by its path relative to the argument it
// came from; restore writes them back under --to, byte for byte.
#include "ckpt_cmd.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cache_flags.h"
#include "common.h"
#include "ledger_cmd.h"
#include "sluice/ckpt/checkpointer.h"
#include "sluice/core/fd.h"
#include "sluice/core/sizes.h"
#include "sluice/peer/object_store.h"
#include "sluice/s3/store.h"

namespace sluice::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct CkptArgs {
  std::string series;
  std::string step = "latest";
  std::vector<std::string> tiers;  // --to (save) or --from (the others)
  std::vector<std::string> paths;  // save
  std::string out_dir;             // restore --to
  client::AwsSettings aws;
  unsigned rank = 0, world = 1;
  std::string run_id;
  std::string node_name, secret_file;  // for sluiced:// and peer:// tiers
  std::string peers;                   // for peer:// tiers: a host list file, or "slurm"
  uint16_t peer_port = 0;              // with --peers slurm
  std::string require = "all";         // save: which tiers must commit
  int only_rank = -1;                  // restore --rank
  int tier = -1;                       // verify --tier
  unsigned keep_last = 0;
  uint64_t keep_every = 0;
  double grace_s = 3600;
  std::string staging = "1G";
  std::string chunk = "4M";
  unsigned commit_timeout_s = 600;
  bool json = false, no_progress = false, force = false;
  const std::atomic<bool>* cancel = nullptr;  // set by Ctrl-C (save, restore, sync)
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result<uint64_t> size_flag(const std::string& flag, const std::string& text) {
  auto v = parse_size(text);
  if (!v) return fail(Code::kInvalidArgument, flag + " '" + text + "': " + v.error().message());
  return *v;
}

// peer://FOLDER/ tiers, as sluiced://MEMBER@HOST:PORT/FOLDER/ of the members that keep
// the series' copies (docs/ckpt.md). The membership's order for the series is the same on
// every node: a write goes to the first member other than this node (the next one when it
// does not answer), so the copy is on one of the first three members, which reads try in
// turn (this node among them: a replacement node may be the one that kept the copy).
// Other tiers pass through.
Result<std::vector<std::string>> resolve_peer_tiers(const CkptArgs& a,
                                                    std::vector<std::string> uris,
                                                    const store::StoreOptions& so, bool writes) {
  std::vector<std::string> out;
  for (std::string& uri : uris) {
    if (!uri.starts_with("peer://")) {
      out.push_back(std::move(uri));
      continue;
    }
    auto refuse = [&](const std::string& why) {
      return fail(Code::kInvalidArgument, "tier " + uri + ": " + why);
    };
    if (a.peers.empty()) return refuse("a peer:// tier needs --peers FILE (or --peers slurm)");
    if (a.series.empty()) return refuse("a peer:// tier needs --series");
    if (a.world > 1)
      return refuse(
          "the ranks of a multi-rank save would choose different peers; name one "
          "with sluiced://MEMBER@HOST:PORT/FOLDER/");
    auto members = client::members_from_environment(a.peers, a.peer_port);
    if (!members) return std::unexpected(members.error().with_context("--peers (and --peer-port)"));
    const std::string self = a.node_name.empty() ? short_host_name() : a.node_name;
    SLUICE_ASSIGN_OR_RETURN(peer::Membership m, peer::Membership::make(std::move(*members), self));
    std::vector<const peer::Member*> order = m.ranked(a.series);
    if (order.size() > 3) order.resize(3);
    auto uri_of = [&](const peer::Member* x) {
      return "sluiced://" + x->name + "@" + x->address() + "/" + uri.substr(7);
    };
    if (!writes) {
      for (const peer::Member* x : order) out.push_back(uri_of(x));
      continue;
    }
    std::vector<std::string> picks;
    for (const peer::Member* x : order)
      if (!m.is_self(*x) && picks.size() < 2) picks.push_back(uri_of(x));
    if (picks.empty())
      return refuse("no member of --peers " + a.peers + " but this node ('" + self +
                    "') keeps copies");
    std::string pick = picks.front();
    for (const std::string& p : picks) {  // a peer that does not answer passes its turn
      auto s = store::open_store(p, so);
      if (s) {
        auto st = (*s)->stat(a.series + "/.probe");
        if (!st &&
            (st.error().code() == Code::kUnavailable || st.error().code() == Code::kTimedOut))
          continue;
      }
      pick = p;
      break;
    }
    out.push_back(pick);
  }
  return out;
}

// `writes`: the command writes new copies (save, sync), so a missing local tier is
// created; the others refuse it, so a mistyped path is an error, not an empty tier.
Result<std::unique_ptr<ckpt::Checkpointer>> open_checkpointer(const CkptArgs& a,
                                                              const std::string& home,
                                                              uint64_t staging, bool writes,
                                                              bool charge = false) {
  SLUICE_ASSIGN_OR_RETURN(client::Session session, open_session(a.aws));
  store::StoreOptions so = session.store_options();
  if (std::any_of(a.tiers.begin(), a.tiers.end(), [](const std::string& t) {
        return t.starts_with("sluiced://") || t.starts_with("peer://");
      })) {
    // A peer daemon's object space: this node signs as a member of the job.
    if (a.secret_file.empty())
      return fail(Code::kInvalidArgument,
                  "a sluiced:// or peer:// tier needs --node-secret-file FILE");
    peer::register_object_scheme();
    peer::ObjectStoreOptions po;
    po.node = a.node_name.empty() ? short_host_name() : a.node_name;
    SLUICE_ASSIGN_OR_RETURN(po.secret, read_secret(a.secret_file));
    so.backend.set(po);
  }
  ckpt::CheckpointerOptions o;
  o.series = a.series;
  o.rank = a.rank;
  o.world = a.world;
  o.run_id = a.run_id;
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> uris,
                          resolve_peer_tiers(a, a.tiers, so, writes));
  if (uris.empty()) uris.push_back(home + "/ckpt");
  for (const auto& uri : uris) {
    // The default tier is sluice's own directory: made on first use by any command.
    SLUICE_ASSIGN_OR_RETURN(ckpt::Tier t, ckpt::open_tier(uri, so, writes || a.tiers.empty()));
    t.retention = {a.keep_last, a.keep_every};
    // Saves are charged to the project owning the tier (and gc uncharges what it removes).
    if (charge) {
      SLUICE_ASSIGN_OR_RETURN(t.store, session.charged(t.store, ledger::Kind::kCheckpoint));
    }
    t.required = a.require == "all" || o.tiers.empty();
    o.tiers.push_back(std::move(t));
  }
  o.staging_bytes = staging;
  SLUICE_ASSIGN_OR_RETURN(o.chunk_size, size_flag("--chunk-size", a.chunk));
  o.commit_timeout = std::chrono::seconds(a.commit_timeout_s);
  o.incomplete_grace = std::chrono::seconds(static_cast<int64_t>(a.grace_s));
  o.gc_after_save = a.keep_last || a.keep_every;
  o.cancel = a.cancel;
  return ckpt::Checkpointer::open(std::move(o));
}

// A step number; `what` says what else --step may be there ("" for a save, which names a
// new step by its number only).
Result<uint64_t> parse_step(const std::string& text, std::string_view what = " or 'latest'") {
  uint64_t step = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (ec == std::errc() && p == text.data() + text.size() && !text.empty()) return step;
  if (what.empty())
    return fail(Code::kInvalidArgument,
                "--step '" + text + "': a save needs the step's number (0 to " +
                    std::to_string(ckpt::kMaxStep) + "), the training step it checkpoints");
  return fail(Code::kInvalidArgument,
              "--step '" + text + "' is not a step number" + std::string(what));
}

Result<uint64_t> resolve_step(ckpt::Checkpointer& cp, const std::string& text) {
  if (text == "latest") return cp.latest();
  return parse_step(text);
}

// ---------------------------------------------------------------------------------------
// save

// A file to save, pinned to what it was when the save began: its bytes are read only while
// the file is still that (device, inode, size, modification and change times), so one
// rewritten in place during the save fails it with Conflict instead of committing a mix.
struct InputFile {
  std::string name;  // the tensor name: the path relative to the argument
  std::string path;
  uint64_t size = 0;
  uint32_t mode = 0;  // permission bits, restored with the file
  struct stat identity {};
};

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
         a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

// Whether `inner` is `outer` or lies below it (both canonical).
bool within(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

Result<std::vector<InputFile>> collect_files(const std::vector<std::string>& args) {
  std::vector<InputFile> files;
  std::map<std::string, std::string> seen;  // name -> path
  // `follow`: p was a link (to a file inside the tree, checked) and is pinned to its target;
  // anything else is pinned as itself, so a file swapped for a link later is a Conflict.
  auto add = [&](std::string name, const fs::path& p, bool follow) -> Status {
    // Names become paths on restore: refuse here what restore would refuse there.
    Status st = store::validate_key(name);
    if (st && store::is_reserved_key(name))
      st = fail(Code::kInvalidArgument, "a .sluice-tmp component is reserved");
    if (st && !ckpt::valid_utf8(name)) st = fail(Code::kInvalidArgument, "the name is not UTF-8");
    if (!st)
      return fail(Code::kInvalidArgument, p.string() + " cannot be saved under the name '" +
                                              name.substr(0, 200) + "': " + st.error().message());
    auto [it, fresh] = seen.emplace(name, p.string());
    if (!fresh)
      return fail(Code::kInvalidArgument, "two inputs would be saved as '" + name +
                                              "': " + it->second + " and " + p.string());
    InputFile f{std::move(name), p.string(), 0, 0, {}};
    if ((follow ? ::stat(f.path.c_str(), &f.identity) : ::lstat(f.path.c_str(), &f.identity)) != 0)
      return fail_errno(errno, "stat " + f.path);
    if (!S_ISREG(f.identity.st_mode))
      return fail(Code::kInvalidArgument, f.path + " is no longer a regular file");
    f.size = static_cast<uint64_t>(f.identity.st_size);
    f.mode = static_cast<uint32_t>(f.identity.st_mode & 07777);
    files.push_back(std::move(f));
    return ok();
  };
  for (const auto& arg : args) {
    std::error_code ec;
    auto st = fs::status(arg, ec);
    if (ec) return fail(Code::kNotFound, "cannot read " + arg + ": " + ec.message());
    if (fs::is_regular_file(st)) {
      SLUICE_RETURN_IF_ERROR(add(fs::path(arg).filename().string(), arg, true));
      continue;
    }
    const fs::path top = fs::canonical(arg, ec);
    if (ec) return fail(Code::kNotFound, "cannot resolve " + arg + ": " + ec.message());
    if (!fs::is_directory(st))
      return fail(Code::kInvalidArgument, arg + " is not a regular file or a directory");
    std::vector<fs::path> found;
    for (auto it = fs::recursive_directory_iterator(arg, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      // A link to a file is saved under the link's own name; a link to a directory is
      // refused rather than skipped (it is not followed: loops, and trees saved twice).
      if (it->is_symlink(ec) && it->is_directory(ec))
        return fail(Code::kInvalidArgument, it->path().string() +
                                                " is a symbolic link to a directory: give the "
                                                "directory as an argument of its own");
      // A link to a file inside the tree is saved under its own name; one that leads out of
      // the tree (to /etc/shadow, say) is refused, as `cp -r` does.
      if (it->is_symlink(ec)) {
        std::error_code rec;
        const fs::path target = fs::canonical(it->path(), rec);
        if (rec || !within(target, top))
          return fail(Code::kInvalidArgument,
                      it->path().string() + " is a symbolic link leading out of " + arg +
                          (rec ? " (or dangling)" : " (to " + target.string() + ")") +
                          ": only what lies in the tree is saved");
      }
      if (it->is_regular_file(ec))
        found.push_back(it->path());
      else if (!it->is_directory(ec))
        return fail(Code::kInvalidArgument, it->path().string() +
                                                " is not a regular file (FIFOs, devices, sockets "
                                                "and dangling links are not saved)");
    }
    if (ec) return fail(Code::kIoError, "listing " + arg + ": " + ec.message());
    std::sort(found.begin(), found.end());
    for (const auto& p : found) {
      std::error_code lec;
      SLUICE_RETURN_IF_ERROR(
          add(p.lexically_relative(arg).generic_string(), p, fs::is_symlink(p, lec)));
    }
  }
  if (files.empty()) return fail(Code::kInvalidArgument, "nothing to save: no files in the inputs");
  return files;
}

// Reads a file's bytes as staging asks for them (opened per call, so a directory of many
// files holds no descriptors); a file that changes size while being saved fails the save.
ckpt::TensorView file_tensor(const InputFile& f) {
  ckpt::TensorView v;
  v.name = f.name;
  v.shape = {static_cast<int64_t>(f.size)};
  v.bytes = f.size;
  v.mode = f.mode;
  v.source = [path = f.path, size = f.size, id = f.identity](uint64_t off,
                                                             std::span<std::byte> dst) -> Status {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) return fail_errno(errno, "open " + path);
    auto changed = [&]() -> Status {
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "stat " + path);
      if (!S_ISREG(st.st_mode) || !same_file(st, id))
        return fail(Code::kConflict, path + " changed while being saved (it was " +
                                         std::to_string(size) +
                                         " bytes): nothing of this step was committed");
      return ok();
    };
    SLUICE_RETURN_IF_ERROR(changed());
    size_t got = 0;
    while (got < dst.size()) {
      ssize_t n =
          ::pread(fd.get(), dst.data() + got, dst.size() - got, static_cast<off_t>(off + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail_errno(errno, "read " + path);
      if (n == 0) return fail(Code::kConflict, path + " shrank while being saved");
      got += static_cast<size_t>(n);
    }
    return changed();  // a write during the read shows in the times
  };
  return v;
}

void print_progress(const ckpt::SaveProgress& p) {
  std::string line = "staged " + format_size(static_cast<double>(p.bytes_staged)) + "/" +
                     format_size(static_cast<double>(p.bytes_total));
  for (const auto& t : p.tiers)
    line +=
        "  " + t.tier + ": " + ckpt::to_string(t.state) +
        (t.state == ckpt::TierState::kWriting ? " " + format_size(static_cast<double>(t.bytes_done))
                                              : "");
  std::fprintf(stderr, "\r%-100s", line.c_str());
}

// `ckpt gc` and `save --keep-last` delete at once and know nothing of the ledger's pins:
// on a tier inside a project with pins they refuse, and send the user to `sluice gc`.
Status refuse_if_pinned(const CkptArgs& a, const std::string& home) {
  if (!a.keep_last && !a.keep_every) return {};
  SLUICE_ASSIGN_OR_RETURN(client::Session session, open_session(a.aws));
  SLUICE_ASSIGN_OR_RETURN(auto ledger, session.ledger_for_writes());
  if (!ledger) return {};
  SLUICE_ASSIGN_OR_RETURN(auto projects, ledger->projects());
  SLUICE_ASSIGN_OR_RETURN(auto pins, ledger->pins());
  std::vector<std::string> tiers = a.tiers;
  if (tiers.empty()) tiers.push_back(home + "/ckpt");
  for (const auto& tier : tiers) {
    std::string location = tier;
    if (location.find("://") == std::string::npos) {
      std::error_code ec;
      location = fs::absolute(location, ec).string();
    }
    const ledger::Project* p = ledger::Ledger::owner_of(projects, location);
    if (!p) continue;
    for (const auto& [project, prefix] : pins)
      if (project == p->id)
        return fail(Code::kPermissionDenied,
                    "tier " + tier + " belongs to project '" + p->id +
                        "', which has pinned data (" + prefix +
                        "): --keep-last/--keep-every here would not honour it; use "
                        "sluice gc rule set and sluice gc run, which do");
  }
  return {};
}

// A local tier inside a saved directory would have every save take in the earlier ones (and
// one holding an input would save its own shards): refused, as `cp -r` refuses a
// destination inside its source.
Status refuse_tier_in_inputs(const CkptArgs& a, const std::string& home) {
  std::vector<std::string> tiers = a.tiers;
  if (tiers.empty()) tiers.push_back(home + "/ckpt");
  for (const auto& tier : tiers) {
    std::string dir = tier;
    if (dir.starts_with("file://"))
      dir = dir.substr(7);
    else if (dir.find("://") != std::string::npos)
      continue;
    std::error_code ec;
    const fs::path t = fs::weakly_canonical(dir, ec);
    if (ec) continue;  // opening the tier reports it
    for (const auto& input : a.paths) {
      const fs::path in = fs::weakly_canonical(input, ec);
      if (ec) continue;  // collecting the inputs reports it
      if (within(t, in) || within(in, t))
        return fail(Code::kInvalidArgument,
                    "tier " + tier + " and input " + input +
                        " overlap: a tier inside a saved directory would save every earlier "
                        "step again (put the tier elsewhere)");
    }
  }
  return ok();
}

int run_save(const CkptArgs& a, const std::string& home) {
  auto number = parse_step(a.step, "");
  if (!number) return report_error(number.error());
  const uint64_t step = *number;
  if (auto s = refuse_if_pinned(a, home); !s) return report_error(s.error());
  if (auto st = refuse_tier_in_inputs(a, home); !st) return report_error(st.error());
  auto files = collect_files(a.paths);
  if (!files) return report_error(files.error());
  uint64_t total = 0;
  std::vector<ckpt::TensorView> views;
  for (const auto& f : *files) {
    total += f.size;
    views.push_back(file_tensor(f));
  }
  auto staging = size_flag("--staging", a.staging);
  if (!staging) return report_error(staging.error());
  // No more staging than the files need (a small save does not touch 1 GiB of memory).
  auto cp =
      open_checkpointer(a, home, std::min(*staging, total + (uint64_t{32} << 20)), true, true);
  if (!cp) return report_error(cp.error());
  const bool progress = !a.no_progress && !a.json && ::isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  auto h = (*cp)->save(step, views);
  if (!h) return report_error(h.error());
  const double staged_s = seconds_since(t0);
  std::vector<double> tier_s((*cp)->options().tiers.size(), 0);
  for (size_t i = 0; i < tier_s.size(); ++i) {
    while (progress && (*h)->progress().tiers[i].state != ckpt::TierState::kCommitted &&
           !(*h)->progress().finished) {
      print_progress((*h)->progress());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    (void)(*h)->wait_tier(i);
    tier_s[i] = seconds_since(t0);
  }
  Status st = (*h)->wait();
  if (progress) std::fprintf(stderr, "\r%-100s\r", "");
  auto p = (*h)->progress();
  if (a.json) {
    json j = {{"series", a.series}, {"step", step},         {"files", files->size()},
              {"bytes", total},     {"staged_s", staged_s}, {"ok", static_cast<bool>(st)}};
    for (size_t i = 0; i < p.tiers.size(); ++i)
      j["tiers"].push_back({{"tier", p.tiers[i].tier},
                            {"state", ckpt::to_string(p.tiers[i].state)},
                            {"seconds", tier_s[i]},
                            {"error", p.tiers[i].error ? p.tiers[i].error->message() : ""}});
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("saved step %llu of series %s: %zu file(s), %s; staged in %.3f s\n",
                static_cast<unsigned long long>(step), a.series.c_str(), files->size(),
                format_size(static_cast<double>(total)).c_str(), staged_s);
    for (size_t i = 0; i < p.tiers.size(); ++i) {
      const auto& t = p.tiers[i];
      if (t.state == ckpt::TierState::kCommitted)
        std::printf("  committed  %s after %.3f s\n", t.tier.c_str(), tier_s[i]);
      else
        std::printf("  %-10s %s: %s\n", ckpt::to_string(t.state), t.tier.c_str(),
                    t.error ? printable(t.error->message()).c_str() : "");
    }
  }
  if (!st) return report_error(st.error());
  return 0;
}

// ---------------------------------------------------------------------------------------
// ls, show

int run_ls(const CkptArgs& a, const std::string& home) {
  if (a.series.empty()) {
    // Every series on the tiers: the first component of keys that look like a step's.
    if (std::any_of(a.tiers.begin(), a.tiers.end(),
                    [](const std::string& t) { return t.starts_with("peer://"); }))
      return report_error(Error(Code::kInvalidArgument,
                                "ckpt ls of every series cannot read a peer:// tier: its peer "
                                "is chosen per series (give --series, or name the peer with "
                                "sluiced://MEMBER@HOST:PORT/FOLDER/)"));
    std::set<std::string> names;
    CkptArgs any = a;
    any.series = "x";
    auto cp = open_checkpointer(any, home, 0, false);
    if (!cp) return report_error(cp.error());
    for (const auto& t : (*cp)->options().tiers) {
      auto objs = t.store->list_all("");
      if (!objs) return report_error(objs.error());
      for (const auto& o : *objs) {
        size_t slash = o.key.find('/');
        if (slash != std::string::npos && o.key.compare(slash + 1, 5, "step-") == 0)
          names.insert(o.key.substr(0, slash));
      }
    }
    if (a.json) {
      std::printf("%s\n", json(names).dump().c_str());
    } else {
      for (const auto& n : names) std::printf("%s\n", n.c_str());
    }
    return 0;
  }
  auto cp = open_checkpointer(a, home, 0, false);
  if (!cp) return report_error(cp.error());
  auto steps = (*cp)->list();
  if (!steps) return report_error(steps.error());
  json out = json::array();
  if (!a.json) std::printf("%-14s %12s  %-20s %s\n", "step", "bytes", "created (UTC)", "tiers");
  for (const auto& s : *steps) {
    char when[32] = "-";
    time_t secs = static_cast<time_t>(s.created_ns / 1000000000);
    struct tm tm;
    if (s.created_ns && gmtime_r(&secs, &tm))
      std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    std::string tiers;
    for (const auto& t : s.tiers) tiers += (tiers.empty() ? "" : ", ") + t;
    if (a.json)
      out.push_back(
          {{"step", s.step}, {"bytes", s.bytes}, {"created_ns", s.created_ns}, {"tiers", s.tiers}});
    else
      std::printf("%-14llu %12s  %-20s %s\n", static_cast<unsigned long long>(s.step),
                  format_size(static_cast<double>(s.bytes)).c_str(), when, tiers.c_str());
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
  return 0;
}

int run_show(const CkptArgs& a, const std::string& home) {
  auto cp = open_checkpointer(a, home, 0, false);
  if (!cp) return report_error(cp.error());
  auto step = resolve_step(**cp, a.step);
  if (!step) return report_error(step.error());
  auto m = (*cp)->manifest(*step);
  if (!m) return report_error(m.error());
  if (a.json) {
    std::string text = ckpt::encode_manifest(*m);
    std::printf("%s", text.c_str());
    return 0;
  }
  std::printf("series %s, step %llu, %u rank(s), %s\n", m->series.c_str(),
              static_cast<unsigned long long>(m->step), m->world,
              format_size(static_cast<double>(m->bytes())).c_str());
  for (const auto& s : m->shards) {
    std::printf("rank %u: %zu tensor(s), shard of %s, chunks of %s\n", s.rank, s.tensors.size(),
                format_size(static_cast<double>(s.bytes)).c_str(),
                format_size(static_cast<double>(s.chunk_size)).c_str());
    for (const auto& t : s.tensors) {
      std::string shape;
      for (int64_t d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
      std::printf("  %-40s %-9s [%s] %s\n", t.name.c_str(), t.dtype.c_str(), shape.c_str(),
                  format_size(static_cast<double>(t.bytes)).c_str());
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// verify

int run_verify(const CkptArgs& a, const std::string& home) {
  auto cp = open_checkpointer(a, home, 0, false);
  if (!cp) return report_error(cp.error());
  std::vector<uint64_t> steps;
  if (a.step == "all") {
    auto all = (*cp)->list();
    if (!all) return report_error(all.error());
    for (const auto& s : *all) steps.push_back(s.step);
  } else {
    auto s = resolve_step(**cp, a.step);
    if (!s) return report_error(s.error());
    steps.push_back(*s);
  }
  bool bad = false;
  json out = json::array();
  for (uint64_t step : steps) {
    for (size_t i = 0; i < (*cp)->options().tiers.size(); ++i) {
      if (a.tier >= 0 && static_cast<size_t>(a.tier) != i) continue;
      auto r = (*cp)->verify(step, static_cast<int>(i));
      const std::string& tier = (*cp)->options().tiers[i].name;
      if (!r && r.error().code() == Code::kNotFound) continue;  // no copy on this tier
      if (!r) return report_error(r.error());
      bad = bad || r->bad_chunks || !r->problems.empty();
      if (a.json) {
        out.push_back({{"step", step},
                       {"tier", tier},
                       {"chunks", r->chunks},
                       {"bad_chunks", r->bad_chunks},
                       {"problems", r->problems}});
        continue;
      }
      std::printf("step %llu on %s: %llu chunk(s), %llu bad%s\n",
                  static_cast<unsigned long long>(step), tier.c_str(),
                  static_cast<unsigned long long>(r->chunks),
                  static_cast<unsigned long long>(r->bad_chunks), r->problems.empty() ? "" : ":");
      for (const auto& p : r->problems) std::printf("  %s\n", printable(p).c_str());
    }
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
  return bad ? 1 : 0;
}

// ---------------------------------------------------------------------------------------
// restore

// Writes restored tensors as files under the output directory, through a file:// store:
// each name is checked as a key (relative, no "..", no empty parts), resolved beneath the
// directory (a symlink cannot lead out), and published atomically.
int run_restore(const CkptArgs& a, const std::string& home) {
  if (a.out_dir.empty())
    return report_error(Error(Code::kInvalidArgument, "restore needs --to DIR"));
  auto cp = open_checkpointer(a, home, 0, false);
  if (!cp) return report_error(cp.error());
  auto step = resolve_step(**cp, a.step);
  if (!step) return report_error(step.error());
  auto m = (*cp)->manifest(*step);
  if (!m) return report_error(m.error());
  std::error_code ec;
  fs::create_directories(a.out_dir, ec);
  if (ec) return report_error(Error(Code::kIoError, "create " + a.out_dir + ": " + ec.message()));
  auto out = store::open_store(a.out_dir);
  if (!out) return report_error(out.error());

  struct Item {
    unsigned rank;
    const ckpt::TensorEntry* t;
    std::string key;
  };
  std::vector<Item> items;
  for (const auto& s : m->shards) {
    if (a.only_rank >= 0 && s.rank != static_cast<unsigned>(a.only_rank)) continue;
    for (const auto& t : s.tensors) {
      std::string key =
          (m->world > 1 && a.only_rank < 0 ? "rank-" + std::to_string(s.rank) + "/" : "") + t.name;
      Status st = store::validate_key(key);
      if (st && store::is_reserved_key(key))
        st = fail(Code::kInvalidArgument, "a .sluice-tmp component is reserved");
      if (!st)
        return report_error(Error(
            Code::kCorruption,
            "tensor name '" + t.name + "' is not a safe relative path: " + st.error().message()));
      std::error_code lec;
      if (!a.force &&
          (fs::symlink_status(fs::path(a.out_dir) / key, lec).type() != fs::file_type::not_found ||
           (*out)->stat(key)))
        return report_error(Error(Code::kAlreadyExists,
                                  a.out_dir + "/" + key + " exists (use --force to replace it)"));
      items.push_back({s.rank, &t, std::move(key)});
    }
  }
  if (items.empty()) return report_error(Error(Code::kNotFound, "no tensors to restore"));
  // All or nothing: every file is written to a temporary file and published (renamed into
  // place) only once every byte of the step has been read and checked, so a failure leaves
  // the directory as it was. That holds one descriptor per file until the end.
  struct rlimit nofile {};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
    (void)::getrlimit(RLIMIT_NOFILE, &nofile);
  }
  if (items.size() + 64 > nofile.rlim_cur)
    return report_error(
        Error(Code::kInvalidArgument, "restoring " + std::to_string(items.size()) +
                                          " files at once needs as many open files; " +
                                          "the limit here is " + std::to_string(nofile.rlim_cur) +
                                          " (raise ulimit -n, or restore part with --rank)"));
  // Pieces of at most one window (whole small files, large ones cut on chunk bounds) are
  // restored into one reused buffer and written at their offsets: memory stays bounded
  // whatever the checkpoint holds.
  const uint64_t cs = m->shards.empty() ? kDirectAlignment : m->shards[0].chunk_size;
  const uint64_t window = std::max(cs, (uint64_t{256} << 20) / cs * cs);
  auto buf = AlignedBuffer::allocate(window);
  if (!buf) return report_error(buf.error());
  struct Piece {
    size_t item;
    uint64_t offset, bytes, at;  // in the tensor; in the buffer
  };
  std::vector<Piece> batch;
  std::map<size_t, std::unique_ptr<store::Writer>> writers;
  uint64_t used = 0, bytes = 0, failed_over = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto flush = [&]() -> Status {
    std::vector<ckpt::TensorDest> dests;
    for (const Piece& p : batch)
      dests.push_back({items[p.item].t->name, static_cast<int>(items[p.item].rank),
                       buf->data() + p.at, p.bytes, nullptr, p.offset});
    SLUICE_ASSIGN_OR_RETURN(auto r, (*cp)->restore(*step, dests));
    failed_over += r.chunks_failed_over;
    for (const auto& p : r.problems)
      std::fprintf(stderr, "sluice: warning: %s\n", printable(p).c_str());
    for (const Piece& p : batch) {
      auto& w = writers[p.item];
      if (!w) {
        store::WriteOptions wo;
        wo.overwrite = a.force;
        wo.size_hint = items[p.item].t->bytes;
        wo.mode = 0600;  // until published with the mode the file was saved with
        SLUICE_ASSIGN_OR_RETURN(w, (*out)->create(items[p.item].key, wo));
      }
      std::span<const std::byte> piece(buf->data() + p.at, p.bytes);
      SLUICE_RETURN_IF_ERROR(w->positional() ? w->write_at(p.offset, piece) : w->append(piece));
      bytes += p.bytes;
    }
    batch.clear();
    used = 0;
    return ok();
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t size = items[i].t->bytes;
    for (uint64_t off = 0; off < size || (size == 0 && off == 0); off += window) {
      const uint64_t n = std::min(window, size - off);
      if (used + n > window)
        if (auto st = flush(); !st) return report_error(st.error());
      batch.push_back({i, off, n, used});
      used = (used + n + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
      if (size == 0) break;
    }
  }
  if (!batch.empty())
    if (auto st = flush(); !st) return report_error(st.error());
  // Every byte is in: publish. A file saved with its mode gets it back; one saved without
  // (a tensor, an older checkpoint) gets 0644 less the umask, as a new file would.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  for (size_t i = 0; i < items.size(); ++i) {
    auto& w = writers[i];
    if (!w) continue;
    // The manifest is untrusted: no setuid, setgid or sticky bit comes back from it, and the
    // umask narrows a mode as it would a new file's.
    const mode_t mode =
        (items[i].t->mode ? static_cast<mode_t>(items[i].t->mode) : mode_t{0644}) & 0777 & ~mask;
    if (const std::string tmp = w->local_path(); !tmp.empty() && ::chmod(tmp.c_str(), mode) != 0)
      return report_error(Error(
          Code::kIoError, "chmod " + a.out_dir + "/" + items[i].key + ": " + std::strerror(errno)));
    if (auto st = w->commit(); !st)
      return report_error(st.error().with_context(std::to_string(i) + " of " +
                                                  std::to_string(items.size()) +
                                                  " files were published before this one failed"));
  }
  const double secs = seconds_since(t0);
  if (a.json) {
    std::printf("%s\n", json({{"series", a.series},
                              {"step", *step},
                              {"files", items.size()},
                              {"bytes", bytes},
                              {"seconds", secs},
                              {"chunks_failed_over", failed_over}})
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "restored step %llu of series %s: %zu file(s), %s in %.3f s to %s%s\n",
        static_cast<unsigned long long>(*step), a.series.c_str(), items.size(),
        format_size(static_cast<double>(bytes)).c_str(), secs, a.out_dir.c_str(),
        failed_over
            ? (" (" + std::to_string(failed_over) + " chunk(s) read from a later tier)").c_str()
            : "");
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// gc

int run_gc(const CkptArgs& a, const std::string& home) {
  if (auto s = refuse_if_pinned(a, home); !s) return report_error(s.error());
  auto cp = open_checkpointer(a, home, 0, false, true);
  if (!cp) return report_error(cp.error());
  auto r = (*cp)->gc();
  if (!r) return report_error(r.error());
  if (a.json) {
    std::printf("%s\n", json({{"removed_steps", r->removed_steps},
                              {"removed_incomplete", r->removed_incomplete},
                              {"objects_removed", r->objects_removed}})
                            .dump()
                            .c_str());
    return 0;
  }
  auto list = [](const std::vector<uint64_t>& v) {
    std::string s;
    for (uint64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
    return s.empty() ? std::string("none") : s;
  };
  std::printf("removed checkpoints: %s\nremoved incomplete steps: %s\nobjects removed: %llu\n",
              list(r->removed_steps).c_str(), list(r->removed_incomplete).c_str(),
              static_cast<unsigned long long>(r->objects_removed));
  return 0;
}

// ---------------------------------------------------------------------------------------
// sync

int run_sync(const CkptArgs& a, const std::string& home) {
  auto cp = open_checkpointer(a, home, 0, true, true);
  if (!cp) return report_error(cp.error());
  std::optional<uint64_t> only;
  if (a.step != "all") {
    auto s = resolve_step(**cp, a.step);
    if (!s) return report_error(s.error());
    only = *s;
  }
  auto r = (*cp)->sync(only);
  if (!r) return report_error(r.error());
  if (a.json) {
    json copied = json::array();
    for (const auto& c : r->copied)
      copied.push_back({{"step", c.step}, {"tier", c.tier}, {"bytes", c.bytes}});
    std::printf("%s\n", json({{"copied", copied}, {"problems", r->problems}}).dump().c_str());
  } else {
    for (const auto& c : r->copied)
      std::printf("copied step %llu to %s (%s)\n", static_cast<unsigned long long>(c.step),
                  c.tier.c_str(), format_size(static_cast<double>(c.bytes)).c_str());
    if (r->copied.empty() && r->problems.empty()) std::printf("every tier holds every step\n");
    for (const auto& p : r->problems) std::fprintf(stderr, "sluice: %s\n", printable(p).c_str());
  }
  return r->problems.empty() ? 0 : 1;
}

}  // namespace

void add_ckpt_commands(CLI::App& app, std::string home, CancelHook cancel, int& rc) {
  static CkptArgs a;  // CLI11 binds to it; one command runs per process
  // Long commands stop on Ctrl-C or SIGTERM: writers are aborted, and the exit is 130 or 143.
  auto interruptible = [cancel, &rc](int (*run)(const CkptArgs&, const std::string&),
                                     const std::string& home_dir) {
    a.cancel = cancel.flag;
    if (cancel.install) cancel.install();
    rc = run(a, home_dir);
    if (cancel.stopped()) rc = cancel.exit_code();
  };
  auto* ck = app.add_subcommand(
      "ckpt",
      "Checkpoints: save files (safetensors shards, a directory) to tiers, list, show, "
      "verify, restore, gc");
  ck->require_subcommand(1);
  const std::string def_tier = home + "/ckpt";
  // Where the tiers are: S3 settings, and this node's place among the job's daemons.
  auto location_flags = [&](CLI::App* c) {
    c->add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// tiers");
    c->add_option("--profile", a.aws.profile, "AWS profile for s3:// tiers");
    c->add_option("--region", a.aws.region, "Region for s3:// tiers");
    c->add_option("--node-name", a.node_name,
                  "This node's member name, for sluiced:// and peer:// tiers (default: the "
                  "short host name)");
    c->add_option("--node-secret-file", a.secret_file,
                  "The job's node secret (mode 600), for sluiced:// and peer:// tiers");
    c->add_option("--peers", a.peers,
                  "For peer://FOLDER/ tiers: the job's daemons, a host list file ('NAME "
                  "HOST:PORT' a line, as sluiced --peers) or 'slurm' (SLURM_JOB_NODELIST)");
    c->add_option("--peer-port", a.peer_port, "With --peers slurm: the members' peer port");
  };
  auto common = [&](CLI::App* c, const char* tier_flag, const char* tier_help) {
    // One value per --to/--from: a path after it is an input, not another tier.
    c->add_option(tier_flag, a.tiers, tier_help)->default_str(def_tier)->allow_extra_args(false);
    location_flags(c);
    c->add_option("--chunk-size", a.chunk, "Checksum granularity (a multiple of 4K)")
        ->default_str("4M");
    c->add_flag("--json", a.json, "Print the result as JSON");
  };
  const char* from_help =
      "A tier to read, nearest first (repeatable): a directory, file://, s3://bucket/prefix, "
      "sluiced://MEMBER@HOST:PORT/FOLDER/, or peer://FOLDER/ (a peer chosen from --peers)";
  auto* save = ck->add_subcommand("save", "Save files or directories as one checkpoint step");
  save->add_option("--series", a.series, "The checkpoint series (A-Z a-z 0-9 . _ -)")->required();
  save->add_option("--step", a.step, "The step number")->required();
  save->add_option("PATH", a.paths, "Files or directories to save")->required();
  common(save, "--to",
         "A tier to write, fastest first (repeatable): a directory, file://, s3://bucket/prefix, "
         "sluiced://MEMBER@HOST:PORT/FOLDER/, or peer://FOLDER/ (a peer chosen from --peers)");
  save->add_option("--rank", a.rank, "This process's rank (each rank saves its own files)");
  save->add_option("--run-id", a.run_id,
                   "With --world above 1: an id every rank of this run shares (a job id and "
                   "restart count), so records of a crashed earlier run are never mixed in");
  save->add_option("--world", a.world, "How many ranks save this step")
      ->check(CLI::Range(1u, 65536u));
  save->add_option("--require", a.require,
                   "all: the save fails unless every tier commits; first: only the first must "
                   "(later tiers are best effort, and report their errors)")
      ->default_str("all")
      ->check(CLI::IsMember({"all", "first"}));
  save->add_option("--staging", a.staging, "Host memory for staging at most")->default_str("1G");
  save->add_option("--keep-last", a.keep_last, "After the save, keep this many (0: all)");
  save->add_option("--keep-every", a.keep_every, "After the save, also keep steps divisible by K");
  save->add_option("--commit-timeout", a.commit_timeout_s,
                   "Seconds rank 0 waits for every rank's shard")
      ->default_val(600);
  save->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  save->callback([interruptible, home] { interruptible(run_save, home); });

  auto* ls = ck->add_subcommand("ls", "List series, or the committed steps of one series");
  ls->add_option("--series", a.series, "The series (none: list the series)");
  common(ls, "--from", from_help);
  ls->callback([&rc, home] { rc = run_ls(a, home); });

  auto* show = ck->add_subcommand("show", "Show a step's manifest: ranks, tensors, sizes");
  show->add_option("--series", a.series, "The series")->required();
  show->add_option("--step", a.step, "A step number or latest")->default_str("latest");
  common(show, "--from", from_help);
  show->callback([&rc, home] { rc = run_show(a, home); });

  auto* verify = ck->add_subcommand(
      "verify",
      "Read every chunk of a step on every tier holding it and check its checksum; "
      "exit 1 if any is bad");
  verify->add_option("--series", a.series, "The series")->required();
  verify->add_option("--step", a.step, "A step number, latest or all")->default_str("latest");
  verify->add_option("--tier", a.tier, "Only the tier at this index (0 = first --from)");
  common(verify, "--from", from_help);
  verify->callback([&rc, home] { rc = run_verify(a, home); });

  auto* restore = ck->add_subcommand(
      "restore",
      "Write a step's files back under --to DIR, each chunk from the nearest tier "
      "where it verifies");
  restore->add_option("--series", a.series, "The series")->required();
  restore->add_option("--step", a.step, "A step number or latest")->default_str("latest");
  restore->add_option("--to", a.out_dir, "The directory to write the files into")->required();
  restore->add_option("--from", a.tiers, from_help)->default_str(def_tier)->allow_extra_args(false);
  restore->add_option("--rank", a.only_rank,
                      "Only this rank's files (default: every rank; "
                      "with several, each under rank-N/)");
  restore->add_flag("--force", a.force, "Replace files that exist");
  location_flags(restore);
  restore->add_flag("--json", a.json, "Print the result as JSON");
  restore->callback([interruptible, home] { interruptible(run_restore, home); });

  auto* sync = ck->add_subcommand(
      "sync",
      "Copy committed steps to the --from tiers that lack them (after a save whose "
      "later tiers failed, or to fill a new tier); each copy is verified first");
  sync->add_option("--series", a.series, "The series")->required();
  auto* sync_step =
      sync->add_option("--step", a.step, "A step number, latest or all")->default_str("all");
  common(sync, "--from", from_help);
  sync->callback([interruptible, home, sync_step] {
    if (sync_step->count() == 0) a.step = "all";
    interruptible(run_sync, home);
  });

  auto* gc = ck->add_subcommand(
      "gc",
      "Apply retention (--keep-last, --keep-every) and remove incomplete steps older than "
      "--grace; the newest committed step is never removed");
  gc->add_option("--series", a.series, "The series")->required();
  gc->add_option("--keep-last", a.keep_last, "Keep this many newest checkpoints (0: all)");
  gc->add_option("--keep-every", a.keep_every, "Also keep steps divisible by K");
  gc->add_option("--grace", a.grace_s, "Seconds an incomplete step is left alone")
      ->default_val(3600);
  common(gc, "--from", from_help);
  gc->callback([&rc, home] { rc = run_gc(a, home); });
}

}  // namespace sluice::cli
