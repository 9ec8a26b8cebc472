// `sluice team`, `sluice project`, `sluice quota`, `sluice usage`: who owns what, the
// limits, and what is used, from the ledger (SQLite by default, PostgreSQL for a fleet).
#include "ledger_cmd.h"

#include "command.h"
#include "sluice/client/ledger.h"

#include <sys/stat.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "common.h"
#include "sluice/client/environment.h"
#include "sluice/client/session.h"
#include "sluice/core/sizes.h"
#include "sluice/ledger/charging_store.h"
#include "sluice/ledger/forecast.h"
#include "sluice/ledger/json.h"
#include "sluice/ledger/reconcile.h"

namespace sluice::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace sluice::ledger;

struct LedgerArgs {
  std::string uri;  // --ledger
  std::string name, team, location, tier, kind;
  std::string soft_bytes, hard_bytes, soft_objects, hard_objects, grace;
  std::string by = "team";
  std::string window = "30d";
  std::string capacity_bytes, capacity_objects;
  client::AwsSettings aws;
  bool json = false, dry_run = false, no_progress = false;
};

Result<std::unique_ptr<Ledger>> open_ledger(const LedgerArgs& a, const std::string& home) {
  return open_ledger_at(a.uri, home);
}

// "none" clears a limit; a size ("10T", "500G") or a count otherwise.
Result<std::optional<int64_t>> limit_flag(const std::string& flag, const std::string& text,
                                          bool is_size, std::optional<int64_t> current) {
  if (text.empty()) return current;
  if (text == "none") return std::optional<int64_t>{};
  if (is_size) {
    auto v = parse_size(text);
    if (!v || *v > static_cast<uint64_t>(INT64_MAX))
      return fail(Code::kInvalidArgument,
                  flag + " '" + text + "': expected a size (500G, 10T) or none" +
                      (v ? std::string(": too large") : ": " + v.error().message()));
    return std::optional<int64_t>(static_cast<int64_t>(*v));
  }
  int64_t n = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || p != text.data() + text.size() || n < 0)
    return fail(Code::kInvalidArgument,
                flag + " '" + text + "': expected a whole number of objects or none");
  return std::optional<int64_t>(n);
}

std::string limit_text(const std::optional<int64_t>& v, bool is_size) {
  if (!v) return "-";
  return is_size ? format_size(static_cast<double>(*v)) : std::to_string(*v);
}

int run_team_add(const LedgerArgs& a, const std::string& home) {
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  if (auto s = (*l)->add_team(a.name); !s) return report_error(s.error());
  std::printf("team %s added\n", a.name.c_str());
  return 0;
}

int run_team_ls(const LedgerArgs& a, const std::string& home) {
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  auto teams = (*l)->teams();
  if (!teams) return report_error(teams.error());
  if (a.json) {
    std::printf("%s\n", json(*teams).dump().c_str());
  } else {
    for (auto& t : *teams) std::printf("%s\n", t.c_str());
  }
  return 0;
}

int run_project_add(const LedgerArgs& a, const std::string& home) {
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  Project p;
  p.id = a.name;
  p.team = a.team;
  p.location = a.location;
  if (p.location.find("://") == std::string::npos) {
    std::error_code ec;
    fs::path abs = fs::absolute(p.location, ec);
    if (!ec) p.location = abs.lexically_normal().string();
  }
  p.tier = tier_of_location(p.location);
  if (!a.tier.empty()) {
    auto t = parse_tier(a.tier);
    if (!t) return report_error(t.error());
    p.tier = *t;
  }
  if (!a.kind.empty()) {
    auto k = parse_kind(a.kind);
    if (!k) return report_error(k.error());
    p.kind = *k;
  }
  if (auto s = (*l)->add_project(p); !s) return report_error(s.error());
  std::printf("project %s added: %s, team %s, tier %s, kind %s\n", p.id.c_str(), p.location.c_str(),
              p.team.c_str(), std::string(tier_name(p.tier)).c_str(),
              std::string(kind_name(p.kind)).c_str());
  return 0;
}

