// `sluice ckpt`: save files as a checkpoint, list, show, verify, restore and clean up.
// Every file is one tensor of dtype uint8 named by its path relative to the argument it
// came from; restore writes them back under --to, byte for byte.
#include "command.h"

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
#include "size_flag.h"
#include "sluice/ckpt/checkpointer.h"
#include "sluice/ckpt/files.h"
#include "sluice/client/checkpoints.h"
#include "sluice/core/fd.h"
#include "sluice/core/sizes.h"
#include "sluice/s3/store.h"

namespace sluice::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct CkptArgs {
  std::string home;  // $SLUICE_HOME: the default tier is HOME/ckpt
  std::string series;
  std::string step = "latest";
  std::vector<std::string> tiers;       // --to (save) or --from (the others)
  std::vector<std::string> paths;       // save
  std::string out_dir;                  // restore --to
  std::vector<std::string> fill_tiers;  // sync --to
  client::AwsSettings aws;
  std::string ledger;  // --ledger: the ledger saves, syncs and removals are charged to
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
  std::string grace = "1h";  // gc: a policy's duration, its unit required (duration_flag)
  std::string staging = "1G";
  std::string chunk = "4M";
  unsigned commit_timeout_s = 600;
  bool json = false, no_progress = false, force = false;
  const std::atomic<bool>* cancel = nullptr;  // set by Ctrl-C (save, restore, sync)
};

