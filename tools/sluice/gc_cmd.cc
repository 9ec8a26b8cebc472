// `sluice gc`: retention rules and pins per project or checkpoint series; `plan` says what
// would go and why, `run` moves it to a trash stage and deletes for good only after a
// delay, `restore` brings a run back. docs/ledger.md, "Retention and clean-up".
#include "command.h"

#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "common.h"
#include "ledger_cmd.h"
#include "sluice/client/environment.h"
#include "sluice/client/session.h"
#include "sluice/core/sizes.h"
#include "sluice/ledger/gc.h"
#include "sluice/ledger/json.h"

namespace sluice::cli {

namespace {

using nlohmann::json;
using namespace sluice::ledger;

struct GcArgs {
  std::string ledger, project, series, prefix, run;
  std::string keep_last, keep_every, max_age, max_idle;
  std::string delay = "24h", grace = "24h";
  client::AwsSettings aws;
  bool json = false, no_progress = false;
};

// A rule's field as a patch says it: empty text keeps it, "none" clears it.
Result<RulePatch::Field<uint64_t>> count_field(const std::string& flag, const std::string& text) {
  if (text.empty()) return RulePatch::Field<uint64_t>{};
  if (text == "none") return RulePatch::Field<uint64_t>{std::optional<uint64_t>{}};
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size())
    return fail(Code::kInvalidArgument, flag + " '" + text + "': expected a whole number");
  return RulePatch::Field<uint64_t>{v};
}

Result<RulePatch::Field<std::chrono::seconds>> duration_field(const std::string& flag,
                                                              const std::string& text) {
  using F = RulePatch::Field<std::chrono::seconds>;
  if (text.empty()) return F{};
  if (text == "none") return F{std::optional<std::chrono::seconds>{}};
  SLUICE_ASSIGN_OR_RETURN(auto d, duration_flag(flag, text));
  return F{d};
}

Result<GcOptions> gc_options(const GcArgs& a) {
  GcOptions o;
  o.project = a.project;
  SLUICE_ASSIGN_OR_RETURN(o.grace, duration_flag("--grace", a.grace));
  SLUICE_ASSIGN_OR_RETURN(o.delay, duration_flag("--delay", a.delay));
  SLUICE_ASSIGN_OR_RETURN(client::Session session, open_session(a.aws));
  o.stores = session.store_options();
  return o;
}

// Draws a run's or a plan's progress on `line`.
void show_progress(GcOptions& o, StatusLine& line) {
  if (!line.on()) return;
  o.on_progress = [&line](const GcProgress& p) {
    if (p.done == p.total) return;  // a phase's end: the next line (or the result) follows
    if (p.phase == GcPhase::kTrashing)
      line.show("moving to the trash: " + format_size(static_cast<double>(p.done)) + " of " +
                format_size(static_cast<double>(p.total)));
    else if (p.phase == GcPhase::kPlanning)
      line.show("planning project " + std::to_string(p.done + 1) + " of " +
                std::to_string(p.total));
    else
      line.show("purging object " + std::to_string(p.done + 1) + " of " + std::to_string(p.total));
  };
}

void print_errors(const std::vector<std::string>& errors) {
  for (auto& e : errors) std::fprintf(stderr, "sluice: error: %s\n", e.c_str());
}

int run_plan(const GcArgs& a, const std::string& home) {
  auto o = gc_options(a);
  if (!o) return report_error(o.error());
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  StatusLine line(!a.no_progress && !a.json);
  show_progress(*o, line);
  auto plan = plan_gc(**l, *o);
  line.clear();
  if (!plan) return report_error(plan.error());
  for (const auto& why : plan->skipped)
    std::fprintf(stderr, "sluice: warning: left alone: %s\n", why.c_str());
  if (plan->units.empty() && plan->errors.empty() && !a.json) {
    auto rules = (*l)->rules();
    if (!rules) return report_error(rules.error());
    std::erase_if(*rules, [&](const RetentionRule& r) {
      return !a.project.empty() && r.project != a.project;
    });
    if (rules->empty())
      std::printf("nothing to do: no retention rule%s (sluice gc rule set)\n",
                  a.project.empty() ? "" : (" for project " + a.project).c_str());
    else
      std::printf(
          "nothing to do: %zu rule(s) found no objects under their projects (sluice gc "
          "rule ls shows them)\n",
          rules->size());
    return 0;
  }
  int64_t bytes = 0, units = 0;
  json out = json::array();
  for (const GcUnit& x : plan->units) {
    if (x.decision.remove) {
      bytes += x.unit.bytes;
      ++units;
    }
    if (a.json) {
      out.push_back(x);
    } else {
      std::printf("%-6s %-16s %-12s %-48s %11s  %s\n", x.decision.remove ? "trash" : "keep",
                  x.project.c_str(), x.series.empty() ? "-" : x.series.c_str(), x.unit.name.c_str(),
                  format_size(static_cast<double>(x.unit.bytes)).c_str(),
                  x.decision.reason.c_str());
    }
  }
  if (a.json) {
    std::printf(
        "%s\n",
        json{{"units", out}, {"errors", plan->errors}, {"skipped", plan->skipped}}.dump().c_str());
  } else {
    std::printf("%lld unit(s), %s to the trash\n", static_cast<long long>(units),
                format_size(static_cast<double>(bytes)).c_str());
  }
  print_errors(plan->errors);
  return plan->errors.empty() ? 0 : 1;
}

int run_run(const GcArgs& a, const std::string& home) {
  // Every flag is checked before anything moves or is purged.
  auto o = gc_options(a);
  if (!o) return report_error(o.error());
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  StatusLine line(!a.no_progress && !a.json);
  show_progress(*o, line);
  auto r = run_gc(**l, *o, [&](const GcUnit& x) {
    line.clear();
    if (!a.json)
      std::printf("trashed %-16s %s (%s): %s\n", x.project.c_str(), x.unit.name.c_str(),
                  format_size(static_cast<double>(x.unit.bytes)).c_str(),
                  x.decision.reason.c_str());
  });
  line.clear();
  if (!r) return report_error(r.error());
  for (const auto& why : r->skipped)
    std::fprintf(stderr, "sluice: warning: left alone: %s\n", why.c_str());
  if (a.json) {
    std::printf("%s\n", json(*r).dump().c_str());
  } else if (r->trashed_units == 0) {
    std::printf("run %s: nothing moved to the trash; purged %lld object(s), %s\n", r->run.c_str(),
                static_cast<long long>(r->purged_objects),
                format_size(static_cast<double>(r->purged_bytes)).c_str());
  } else {
    std::printf(
        "run %s: %lld unit(s), %s moved to the trash (deleted for good after %s; "
        "sluice gc restore %s brings them back); purged %lld object(s), %s\n",
        r->run.c_str(), static_cast<long long>(r->trashed_units),
        format_size(static_cast<double>(r->trashed_bytes)).c_str(),
        format_utc(r->purge_after_ns).c_str(), r->run.c_str(),
        static_cast<long long>(r->purged_objects),
        format_size(static_cast<double>(r->purged_bytes)).c_str());
  }
  print_errors(r->errors);
  return r->errors.empty() ? 0 : 1;
}

int run_restore(const GcArgs& a, const std::string& home) {
  if (a.run.empty())
    return report_error(
        Error(Code::kInvalidArgument, "gc restore: RUN is empty (sluice gc trash lists the runs)"));
  auto o = gc_options(a);
  if (!o) return report_error(o.error());
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  auto r = restore_gc(**l, a.run, *o);
  if (!r) return report_error(r.error());
  std::printf("restored %lld of %lld object(s) of run %s\n", static_cast<long long>(r->restored),
              static_cast<long long>(r->objects), a.run.c_str());
  print_errors(r->errors);
  return r->errors.empty() ? 0 : 1;
}

int run_trash(const GcArgs& a, const std::string& home) {
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  auto entries = (*l)->trash();
  if (!entries) return report_error(entries.error());
  std::vector<TrashRun> runs = trash_runs(*entries);
  if (a.json) {
    std::printf("%s\n", json(runs).dump().c_str());
    return 0;
  }
  std::printf("%-24s %-16s %8s %11s  %-21s %s\n", "RUN", "PROJECT", "OBJECTS", "BYTES", "TRASHED",
              "PURGED AFTER");
  for (auto& r : runs)
    std::printf("%-24s %-16s %8lld %11s  %-21s %s\n", r.run.c_str(), r.project.c_str(),
                static_cast<long long>(r.objects),
                format_size(static_cast<double>(r.bytes)).c_str(), format_utc(r.trashed_ns).c_str(),
                format_utc(r.purge_after_ns).c_str());
  return 0;
}

std::string rule_text(const RetentionRule& r) {
  std::string s;
  auto add = [&](const char* flag, const std::string& v) {
    s += std::string(" ") + flag + " " + v;
  };
  if (r.keep_last) add("--keep-last", std::to_string(*r.keep_last));
  if (r.keep_every) add("--keep-every", std::to_string(*r.keep_every));
  if (r.max_age) add("--max-age", format_duration(*r.max_age));
  if (r.max_idle) add("--max-idle", format_duration(*r.max_idle));
  return s;
}

// Changes the fields given (as quota set does); "none" clears one.
int run_rule_set(const GcArgs& a, const std::string& home) {
  RulePatch p{.project = a.project, .series = a.series};
  auto kl = count_field("--keep-last", a.keep_last);
  auto ke = count_field("--keep-every", a.keep_every);
  auto ma = duration_field("--max-age", a.max_age);
  auto mi = duration_field("--max-idle", a.max_idle);
  if (!kl) return report_error(kl.error());
  if (!ke) return report_error(ke.error());
  if (!ma) return report_error(ma.error());
  if (!mi) return report_error(mi.error());
  p.keep_last = *kl;
  p.keep_every = *ke;
  p.max_age = *ma;
  p.max_idle = *mi;
  if (p.empty())
    return report_error(Error(Code::kInvalidArgument,
                              "gc rule set: give --keep-last, --keep-every, --max-age or "
                              "--max-idle (sluice gc rule rm removes a rule)"));
  if (a.series.empty() && p.keep_every && *p.keep_every)  // the ledger says so without flags
    return report_error(Error(Code::kInvalidArgument,
                              "--keep-every keeps checkpoint steps: give it with --series"));
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  auto r = (*l)->update_rule(p);
  if (!r) return report_error(r.error());
  const std::string whose = a.project + (a.series.empty() ? "" : " series " + a.series);
  if (r->empty())
    std::printf("rule of %s removed (every field was cleared)\n", whose.c_str());
  else
    std::printf("rule of %s:%s\n", whose.c_str(), rule_text(*r).c_str());
  return 0;
}

int run_rule_rm(const GcArgs& a, const std::string& home) {
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  if (auto s = (*l)->remove_rule(a.project, a.series); !s)
    return report_error(
        Error(s.error().code(), s.error().message() + " (sluice gc rule ls lists the rules)"));
  std::printf("rule of %s%s%s removed\n", a.project.c_str(), a.series.empty() ? "" : " series ",
              a.series.c_str());
  return 0;
}

int run_rule_ls(const GcArgs& a, const std::string& home) {
  auto l = open_ledger_at(a.ledger, home);
  if (!l) return report_error(l.error());
  auto rules = (*l)->rules();
  if (!rules) return report_error(rules.error());
  auto pins = (*l)->pins();
  if (!pins) return report_error(pins.error());
  if (a.json) {
    json ps = json::array();
    for (auto& [p, prefix] : *pins) ps.push_back({{"project", p}, {"prefix", prefix}});
    std::printf("%s\n", json{{"rules", *rules}, {"pins", ps}}.dump().c_str());
    return 0;
  }
  auto txt = [](const auto& v) { return v ? std::to_string(*v) : std::string("-"); };
  auto dtxt = [](const std::optional<std::chrono::seconds>& d) {
    return d ? format_duration(*d) : std::string("-");
  };
  std::printf("%-16s %-12s %9s %10s %12s %12s\n", "PROJECT", "SERIES", "KEEP-LAST", "KEEP-EVERY",
              "MAX-AGE", "MAX-IDLE");
  for (auto& r : *rules)
    std::printf("%-16s %-12s %9s %10s %12s %12s\n", r.project.c_str(),
                r.series.empty() ? "-" : r.series.c_str(), txt(r.keep_last).c_str(),
                txt(r.keep_every).c_str(), dtxt(r.max_age).c_str(), dtxt(r.max_idle).c_str());
  for (auto& [p, prefix] : *pins) std::printf("pinned: %s %s\n", p.c_str(), prefix.c_str());
  return 0;
}

// Each command's callback: runs `fn` on the parsed flags and sets the exit code.
using Runner = std::function<std::function<void()>(int (*)(const GcArgs&, const std::string&))>;

void add_ledger_flag(CLI::App* c, GcArgs& a) {
  c->add_option("--ledger", a.ledger,
                "The ledger (default: $SLUICE_LEDGER, else $SLUICE_HOME/ledger.db)");
}

void add_aws(CLI::App* c, GcArgs& a) {
  c->add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// projects");
  c->add_option("--profile", a.aws.profile, "AWS profile");
  c->add_option("--region", a.aws.region, "Region");
}

// gc rule set|ls, pin, unpin: what the ledger keeps.
void add_rules_and_pins(CLI::App* gc, GcArgs& a, const Runner& run) {
  auto* rule = gc->add_subcommand("rule", "Retention rules");
  rule->require_subcommand(1);
  auto* rset = rule->add_subcommand(
      "set",
      "Set what a project (or one checkpoint series in it) keeps; everything else it "
      "covers may go. Changes only the fields given; none clears one");
  rset->add_option("PROJECT", a.project, "Project ID")->required();
  rset->add_option("--series", a.series,
                   "A checkpoint series in the project (default: its other objects)");
  rset->add_option("--keep-last", a.keep_last,
                   "Keep the newest N (checkpoints, or objects); none clears it")
      ->check(not_empty());
  rset->add_option("--keep-every", a.keep_every,
                   "Keep checkpoint steps divisible by K; none clears it")
      ->check(not_empty());
  rset->add_option("--max-age", a.max_age,
                   "Keep what was created within this (30d, 12h: the unit is required); none "
                   "clears it")
      ->check(not_empty());
  rset->add_option("--max-idle", a.max_idle,
                   "Keep what was read within this (file:// atime; elsewhere the last write); "
                   "none clears it")
      ->check(not_empty());
  add_ledger_flag(rset, a);
  rset->callback(run(run_rule_set));
  auto* rrm = rule->add_subcommand("rm", "Remove a project's (or one series') rule");
  rrm->add_option("PROJECT", a.project, "Project ID")->required();
  rrm->add_option("--series", a.series, "The series whose rule goes (default: the project's)");
  add_ledger_flag(rrm, a);
  rrm->callback(run(run_rule_rm));
  auto* rls = rule->add_subcommand("ls", "List the rules and pins");
  rls->add_flag("--json", a.json, "Print JSON");
  add_ledger_flag(rls, a);
  rls->callback(run(run_rule_ls));

  auto* pin = gc->add_subcommand("pin", "Never remove keys of a project under a prefix");
  pin->add_option("PROJECT", a.project, "Project ID")->required();
  pin->add_option("PREFIX", a.prefix, "Key prefix, e.g. llama/step-000000001000/")->required();
  add_ledger_flag(pin, a);
  pin->callback(run([](const GcArgs& x, const std::string& h) {
    auto l = open_ledger_at(x.ledger, h);
    if (!l) return report_error(l.error());
    if (auto s = (*l)->pin(x.project, x.prefix); !s) return report_error(s.error());
    std::printf("pinned %s %s\n", x.project.c_str(), x.prefix.c_str());
    return 0;
  }));
  auto* unpin = gc->add_subcommand("unpin", "Remove a pin");
  unpin->add_option("PROJECT", a.project, "Project ID")->required();
  unpin->add_option("PREFIX", a.prefix, "The pinned prefix")->required();
  add_ledger_flag(unpin, a);
  unpin->callback(run([](const GcArgs& x, const std::string& h) {
    auto l = open_ledger_at(x.ledger, h);
    if (!l) return report_error(l.error());
    if (auto s = (*l)->unpin(x.project, x.prefix); !s) return report_error(s.error());
    std::printf("unpinned %s %s\n", x.project.c_str(), x.prefix.c_str());
    return 0;
  }));
}

// gc plan, run, restore, trash: what retention does.
void add_runs(CLI::App* gc, GcArgs& a, const Runner& run) {
  auto* plan =
      gc->add_subcommand("plan", "Print what the rules would remove and why; change nothing");
  plan->add_option("--project", a.project, "Only this project");
  plan->add_option("--grace", a.grace,
                   "An incomplete checkpoint step younger than this is left alone")
      ->default_val("24h")
      ->check(not_empty());
  plan->add_flag("--json", a.json, "Print JSON");
  plan->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  add_ledger_flag(plan, a);
  add_aws(plan, a);
  plan->callback(run(run_plan));

  auto* grun = gc->add_subcommand(
      "run",
      "Move what the rules remove to the trash stage (.sluice-trash/RUN/ in the project), "
      "and delete for good what has been in the trash longer than its delay");
  grun->add_option("--project", a.project, "Only this project");
  grun->add_option("--delay", a.delay,
                   "How long trashed data waits before it is deleted (24h, 7d, 0)")
      ->default_val("24h")
      ->check(not_empty());
  grun->add_option("--grace", a.grace,
                   "An incomplete checkpoint step younger than this is left alone")
      ->default_val("24h")
      ->check(not_empty());
  grun->add_flag("--json", a.json, "Print JSON");
  grun->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  add_ledger_flag(grun, a);
  add_aws(grun, a);
  grun->callback(run(run_run));

  auto* restore =
      gc->add_subcommand("restore", "Bring back everything a gc run moved to the trash");
  restore->add_option("RUN", a.run, "The run ID (sluice gc trash lists them)")->required();
  add_ledger_flag(restore, a);
  add_aws(restore, a);
  restore->callback(run(run_restore));

  auto* trash = gc->add_subcommand("trash", "List what is in the trash, per run and project");
  trash->add_flag("--json", a.json, "Print JSON");
  add_ledger_flag(trash, a);
  trash->callback(run(run_trash));
}

}  // namespace

void add_gc_commands(CLI::App& app, const CommandContext& ctx) {
  const std::string& home = ctx.home;
  int& rc = *ctx.rc;
  auto args = std::make_shared<GcArgs>();
  Runner run = [args, home, &rc](int (*fn)(const GcArgs&, const std::string&)) {
    return [args, home, &rc, fn] { rc = fn(*args, home); };
  };
  auto* gc = app.add_subcommand(
      "gc",
      "Retention: rules per project or checkpoint series; plan, run (to a trash stage, "
      "deleted for good after a delay), restore");
  gc->require_subcommand(1);
  add_rules_and_pins(gc, *args, run);
  add_runs(gc, *args, run);
}

}  // namespace sluice::cli