int run_project_ls(const LedgerArgs& a, const std::string& home) {
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  auto ps = (*l)->projects();
  if (!ps) return report_error(ps.error());
  if (a.json) {
    std::printf("%s\n", json(*ps).dump().c_str());
    return 0;
  }
  std::printf("%-20s %-16s %-7s %-11s %s\n", "PROJECT", "TEAM", "TIER", "KIND", "LOCATION");
  for (auto& p : *ps)
    std::printf("%-20s %-16s %-7s %-11s %s\n", p.id.c_str(), p.team.c_str(),
                std::string(tier_name(p.tier)).c_str(), std::string(kind_name(p.kind)).c_str(),
                p.location.c_str());
  return 0;
}

int run_project_rm(const LedgerArgs& a, const std::string& home) {
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  if (auto s = (*l)->remove_project(a.name); !s) return report_error(s.error());
  std::printf("project %s removed (its data was not touched)\n", a.name.c_str());
  return 0;
}

int run_quota_set(const LedgerArgs& a, const std::string& home) {
  auto tier = parse_tier(a.tier);
  if (!tier) return report_error(tier.error());
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  // Flags not given keep their current value.
  auto accs = (*l)->accounts(a.team);
  if (!accs) return report_error(accs.error());
  Limits cur;
  for (auto& acc : *accs)
    if (acc.tier == *tier) cur = acc.limits;
  Limits next = cur;
  auto sb = limit_flag("--soft-bytes", a.soft_bytes, true, cur.soft_bytes);
  auto hb = limit_flag("--hard-bytes", a.hard_bytes, true, cur.hard_bytes);
  auto so = limit_flag("--soft-objects", a.soft_objects, false, cur.soft_objects);
  auto ho = limit_flag("--hard-objects", a.hard_objects, false, cur.hard_objects);
  for (auto* r : {&sb, &hb, &so, &ho})
    if (!*r) return report_error(r->error());
  next.soft_bytes = *sb;
  next.hard_bytes = *hb;
  next.soft_objects = *so;
  next.hard_objects = *ho;
  if (!a.grace.empty()) {
    auto g = duration_flag("--grace", a.grace);
    if (!g) return report_error(g.error());
    next.grace = *g;
  }
  if (auto s = (*l)->set_limits(a.team, *tier, next); !s) return report_error(s.error());
  std::printf("quota of team %s on %s: bytes soft %s hard %s, objects soft %s hard %s, grace %s\n",
              a.team.c_str(), std::string(tier_name(*tier)).c_str(),
              limit_text(next.soft_bytes, true).c_str(), limit_text(next.hard_bytes, true).c_str(),
              limit_text(next.soft_objects, false).c_str(),
              limit_text(next.hard_objects, false).c_str(), format_duration(next.grace).c_str());
  return 0;
}

int run_quota_show(const LedgerArgs& a, const std::string& home) {
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  auto accs = (*l)->accounts(a.team);
  if (!accs) return report_error(accs.error());
  int64_t now = (*l)->now_ns();
  if (a.json) {
    json out = json::array();
    for (auto& acc : *accs) out.push_back(ledger::account_json(acc, now));
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%-16s %-7s %11s %9s %11s %11s %11s %9s %9s  %s\n", "TEAM", "TIER", "USED", "OBJECTS",
              "RESERVED", "SOFT", "HARD", "SOFT-OBJ", "HARD-OBJ", "STATE");
  for (auto& acc : *accs)
    std::printf("%-16s %-7s %11s %9lld %11s %11s %11s %9s %9s  %s\n", acc.team.c_str(),
                std::string(tier_name(acc.tier)).c_str(),
                format_size(static_cast<double>(acc.used_bytes)).c_str(),
                static_cast<long long>(acc.used_objects),
                format_size(static_cast<double>(acc.reserved_bytes)).c_str(),
                limit_text(acc.limits.soft_bytes, true).c_str(),
                limit_text(acc.limits.hard_bytes, true).c_str(),
                limit_text(acc.limits.soft_objects, false).c_str(),
                limit_text(acc.limits.hard_objects, false).c_str(),
                account_state(acc, now).c_str());
  return 0;
}