// The checkpointer the flags name. `writes`: the command writes new copies (save, sync), so
// a missing local tier is created; the others refuse it, so a mistyped path is an error,
// not an empty tier. `charge`: saves are charged to the project owning each tier.
Result<std::unique_ptr<ckpt::Checkpointer>> open_checkpointer(const CkptArgs& a, uint64_t staging,
                                                              bool writes, bool charge = false) {
  SLUICE_ASSIGN_OR_RETURN(client::Session session, open_session(a.aws, a.ledger));
  client::CheckpointTiers tiers;
  tiers.uris = a.tiers;
  tiers.require_all = a.require == "all";
  tiers.retention = {a.keep_last, a.keep_every};
  tiers.writes = writes;
  tiers.charge = charge;
  SLUICE_ASSIGN_OR_RETURN(
      tiers.peers,
      client::peer_tier_settings({a.node_name, a.secret_file, a.peers, a.peer_port}, a.tiers));
  ckpt::CheckpointerOptions o;
  o.series = a.series;
  o.rank = a.rank;
  o.world = a.world;
  o.run_id = a.run_id;
  o.staging_bytes = staging;
  SLUICE_ASSIGN_OR_RETURN(o.chunk_size, size_flag("--chunk-size", a.chunk));
  o.commit_timeout = std::chrono::seconds(a.commit_timeout_s);
  SLUICE_ASSIGN_OR_RETURN(o.incomplete_grace, duration_flag("--grace", a.grace));
  o.gc_after_save = a.keep_last || a.keep_every;
  o.cancel = a.cancel;
  return client::open_checkpointer(session, std::move(o), tiers);
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

// `or_all`: the command also takes "all" (verify, sync), so the error says so.
Result<uint64_t> resolve_step(ckpt::Checkpointer& cp, const std::string& text,
                              bool or_all = false) {
  if (text == "latest") return cp.latest();
  return parse_step(text, or_all ? ", 'latest' or 'all'" : " or 'latest'");
}

// ---------------------------------------------------------------------------------------
// save

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

// After a save that committed on some tiers and not others: what is where, and the command
// that completes it (a rerun would say the step already exists).
void print_sync_hint(const CkptArgs& a, uint64_t step, const ckpt::SaveProgress& p) {
  std::string committed, from, to;
  for (const auto& t : p.tiers) {
    if (t.state == ckpt::TierState::kCommitted) {
      committed += (committed.empty() ? "" : ", ") + t.tier;
      from += " --from " + t.tier;  // nearest first: sync reads the nearest intact copy
    } else {
      to += " --to " + t.tier;
    }
  }
  const bool all = to.empty();
  from += to;
  if (committed.empty() || all) return;
  std::fprintf(stderr,
               "sluice: step %llu of series %s is committed on %s; once the other tiers can be "
               "reached, copy it there with:\n  sluice ckpt sync --series %s --step %llu%s\n",
               static_cast<unsigned long long>(step), a.series.c_str(), committed.c_str(),
               a.series.c_str(), static_cast<unsigned long long>(step), from.c_str());
}

int run_save(const CkptArgs& a) {
  auto number = parse_step(a.step, "");
  if (!number) return report_error(number.error());
  const uint64_t step = *number;
  const std::vector<std::string> tiers =
      a.tiers.empty() ? std::vector{client::default_checkpoint_tier(a.home)} : a.tiers;
  if (auto st = ckpt::check_tiers_outside_inputs(tiers, a.paths); !st)
    return report_error(st.error());
  auto views = ckpt::file_tensors(a.paths);
  if (!views) return report_error(views.error());
  uint64_t total = 0;
  for (const auto& v : *views) total += v.bytes;
  auto staging = size_flag("--staging", a.staging);
  if (!staging) return report_error(staging.error());
  // No more staging than the files need (a small save does not touch 1 GiB of memory).
  auto cp = open_checkpointer(a, std::min(*staging, total + (uint64_t{32} << 20)), true, true);
  if (!cp) return report_error(cp.error());
  const bool progress = !a.no_progress && !a.json && ::isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  auto h = (*cp)->save(step, *views);
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
    json j = {{"series", a.series}, {"step", step},         {"files", views->size()},
              {"bytes", total},     {"staged_s", staged_s}, {"ok", static_cast<bool>(st)}};
    for (size_t i = 0; i < p.tiers.size(); ++i)
      j["tiers"].push_back({{"tier", p.tiers[i].tier},
                            {"state", ckpt::to_string(p.tiers[i].state)},
                            {"seconds", tier_s[i]},
                            {"error", p.tiers[i].error ? p.tiers[i].error->message() : ""}});
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s step %llu of series %s: %zu file(s), %s; staged in %.3f s\n",
                st ? "saved" : "NOT saved on every tier:", static_cast<unsigned long long>(step),
                a.series.c_str(), views->size(), format_size(static_cast<double>(total)).c_str(),
                staged_s);
    for (size_t i = 0; i < p.tiers.size(); ++i) {
      const auto& t = p.tiers[i];
      if (t.state == ckpt::TierState::kCommitted)
        std::printf("  committed  %s after %.3f s\n", t.tier.c_str(), tier_s[i]);
      else
        std::printf("  %-10s %s: %s\n", ckpt::to_string(t.state), t.tier.c_str(),
                    t.error ? printable(t.error->message()).c_str() : "");
    }
  }
  if (!st) report_error(st.error());
  print_sync_hint(a, step, p);
  return st ? 0 : 1;
}

// ---------------------------------------------------------------------------------------
// ls, show

// "Nothing to do" is not success when the tiers looked at hold no step of the series:
// most likely the wrong tiers (the default one when --from was left out).
Error nothing_on(ckpt::Checkpointer& cp, const CkptArgs& a, const char* verb) {
  std::string where;
  for (const auto& t : cp.options().tiers) where += (where.empty() ? "" : ", ") + t.name;
  return Error(Code::kNotFound,
               std::string("nothing to ") + verb + ": no committed step of series " + a.series +
                   " on " + where +
                   (a.tiers.empty() ? " (the default tier: pass the tiers it was saved to with "
                                      "--from)"
                                    : ""));
}

// "verifying step 100 on ./nvme/ckpt: 1.00 GiB of 4.00 GiB": verify's, restore's and sync's
// progress line (`where` empty: no tier named).
std::string step_progress(std::string_view what, uint64_t step, const std::string& where,
                          uint64_t done, uint64_t total) {
  return std::string(what) + " step " + std::to_string(step) +
         (where.empty() ? "" : " on " + where) + ": " + format_size(static_cast<double>(done)) +
         " of " + format_size(static_cast<double>(total));
}

