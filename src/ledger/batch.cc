// Group commit for reserve and settle (see batch.h).
#include "ledger/batch.h"

#include <map>
#include <tuple>

#include "ledger/sql.h"

namespace sluice::ledger {

namespace {

// A PostgreSQL array literal of text: {"a","b"} with '"' and '\' escaped.
std::string text_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char c : items[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

std::string int_array(const std::vector<int64_t>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + std::to_string(items[i]);
  return out + "}";
}

using AccountKey = std::pair<std::string, std::string>;              // team, tier
using UsageKey = std::tuple<std::string, std::string, std::string>;  // project, tier, kind

struct Sums {
  int64_t released_bytes = 0, released_objects = 0;
  int64_t bytes = 0, objects = 0;
};

// A batch sorted out: the reservations its settles end, the usage changes summed per
// account and per usage row, and its reservations per account. Maps are sorted, so rows
// are locked in one order everywhere.
struct Sorted {
  std::vector<std::string> ids;
  std::map<AccountKey, Sums> accounts;
  std::map<UsageKey, std::pair<std::string, Sums>> usage;  // team, sums
  std::map<AccountKey, std::vector<BatchOp*>> groups;
};

// Also clears each operation's results: a transaction run again starts from nothing.
Sorted sort_batch(const std::vector<BatchOp*>& batch) {
  Sorted out;
  for (BatchOp* o : batch) {
    o->reserved = false;
    o->status = {};
    std::string tier(tier_name(o->target.tier));
    if (o->type == BatchOp::Type::kReserve) {
      out.groups[{o->target.team, tier}].push_back(o);
      continue;
    }
    if (!o->id.empty()) out.ids.push_back(o->id);
    Sums& a = out.accounts[{o->target.team, tier}];
    a.bytes += o->bytes;
    a.objects += o->objects;
    auto& u = out.usage[{o->target.project, tier, std::string(kind_name(o->target.kind))}];
    u.first = o->target.team;
    u.second.bytes += o->bytes;
    u.second.objects += o->objects;
  }
  return out;
}

}  // namespace

std::chrono::nanoseconds Batcher::gather_time() const {
  return std::min<std::chrono::nanoseconds>(std::chrono::microseconds(250), last_batch_time_ / 4);
}

void Batcher::run(BatchOp& op) {
  UniqueLock lock(mu_);
  queue_.push_back(&op);
  ++callers_;
  peak_callers_ = std::max(peak_callers_, callers_);
  if (gathering_) gather_cv_.notify_one();
  cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) {
    return op.done || (leaders_ < kMaxLeaders && !queue_.empty() && queue_.front() == &op);
  });
  if (op.done) {
    --callers_;
    return;
  }
  // A leader. The callers of the batch that just ended come back within microseconds with
  // their next operation; a leader that started at once would take only those that queued
  // during that batch, and two halves of the callers would alternate for ever, each batch
  // half the size it could be. So it waits (a quarter of a batch's time at most) while
  // fewer are queued than have been calling lately. Alone, it never waits.
  if (const size_t expect = std::min(peak_callers_, kMaxBatch); queue_.size() < expect) {
    const auto deadline = std::chrono::steady_clock::now() + gather_time();
    gathering_ = true;
    gather_cv_.wait_until(lock, deadline,
                          [&]() SLUICE_REQUIRES(mu_) { return queue_.size() >= expect; });
    gathering_ = false;
  }
  // Everything queued so far goes in this batch, and leaves the queue; callers arriving
  // meanwhile wait for the next leader.
  std::vector<BatchOp*> batch;
  while (!queue_.empty() && batch.size() < kMaxBatch) {
    batch.push_back(queue_.front());
    queue_.pop_front();
  }
  ++leaders_;
  peak_callers_ = callers_;
  lock.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = execute(batch);
  if (!s && s.error().code() != Code::kUnavailable && batch.size() > 1) {
    // One bad operation (its project removed meanwhile, say) must not fail the others:
    // each runs again on its own.
    for (BatchOp* o : batch) {
      Status one = execute({o});
      if (!one) {
        o->status = one;
        o->reserved = false;
      }
    }
    s = {};
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  lock.lock();
  last_batch_time_ = took;
  for (BatchOp* o : batch) {
    if (!s) {
      o->status = s;
      o->reserved = false;
    }
    o->done = true;
  }
  --leaders_;
  --callers_;
  cv_.notify_all();  // the finished, and the next leader
}

Status Batcher::execute(const std::vector<BatchOp*>& batch) {
  if (db_.dialect() == Dialect::kPostgres) return execute_pg(batch);
  return db_.transaction([&](Conn& c) -> Status {
    int64_t now = clock_();
    // Settles first: what they release is room for the reservations after them.
    auto [ids, accounts, usage, groups] = sort_batch(batch);
    Rows released;
    for (const auto& id : ids) {
      SLUICE_ASSIGN_OR_RETURN(auto r, c.query(sql::kDeleteReservation, std::vector<Value>{id}));
      for (auto& row : r) released.push_back(std::move(row));
    }
    for (const Row& r : released) {
      Sums& a = accounts[{r.text(0), r.text(1)}];
      a.released_bytes += r.i64(2);
      a.released_objects += r.i64(3);
    }
    for (const auto& [key, s] : accounts)
      SLUICE_RETURN_IF_ERROR(
          c.query(sql::kSettle, std::vector<Value>{key.first, key.second, s.released_bytes,
                                                   s.released_objects, s.bytes, s.objects, now}));
    for (const auto& [key, u] : usage)
      SLUICE_RETURN_IF_ERROR(c.query(
          sql::kUsageAdd, std::vector<Value>{std::get<0>(key), std::get<1>(key), std::get<2>(key),
                                             u.first, u.second.bytes, u.second.objects, now}));

    // Reservations, one account at a time: all together when they fit, else one by one.
    std::vector<BatchOp*> granted;
    for (const auto& [key, ops] : groups) {
      int64_t bytes = 0, objects = 0;
      for (BatchOp* o : ops) {
        bytes += o->bytes;
        objects += o->objects;
      }
      SLUICE_RETURN_IF_ERROR(
          c.query(sql::kReserve, std::vector<Value>{key.first, key.second, bytes, objects, now}));
      if (c.changes() == 1) {
        granted.insert(granted.end(), ops.begin(), ops.end());
        continue;
      }
      if (ops.size() == 1) continue;  // refused
      for (BatchOp* o : ops) {
        SLUICE_RETURN_IF_ERROR(c.query(
            sql::kReserve, std::vector<Value>{key.first, key.second, o->bytes, o->objects, now}));
        if (c.changes() == 1) granted.push_back(o);
      }
    }
    for (BatchOp* o : granted)
      SLUICE_RETURN_IF_ERROR(
          c.query(sql::kInsertReservation,
                  std::vector<Value>{o->id, o->target.team, std::string(tier_name(o->target.tier)),
                                     o->bytes, o->objects, o->expires_ns}));
    for (BatchOp* o : granted) o->reserved = true;
    return {};
  });
}

// PostgreSQL: the whole batch in one pipeline (one round trip): BEGIN, every settle in one
// statement, every usage row in one, one statement per account for its reservations,
// COMMIT. Reservations of an account that do not fit together are then tried one by one,
// each its own transaction, in a second pipeline.
Status Batcher::execute_pg(const std::vector<BatchOp*>& batch) {
  return db_.with_conn([&](Conn& c) -> Status {
    Status last;
    for (int attempt = 0; attempt < 8; ++attempt) {
      int64_t now = clock_();
      auto [ids, accounts, usage, groups] = sort_batch(batch);
      std::vector<Stmt> stmts;
      stmts.push_back({"BEGIN", {}});
      if (!accounts.empty()) {
        std::vector<std::string> teams, tiers;
        std::vector<int64_t> db, dobj;
        for (const auto& [key, s] : accounts) {
          teams.push_back(key.first);
          tiers.push_back(key.second);
          db.push_back(s.bytes);
          dobj.push_back(s.objects);
        }
        stmts.push_back({sql::kSettleAllPg,
                         {text_array(ids), text_array(teams), text_array(tiers), int_array(db),
                          int_array(dobj), now}});
        std::vector<std::string> up, ut, uk, um;
        std::vector<int64_t> ub, uo;
        for (const auto& [key, u] : usage) {
          up.push_back(std::get<0>(key));
          ut.push_back(std::get<1>(key));
          uk.push_back(std::get<2>(key));
          um.push_back(u.first);
          ub.push_back(u.second.bytes);
          uo.push_back(u.second.objects);
        }
        stmts.push_back({sql::kUsageAddAllPg,
                         {text_array(up), text_array(ut), text_array(uk), text_array(um),
                          int_array(ub), int_array(uo), now}});
      }
      auto group_stmt = [&](const AccountKey& key, const std::vector<BatchOp*>& ops) {
        int64_t bytes = 0, objects = 0;
        std::vector<std::string> gid;
        std::vector<int64_t> b, o, e;
        for (BatchOp* op : ops) {
          bytes += op->bytes;
          objects += op->objects;
          gid.push_back(op->id);
          b.push_back(op->bytes);
          o.push_back(op->objects);
          e.push_back(op->expires_ns);
        }
        return Stmt{sql::kReserveGroupPg,
                    {key.first, key.second, bytes, objects, now, text_array(gid), int_array(b),
                     int_array(o), int_array(e)}};
      };
      size_t first_group = stmts.size();
      for (const auto& [key, ops] : groups) stmts.push_back(group_stmt(key, ops));
      stmts.push_back({"COMMIT", {}});
      Status s = c.pipeline(stmts);
      if (!s) {
        (void)c.script("ROLLBACK");  // a no-op (a warning) when COMMIT itself failed
        last = s;
        if (s.error().code() == Code::kConflict) continue;  // a deadlock, lost: again
        return s;
      }
      std::vector<Stmt> retries;
      std::vector<BatchOp*> retried;
      size_t g = first_group;
      for (const auto& [key, ops] : groups) {
        const Stmt& st = stmts[g++];
        if (st.changes == static_cast<int64_t>(ops.size())) {
          for (BatchOp* op : ops) op->reserved = true;
        } else if (ops.size() > 1) {
          for (BatchOp* op : ops) {
            retries.push_back(group_stmt(key, {op}));
            retried.push_back(op);
          }
        }
      }
      // The batch is committed: from here on nothing may fail the batch as a whole (that
      // would run committed operations again). Reservations that did not fit together are
      // tried one by one, each its own transaction, each with its own outcome.
      for (size_t i = 0; i < retries.size(); ++i) {
        auto r = c.query(retries[i].sql, retries[i].params);
        if (!r)
          retried[i]->status = std::unexpected(r.error());
        else
          retried[i]->reserved = c.changes() == 1;
      }
      return {};
    }
    return last;
  });
}

}  // namespace sluice::ledger