int run_usage(const LedgerArgs& a, const std::string& home) {
  auto by = parse_usage_by(a.by);
  if (!by) return report_error(Error(Code::kInvalidArgument, "--by " + by.error().message()));
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  auto rows = (*l)->usage();
  if (!rows) return report_error(rows.error());
  std::vector<UsageTotal> totals = usage_totals(*rows, *by);
  if (a.json) {
    json out = json::array();
    for (auto& t : totals)
      out.push_back({{a.by, t.group},
                     {"bytes", t.bytes},
                     {"objects", t.objects},
                     {"updated_ns", t.updated_ns}});
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::string head = a.by;
  for (auto& c : head) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::printf("%-24s %12s %10s  %s\n", head.c_str(), "BYTES", "OBJECTS", "AS OF");
  for (auto& t : totals)
    std::printf("%-24s %12s %10lld  %s\n", t.group.c_str(),
                format_size(static_cast<double>(t.bytes)).c_str(),
                static_cast<long long>(t.objects), format_utc(t.updated_ns).c_str());
  if (totals.empty()) std::printf("(nothing charged yet)\n");
  return 0;
}

int run_reconcile(const LedgerArgs& a, const std::string& home) {
  auto session = open_session(a.aws);
  if (!session) return report_error(session.error());
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  StatusLine line(!a.no_progress && !a.json);
  ReconcileOptions ro{.dry_run = a.dry_run};
  ro.on_progress = [&](const ReconcileProgress& p) {
    line.show("listing project " + std::string(p.project) + " (" + std::to_string(p.index) +
              " of " + std::to_string(p.projects) +
              "): " + count_of(static_cast<uint64_t>(p.objects), "object") + ", " +
              format_size(static_cast<double>(p.bytes)));
  };
  auto rep = reconcile(**l, session->store_options(), ro);
  line.clear();
  if (!rep) return report_error(rep.error());
  int failed = 0;
  json out = json::array();
  for (auto& e : rep->projects) {
    if (e.error) ++failed;
    if (a.json) {
      out.push_back(e);
      continue;
    }
    if (e.error) {
      std::printf("%-20s not recounted: %s\n", e.project.c_str(), e.error->to_string().c_str());
    } else if (!e.changed) {
      std::printf("%-20s ok: %s in %s\n", e.project.c_str(),
                  format_size(static_cast<double>(e.found_bytes)).c_str(),
                  count_of(static_cast<uint64_t>(e.found_objects), "object").c_str());
    } else {
      std::printf("%-20s %s: ledger had %s in %lld objects, found %s in %lld objects\n",
                  e.project.c_str(), a.dry_run ? "would fix" : "fixed",
                  format_size(static_cast<double>(e.ledger_bytes)).c_str(),
                  static_cast<long long>(e.ledger_objects),
                  format_size(static_cast<double>(e.found_bytes)).c_str(),
                  static_cast<long long>(e.found_objects));
    }
  }
  if (a.json) {
    std::printf("%s\n", json{{"projects", out},
                             {"dry_run", a.dry_run},
                             {"expired_reservations", rep->expired_reservations},
                             {"accounts_recounted", rep->accounts_recounted}}
                            .dump()
                            .c_str());
  } else if (!a.dry_run) {
    std::printf("expired reservations dropped: %lld; accounts recounted: %lld\n",
                static_cast<long long>(rep->expired_reservations),
                static_cast<long long>(rep->accounts_recounted));
  }
  if (failed) {
    std::fprintf(stderr,
                 "sluice: error: %d project(s) could not be listed and were left as they were\n",
                 failed);
    return 1;
  }
  return 0;
}

// What each tier holds across all teams, against its capacity.
int run_capacity_ls(const LedgerArgs& a, const std::string& home) {
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  auto totals = (*l)->tier_totals();
  if (!totals) return report_error(totals.error());
  json out = json::array();
  for (const TierTotal& t : *totals) {
    const std::string name(tier_name(t.tier));
    if (a.json) {
      out.push_back(t);
    } else {
      std::printf("%-7s %12s of %-12s %12s objects of %s\n", name.c_str(),
                  format_size(static_cast<double>(t.used_bytes)).c_str(),
                  limit_text(t.capacity_bytes, true).c_str(),
                  std::to_string(t.used_objects).c_str(),
                  limit_text(t.capacity_objects, false).c_str());
    }
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
  return 0;
}

int run_capacity_set(const LedgerArgs& a, const std::string& home) {
  auto tier = parse_tier(a.tier);
  if (!tier) return report_error(tier.error());
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  auto caps = (*l)->capacities();
  if (!caps) return report_error(caps.error());
  Capacity cur{*tier, {}, {}};
  for (auto& c : *caps)
    if (c.tier == *tier) cur = c;
  auto b = limit_flag("--bytes", a.capacity_bytes, true, cur.bytes);
  if (!b) return report_error(b.error());
  auto o = limit_flag("--objects", a.capacity_objects, false, cur.objects);
  if (!o) return report_error(o.error());
  if (auto st = (*l)->set_capacity(*tier, *b, *o); !st) return report_error(st.error());
  std::printf("capacity of tier %s: %s, %s objects\n", std::string(tier_name(*tier)).c_str(),
              limit_text(*b, true).c_str(), limit_text(*o, false).c_str());
  return 0;
}

// `forecast`: a table, one line per limit.
int print_forecast(const LedgerArgs& a, const std::vector<ForecastRow>& rows) {
  if (a.json) {
    std::printf("%s\n", json(rows).dump().c_str());
    return 0;
  }
  if (rows.empty()) {
    std::printf(
        "nothing to forecast: no team has a quota%s (sluice quota set, sluice capacity set)\n",
        a.team.empty() ? " and no tier a capacity" : "");
    return 0;
  }
  auto amount = [](const std::string& metric, double v) {
    if (!std::isfinite(v) || std::fabs(v) >= 9e18) {  // past what an integer holds
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3g", v);
      return std::string(buf);
    }
    if (metric != "bytes") {
      char buf[32];
      std::snprintf(buf, sizeof buf, std::fabs(v) < 10 && v != std::trunc(v) ? "%.2f" : "%.0f", v);
      return std::string(buf);
    }
    return v < 0 ? "-" + format_size(-v) : format_size(v);
  };
  auto day = [&](const std::optional<int64_t>& t) {
    return t ? format_utc(*t).substr(0, 10) : std::string("-");
  };
  std::printf("%-14s %-7s %-8s %11s %11s  %-28s %-22s %s\n", "TEAM", "TIER", "METRIC", "NOW",
              "LIMIT", "LINE (rate/day, R^2, date)", "HOLT (rate/day, date)", "VERDICT");
  for (auto& r : rows) {
    std::string line = "-";
    if (r.forecast.line) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s, %.2f, %s",
                    amount(r.metric, r.forecast.linear.rate_per_day).c_str(), r.forecast.line->r2,
                    day(r.forecast.linear.hits_at_ns).c_str());
      line = buf;
    }
    std::string holt =
        amount(r.metric, r.forecast.holt.rate_per_day) + ", " + day(r.forecast.holt.hits_at_ns);
    std::printf("%-14s %-7s %-8s %11s %11s  %-28s %-22s %s (%s)\n",
                (r.team.empty() ? "(all teams)" : r.team.c_str()),
                std::string(tier_name(r.tier)).c_str(), r.metric.c_str(),
                amount(r.metric, static_cast<double>(r.forecast.now_value)).c_str(),
                amount(r.metric, static_cast<double>(r.forecast.limit)).c_str(), line.c_str(),
                holt.c_str(), r.forecast.verdict.c_str(), r.limit_kind.c_str());
  }
  auto [fewest, most] = std::minmax_element(
      rows.begin(), rows.end(), [](auto& x, auto& y) { return x.points.size() < y.points.size(); });
  std::printf("history: %zu to %zu points per line over the last %s; --json prints them\n",
              fewest->points.size(), most->points.size(), a.window.c_str());
  return 0;
}