int run_ls(const CkptArgs& a) {
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
    auto cp = open_checkpointer(any, 0, false);
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
  auto cp = open_checkpointer(a, 0, false);
  if (!cp) return report_error(cp.error());
  auto steps = (*cp)->list();
  if (!steps) return report_error(steps.error());
  json out = json::array();
  if (steps->empty() && !a.json) {  // a mistyped series reads as one: say what was looked at
    std::fprintf(stderr, "sluice: %s\n", nothing_on(**cp, a, "list").message().c_str());
    return 0;
  }
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

int run_show(const CkptArgs& a) {
  auto cp = open_checkpointer(a, 0, false);
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

int run_verify(const CkptArgs& a) {
  auto cp = open_checkpointer(a, 0, false);
  if (!cp) return report_error(cp.error());
  std::vector<uint64_t> steps;
  if (a.step == "all") {
    auto all = (*cp)->list();
    if (!all) return report_error(all.error());
    for (const auto& s : *all) steps.push_back(s.step);
  } else {
    auto s = resolve_step(**cp, a.step, true);
    if (!s) return report_error(s.error());
    steps.push_back(*s);
  }
  if (steps.empty()) return report_error(nothing_on(**cp, a, "verify"));
  bool bad = false;
  json out = json::array();
  StatusLine line(!a.no_progress && !a.json);
  for (uint64_t step : steps) {
    bool seen = false;
    for (size_t i = 0; i < (*cp)->options().tiers.size(); ++i) {
      if (a.tier >= 0 && static_cast<size_t>(a.tier) != i) continue;
      ckpt::VerifyOptions vo{.tier = static_cast<int>(i), .cancel = a.cancel};
      if (line.on())
        vo.on_progress = [&line, step](const std::string& t, uint64_t done, uint64_t total) {
          line.show(step_progress("verifying", step, t, done, total));
        };
      auto r = (*cp)->verify(step, vo);
      line.clear();
      const std::string& tier = (*cp)->options().tiers[i].name;
      if (!r && r.error().code() == Code::kNotFound) continue;  // no copy on this tier
      if (!r) return report_error(r.error());
      seen = true;
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
    if (!seen) {  // a step named that no tier (or not --tier) holds: not a pass
      auto m = (*cp)->manifest(step);
      return report_error(
          !m ? m.error()
             : Error(Code::kNotFound,
                     "step " + std::to_string(step) + " is not on tier " + std::to_string(a.tier)));
    }
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
  return bad ? 1 : 0;
}

// ---------------------------------------------------------------------------------------
// restore

int run_restore(const CkptArgs& a) {
  if (a.out_dir.empty())
    return report_error(Error(Code::kInvalidArgument, "restore needs --to DIR"));
  auto cp = open_checkpointer(a, 0, false);
  if (!cp) return report_error(cp.error());
  auto step = resolve_step(**cp, a.step);
  if (!step) return report_error(step.error());
  ckpt::RestoreFilesOptions o;
  o.directory = a.out_dir;
  o.only_rank = a.only_rank;
  o.replace = a.force;
  o.on_problem = [](const std::string& p) {
    std::fprintf(stderr, "sluice: warning: %s\n", printable(p).c_str());
  };
  // A restore holds a descriptor per file until every byte is in: as many as may be had.
  struct rlimit nofile {};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  const auto t0 = std::chrono::steady_clock::now();
  StatusLine line(!a.no_progress && !a.json);
  if (line.on())
    o.on_progress = [&](uint64_t done, uint64_t total) {
      line.show(step_progress("restoring", *step, "", done, total));
    };
  auto r = ckpt::restore_files(**cp, *step, o);
  line.clear();
  if (!r) return report_error(r.error());
  const double secs = seconds_since(t0);
  if (a.json) {
    std::printf("%s\n", json({{"series", a.series},
                              {"step", *step},
                              {"files", r->files},
                              {"bytes", r->bytes},
                              {"seconds", secs},
                              {"chunks_failed_over", r->chunks_failed_over}})
                            .dump()
                            .c_str());
    return 0;
  }
  std::printf("restored step %llu of series %s: %zu file(s), %s in %.3f s to %s%s\n",
              static_cast<unsigned long long>(*step), a.series.c_str(), r->files,
              format_size(static_cast<double>(r->bytes)).c_str(), secs, a.out_dir.c_str(),
              r->chunks_failed_over ? (" (" + std::to_string(r->chunks_failed_over) +
                                       " chunk(s) read from a later tier)")
                                          .c_str()
                                    : "");
  return 0;
}

// ---------------------------------------------------------------------------------------
// gc

int run_gc(const CkptArgs& a) {
  auto cp = open_checkpointer(a, 0, false, true);
  if (!cp) return report_error(cp.error());
  auto r = (*cp)->gc();
  if (!r) return report_error(r.error());
  if (r->removed_steps.empty() && r->removed_incomplete.empty()) {
    // Nothing of the series at all (not even a save in progress) on these tiers: most
    // likely the wrong ones.
    bool any = false;
    for (const auto& t : (*cp)->options().tiers) {
      auto page = t.store->list({.prefix = a.series + "/", .max_keys = 1});
      any = any || !page || !page->objects.empty();
    }
    if (!any) return report_error(nothing_on(**cp, a, "collect"));
  }
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

int run_sync(const CkptArgs& given) {
  // --to: the tiers to fill, read from the --from tiers (which get nothing); without it,
  // every --from tier lacking a step gets it.
  CkptArgs a = given;
  if (a.tiers.empty()) a.tiers.push_back(client::default_checkpoint_tier(a.home));
  std::vector<size_t> fill;
  for (const std::string& t : given.fill_tiers) {
    fill.push_back(a.tiers.size());
    a.tiers.push_back(t);
  }
  auto cp = open_checkpointer(a, 0, true, true);
  if (!cp) return report_error(cp.error());
  ckpt::SyncOptions so;
  so.fill = std::move(fill);
  so.cancel = a.cancel;
  if (a.step != "all") {
    auto s = resolve_step(**cp, a.step, true);
    if (!s) return report_error(s.error());
    so.step = *s;
  }
  StatusLine line(!a.no_progress && !a.json);
  if (line.on())
    so.on_progress = [&line](const ckpt::SyncProgress& p) {
      line.show(step_progress(ckpt::to_string(p.phase), p.step, p.tier, p.done, p.total));
    };
  auto r = (*cp)->sync(so);
  line.clear();
  if (!r) return report_error(r.error());
  // No step held: most likely the wrong series or tiers, not success.
  if (r->steps == 0 && !so.step) return report_error(nothing_on(**cp, a, "sync"));
  if (a.json) {
    json copied = json::array();
    for (const auto& c : r->copied)
      copied.push_back({{"step", c.step}, {"tier", c.tier}, {"bytes", c.bytes}});
    std::printf("%s\n", json({{"copied", copied}, {"problems", r->problems}}).dump().c_str());
  } else {
    for (const auto& c : r->copied)
      std::printf("copied step %llu to %s (%s)\n", static_cast<unsigned long long>(c.step),
                  c.tier.c_str(), format_size(static_cast<double>(c.bytes)).c_str());
    if (r->copied.empty() && r->problems.empty() && !r->cancelled)
      std::printf("every tier holds every step\n");
    if (r->cancelled) std::fprintf(stderr, "sluice: interrupted; steps copied so far stay\n");
    for (const auto& p : r->problems) std::fprintf(stderr, "sluice: %s\n", printable(p).c_str());
  }
  return r->problems.empty() && !r->cancelled ? 0 : 1;
}

// Where the tiers are: S3 settings, and this node's place among the job's daemons.
void add_location_flags(CLI::App* c, CkptArgs& a) {
  c->add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// tiers");
  c->add_option("--profile", a.aws.profile, "AWS profile for s3:// tiers");
  c->add_option("--region", a.aws.region, "Region for s3:// tiers");
  c->add_option("--node-name", a.node_name,
                "This node's member name, for sluiced:// and peer:// tiers (default: "
                "$SLUICE_NODE_NAME, else the short host name)");
  c->add_option("--node-secret-file", a.secret_file,
                "The job's node secret (mode 600), for sluiced:// and peer:// tiers "
                "(default: $SLUICE_NODE_SECRET_FILE)");
  c->add_option("--peers", a.peers,
                "For peer://FOLDER/ tiers: the job's daemons, a host list file ('NAME "
                "HOST:PORT' a line, as sluiced --peers) or 'slurm' (SLURM_JOB_NODELIST) "
                "(default: $SLUICE_PEERS)");
  c->add_option("--peer-port", a.peer_port,
                "With --peers slurm: the members' peer port (default: $SLUICE_PEER_PORT)");
}

// The tiers (--to or --from), where they are, the chunk size and --json.
void add_common(CLI::App* c, CkptArgs& a, const char* tier_flag, const char* tier_help) {
  // One value per --to/--from: a path after it is an input, not another tier.
  c->add_option(tier_flag, a.tiers, tier_help)
      ->default_str(client::default_checkpoint_tier(a.home))
      ->allow_extra_args(false);
  add_location_flags(c, a);
  c->add_option("--chunk-size", a.chunk, "Checksum granularity (a multiple of 4K)")
      ->default_str("4M");
  c->add_flag("--json", a.json, "Print the result as JSON");
}

// Commands that write or remove a tier's bytes: which ledger they are charged to.
void add_ledger_flag(CLI::App* c, CkptArgs& a) {
  c->add_option("--ledger", a.ledger,
                "The ledger charging tiers under a project (default: $SLUICE_LEDGER, else "
                "$SLUICE_HOME/ledger.db when it exists)");
}

constexpr const char* kFromHelp =
    "A tier to read, nearest first (repeatable): a directory, file://, s3://bucket/prefix, "
    "sluiced://MEMBER@HOST:PORT/FOLDER/, or peer://FOLDER/ (a peer chosen from --peers)";

// Runs a long command: it stops on Ctrl-C or SIGTERM (writers are aborted, exit 130 or 143).
using Interruptible = std::function<void(int (*)(const CkptArgs&))>;

void add_save(CLI::App* ck, CkptArgs& a, const Interruptible& interruptible) {
  auto* save = ck->add_subcommand("save", "Save files or directories as one checkpoint step");
  save->add_option("--series", a.series, "The checkpoint series (A-Z a-z 0-9 . _ -)")->required();
  save->add_option("--step", a.step, "The step number")->required();
  save->add_option("PATH", a.paths, "Files or directories to save")->required();
  add_common(
      save, a, "--to",
      "A tier to write, fastest first (repeatable): a directory, file://, s3://bucket/prefix, "
      "sluiced://MEMBER@HOST:PORT/FOLDER/, or peer://FOLDER/ (a peer chosen from --peers)");
  add_ledger_flag(save, a);
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
                   "How long rank 0 waits for every rank's shard (600s, 10m)")
      ->transform(seconds_validator(1, 7 * 86400))
      ->default_str("10m");
  save->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  save->callback([interruptible] { interruptible(run_save); });
}

void add_readers(CLI::App* ck, CkptArgs& a, int& rc, const Interruptible& interruptible) {
  auto* ls = ck->add_subcommand("ls", "List series, or the committed steps of one series");
  ls->add_option("--series", a.series, "The series (none: list the series)");
  add_common(ls, a, "--from", kFromHelp);
  ls->callback([&rc, &a] { rc = run_ls(a); });

  auto* show = ck->add_subcommand("show", "Show a step's manifest: ranks, tensors, sizes");
  show->add_option("--series", a.series, "The series")->required();
  show->add_option("--step", a.step, "A step number or latest")->default_str("latest");
  add_common(show, a, "--from", kFromHelp);
  show->callback([&rc, &a] { rc = run_show(a); });

  auto* verify = ck->add_subcommand(
      "verify",
      "Read every chunk of a step on every tier holding it and check its checksum; "
      "exit 1 if any is bad");
  verify->add_option("--series", a.series, "The series")->required();
  verify->add_option("--step", a.step, "A step number, latest or all")->default_str("latest");
  verify->add_option("--tier", a.tier, "Only the tier at this index (0 = first --from)");
  add_common(verify, a, "--from", kFromHelp);
  verify->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  verify->callback([interruptible] { interruptible(run_verify); });
}

void add_restore_sync_gc(CLI::App* ck, CkptArgs& a, int& rc, const Interruptible& interruptible) {
  auto* restore = ck->add_subcommand(
      "restore",
      "Write a step's files back under --to DIR, each chunk from the nearest tier "
      "where it verifies");
  restore->add_option("--series", a.series, "The series")->required();
  restore->add_option("--step", a.step, "A step number or latest")->default_str("latest");
  restore->add_option("--to", a.out_dir, "The directory to write the files into")->required();
  restore->add_option("--from", a.tiers, kFromHelp)
      ->default_str(client::default_checkpoint_tier(a.home))
      ->allow_extra_args(false);
  restore->add_option("--rank", a.only_rank,
                      "Only this rank's files (default: every rank; "
                      "with several, each under rank-N/)");
  restore->add_flag("--force", a.force,
                    "Replace files that exist: the tree is built beside DIR and swapped in "
                    "in one step (other files in DIR are kept)");
  restore->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  add_location_flags(restore, a);
  restore->add_flag("--json", a.json, "Print the result as JSON");
  restore->callback([interruptible] { interruptible(run_restore); });

  auto* sync = ck->add_subcommand(
      "sync",
      "Copy committed steps from the --from tiers to the --to tiers that lack them (or, "
      "without --to, to every --from tier lacking one): after a save whose later tiers "
      "failed, or to fill a new tier; each copy is verified first");
  sync->add_option("--series", a.series, "The series")->required();
  auto* sync_step =
      sync->add_option("--step", a.step, "A step number, latest or all")->default_str("all");
  add_common(sync, a, "--from", kFromHelp);
  sync->add_option("--to", a.fill_tiers,
                   "A tier to copy the steps to, from the --from tiers (repeatable); without "
                   "it, every --from tier lacking a step gets it")
      ->allow_extra_args(false);
  add_ledger_flag(sync, a);
  sync->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  sync->callback([interruptible, sync_step, &a] {
    if (sync_step->count() == 0) a.step = "all";
    interruptible(run_sync);
  });

  auto* gc = ck->add_subcommand(
      "gc",
      "Apply retention (--keep-last, --keep-every) and remove incomplete steps older than "
      "--grace; the newest committed step is never removed");
  gc->add_option("--series", a.series, "The series")->required();
  gc->add_option("--keep-last", a.keep_last, "Keep this many newest checkpoints (0: all)");
  gc->add_option("--keep-every", a.keep_every, "Also keep steps divisible by K");
  gc->add_option("--grace", a.grace,
                 "How long an incomplete step is left alone (90s, 1h, 2d: the unit is required)")
      ->default_str("1h");
  add_common(gc, a, "--from", kFromHelp);
  add_ledger_flag(gc, a);
  gc->callback([&rc, &a] { rc = run_gc(a); });
}

}  // namespace

void add_ckpt_commands(CLI::App& app, const CommandContext& ctx) {
  static CkptArgs a;  // CLI11 binds to it; one command runs per process
  a.home = ctx.home;
  const CancelHook cancel = ctx.cancel;
  int& rc = *ctx.rc;
  Interruptible interruptible = [cancel, &rc](int (*run)(const CkptArgs&)) {
    a.cancel = cancel.flag;
    if (cancel.install) cancel.install();
    rc = run(a);
    if (cancel.stopped()) rc = cancel.exit_code();
  };
  auto* ck = app.add_subcommand(
      "ckpt",
      "Checkpoints: save files (safetensors shards, a directory) to tiers, list, show, "
      "verify, restore, sync, gc");
  ck->require_subcommand(1);
  add_save(ck, a, interruptible);
  add_readers(ck, a, rc, interruptible);
  add_restore_sync_gc(ck, a, rc, interruptible);
}

}  // namespace sluice::cli
