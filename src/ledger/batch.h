// src/ledger/batch.h: group commit of the ledger's hot operations.
//
// Every reserve and every commit (and charge) of a process goes through one Batcher. Like
// leveldb's writer queue: callers queue their operation; the one at the front becomes the
// leader, takes everything queued behind it (up to kMaxBatch), runs it all in one database
// transaction, and wakes the others with their results. Under load that turns N
// transactions (and N log flushes, and N waits on a hot account row's lock) into one; with
// one caller it costs nothing extra. A new leader first gathers the callers of the batch
// that just ended (see run()), so the batches do not split into two alternating halves.
// Within a batch, reservations of one account are
// checked together with one statement, and one at a time only when together they do not fit.
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "ledger/db.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/ledger/ledger.h"

namespace sluice::ledger {

struct BatchOp {
  enum class Type { kReserve, kSettle };
  Type type = Type::kReserve;
  ChargeTarget target;
  // kReserve: the new reservation's ID. kSettle: the reservation to end (empty for a
  // charge without one).
  std::string id;
  int64_t bytes = 0, objects = 0;  // kReserve: what to reserve; kSettle: the usage change
  int64_t expires_ns = 0;          // kReserve

  // Results.
  bool reserved = false;  // kReserve: false means the quota refused it
  Status status;
  bool done = false;
};

class Batcher {
 public:
  static constexpr size_t kMaxBatch = 128;
  // Batches in flight at once, each on its own connection. Measured with 16 writers on one
  // account (bench/ledger_bench.cc): 2 ran within noise of 1, 4 at 0.55x (smaller batches
  // queue on the account row's lock); so one, as in leveldb.
  static constexpr int kMaxLeaders = 1;
  Batcher(Db& db, int64_t (*clock)(), int64_t (*fallback_clock)())
      : db_(db), clock_(clock ? clock : fallback_clock) {}

  // Runs `op` in some batch; returns when it is done (op.status, op.reserved).
  void run(BatchOp& op);

 private:
  Status execute(const std::vector<BatchOp*>& batch);
  Status execute_pg(const std::vector<BatchOp*>& batch);

  // How long a new leader waits for callers of the last batch to come back, at most.
  std::chrono::nanoseconds gather_time() const SLUICE_REQUIRES(mu_);

  Db& db_;
  int64_t (*clock_)();
  Mutex mu_;
  CondVar cv_;
  // A queued op's `done` is guarded by mu_ too, which an annotation in BatchOp cannot name.
  std::deque<BatchOp*> queue_ SLUICE_GUARDED_BY(mu_);  // waiting for a leader
  int leaders_ SLUICE_GUARDED_BY(mu_) = 0;
  // Callers inside run() now, and the most seen since the last batch began: how many a
  // leader may expect to gather.
  size_t callers_ SLUICE_GUARDED_BY(mu_) = 0;
  size_t peak_callers_ SLUICE_GUARDED_BY(mu_) = 0;
  bool gathering_ SLUICE_GUARDED_BY(mu_) = false;  // a leader waits in gather_cv_ for more
  CondVar gather_cv_;
  std::chrono::nanoseconds last_batch_time_ SLUICE_GUARDED_BY(mu_){0};
};

}  // namespace sluice::ledger