int run_forecast(const LedgerArgs& a, const std::string& home) {
  auto window = duration_flag("--window", a.window);
  if (!window) return report_error(window.error());
  if (window->count() == 0)
    return report_error(Error(Code::kInvalidArgument, "--window must be longer than 0"));
  ForecastQuery q;
  q.team = a.team;
  q.options.window = *window;
  if (!a.tier.empty()) {
    auto t = parse_tier(a.tier);
    if (!t) return report_error(t.error());
    q.tier = *t;
  }
  auto l = open_ledger(a, home);
  if (!l) return report_error(l.error());
  auto forecast = forecast_limits(**l, q);
  if (!forecast) return report_error(forecast.error());
  return print_forecast(a, *forecast);
}

void ledger_flag(CLI::App* cmd, LedgerArgs& a) {
  cmd->add_option("--ledger", a.uri,
                  "The ledger: a SQLite file or postgresql://user@host:port/db "
                  "(default: $SLUICE_LEDGER, else $SLUICE_HOME/ledger.db)");
}

}  // namespace

Result<std::unique_ptr<Ledger>> open_ledger_at(const std::string& flag, const std::string& home) {
  client::SessionOptions o;
  o.home = home;
  o.ledger = client::ledger_from_environment(flag);
  return client::open_ledger(client::Session(std::move(o)));
}

CLI::Validator not_empty() {
  return CLI::Validator(
      [](std::string& v) { return v.empty() ? std::string("must not be empty") : std::string(); },
      "");
}

namespace {

// Each command's callback: runs `fn` on the parsed flags and sets the exit code.
using Runner = std::function<std::function<void()>(int (*)(const LedgerArgs&, const std::string&))>;

void add_team_and_project(CLI::App& app, LedgerArgs& a, const Runner& run) {
  auto* team = app.add_subcommand("team", "Teams: who usage is charged to and quotas apply to");
  team->require_subcommand(1);
  auto* team_add = team->add_subcommand("add", "Add a team");
  team_add->add_option("NAME", a.name, "Team name: letters, digits, '.', '_' or '-'")->required();
  ledger_flag(team_add, a);
  team_add->callback(run(run_team_add));
  auto* team_ls = team->add_subcommand("ls", "List the teams");
  team_ls->add_flag("--json", a.json, "Print JSON");
  ledger_flag(team_ls, a);
  team_ls->callback(run(run_team_ls));

  auto* project =
      app.add_subcommand("project",
                         "Projects: a location (bucket prefix or directory) owned by a team; every "
                         "write under it is charged to that team");
  project->require_subcommand(1);
  auto* p_add = project->add_subcommand("add", "Add a project");
  p_add->add_option("ID", a.name, "Project ID")->required();
  p_add->add_option("--team", a.team, "The owning team (sluice team add first)")->required();
  p_add
      ->add_option("--location", a.location,
                   "Where its data rests: s3://bucket/prefix, a directory, mem://name/...")
      ->required();
  p_add->add_option("--tier", a.tier,
                    "ram, nvme, peer or object (default: from the location: s3:// is object, "
                    "directories nvme, mem:// ram)");
  p_add->add_option("--kind", a.kind, "What it holds: dataset, checkpoint, scratch or cache")
      ->default_str("scratch");
  ledger_flag(p_add, a);
  p_add->callback(run(run_project_add));
  auto* p_ls = project->add_subcommand("ls", "List the projects");
  p_ls->add_flag("--json", a.json, "Print JSON");
  ledger_flag(p_ls, a);
  p_ls->callback(run(run_project_ls));
  auto* p_rm = project->add_subcommand("rm", "Remove a project with nothing charged to it");
  p_rm->add_option("ID", a.name, "Project ID")->required();
  ledger_flag(p_rm, a);
  p_rm->callback(run(run_project_rm));
}

void add_quota(CLI::App& app, LedgerArgs& a, const Runner& run) {
  auto* quota = app.add_subcommand("quota", "Quotas per team and tier, on bytes and objects");
  quota->require_subcommand(1);
  auto* q_set = quota->add_subcommand(
      "set", "Set a team's limits on a tier; limits not given keep their value, 'none' clears");
  q_set->add_option("TEAM", a.team, "Team")->required();
  q_set->add_option("--tier", a.tier, "ram, nvme, peer or object")->required();
  q_set
      ->add_option("--soft-bytes", a.soft_bytes,
                   "Soft limit (500G, 10T, none): passed only for the grace period")
      ->check(not_empty());
  q_set->add_option("--hard-bytes", a.hard_bytes, "Hard limit (500G, 10T, none): never passed")
      ->check(not_empty());
  q_set->add_option("--soft-objects", a.soft_objects, "Soft limit on objects (or none)")
      ->check(not_empty());
  q_set->add_option("--hard-objects", a.hard_objects, "Hard limit on objects (or none)")
      ->check(not_empty());
  q_set->add_option("--grace", a.grace, "How long a soft limit may be passed (90s, 12h, 7d)")
      ->default_str("7d")
      ->check(not_empty());
  ledger_flag(q_set, a);
  q_set->callback(run(run_quota_set));
  auto* q_show = quota->add_subcommand("show", "Usage, reservations and limits per team and tier");
  q_show->add_option("TEAM", a.team, "Only this team");
  q_show->add_flag("--json", a.json, "Print JSON");
  ledger_flag(q_show, a);
  q_show->callback(run(run_quota_show));
}

void add_usage(CLI::App& app, std::shared_ptr<LedgerArgs> args, const std::string& home, int& rc,
               const Runner& run) {
  LedgerArgs& a = *args;
  auto* usage =
      app.add_subcommand("usage", "Bytes and objects charged, by team, project, tier or kind");
  usage->add_option("--by", a.by, "team, project, tier or kind")->default_val("team");
  usage->add_flag("--json", a.json, "Print JSON");
  ledger_flag(usage, a);
  auto* rec = usage->add_subcommand(
      "reconcile",
      "List every project's location and repair the ledger to match; reports what changed");
  rec->add_flag("--dry-run", a.dry_run, "Report what would change; change nothing");
  rec->add_flag("--json", a.json, "Print JSON");
  rec->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  rec->add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// projects");
  rec->add_option("--profile", a.aws.profile, "AWS profile");
  rec->add_option("--region", a.aws.region, "Region");
  ledger_flag(rec, a);
  rec->callback(run(run_reconcile));
  auto* rec_h = usage->add_subcommand(
      "record",
      "Sample every account's usage into the history now (for a cron job; writes "
      "also sample, at most hourly)");
  ledger_flag(rec_h, a);
  rec_h->callback(run([](const LedgerArgs& x, const std::string& h) {
    auto l = open_ledger(x, h);
    if (!l) return report_error(l.error());
    if (auto st = (*l)->record_history(); !st) return report_error(st.error());
    std::printf("usage recorded\n");
    return 0;
  }));
  usage->callback([args, home, &rc, usage] {
    if (usage->get_subcommands().empty()) rc = run_usage(*args, home);
  });
}

void add_capacity_and_forecast(CLI::App& app, std::shared_ptr<LedgerArgs> args,
                               const std::string& home, int& rc, const Runner& run) {
  LedgerArgs& a = *args;
  auto* capacity = app.add_subcommand(
      "capacity", "Each tier's capacity across all teams (for forecasts), and what it holds");
  capacity->require_subcommand(1);
  auto* c_ls = capacity->add_subcommand("ls", "What each tier holds, against its capacity");
  c_ls->add_flag("--json", a.json, "Print JSON");
  ledger_flag(c_ls, a);
  c_ls->callback(run(run_capacity_ls));
  auto* c_set = capacity->add_subcommand("set", "Set a tier's capacity; 'none' clears");
  // --tier, as quota set and forecast spell it; a bare TIER is still taken.
  auto* c_tier = c_set->add_option("--tier", a.tier, "ram, nvme, peer or object");
  c_set->add_option("TIER", a.tier, "The tier, as --tier")->excludes(c_tier);
  c_set->callback([args, home, &rc] {
    if (args->tier.empty()) {
      rc = report_error(Error(Code::kInvalidArgument, "capacity set needs --tier TIER"));
      return;
    }
    rc = run_capacity_set(*args, home);
  });
  c_set->add_option("--bytes", a.capacity_bytes, "Bytes it holds (100T) or none")
      ->check(not_empty());
  c_set->add_option("--objects", a.capacity_objects, "Objects it holds or none")
      ->check(not_empty());
  ledger_flag(c_set, a);

  auto* fc = app.add_subcommand(
      "forecast",
      "When each team reaches its quota and each tier its capacity: a line fitted "
      "to the recent history (trusted only when it fits) and Holt's smoothing");
  fc->add_option("--team", a.team, "Only this team");
  fc->add_option("--tier", a.tier, "Only this tier");
  fc->add_option("--window", a.window, "The recent history the line is fitted to (30d, 12h)")
      ->default_val("30d");
  fc->add_flag("--json", a.json, "Print JSON, with the history each forecast came from");
  ledger_flag(fc, a);
  fc->callback(run(run_forecast));
}

}  // namespace

void add_ledger_commands(CLI::App& app, const CommandContext& ctx) {
  const std::string& home = ctx.home;
  int& rc = *ctx.rc;
  auto args = std::make_shared<LedgerArgs>();
  Runner run = [args, home, &rc](int (*fn)(const LedgerArgs&, const std::string&)) {
    return [args, home, &rc, fn] { rc = fn(*args, home); };
  };
  add_team_and_project(app, *args, run);
  add_quota(app, *args, run);
  add_usage(app, args, home, rc, run);
  add_capacity_and_forecast(app, args, home, rc, run);
}

}  // namespace sluice::cli
