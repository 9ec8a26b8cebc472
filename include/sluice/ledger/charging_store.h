// sluice/ledger/charging_store.h: the store decorator that charges every write to a team.
//
// Wrapped around any store, it finds the project that owns each key (the longest project
// location that the store's URI plus the key lies under) and:
// - on create, reserves the object (and its size, when WriteOptions::size_hint gives it)
//   against the project team's quota on the tier, so a write that would pass a limit fails
//   with QuotaExceeded before a byte is written;
// - while bytes arrive, grows the reservation ahead of them (by at least `min_growth`, and
//   doubling up to 1 GiB at a time; by only what is needed when that is all that fits), so
//   the reservation always covers what was written; a write running longer than the
//   reservation's time to live renews it (and reserves again if it expired);
// - on commit, charges what was really written (for an overwrite, the difference from the
//   old object) and ends the reservation; on abort, or a writer dropped without commit,
//   releases it;
// - on remove and remove_many, uncharges the objects.
// On a store that cannot say what a publish replaced (Store::reports_replaced false: object
// stores), each publish and removal (remove_many's batches too) holds the lock of its key's
// folder in the ledger (Ledger::lock_key) across a fresh look at the old object, the publish
// and the charge, so writers racing on one key charge exactly what each replaced. The lock
// is kept as a lease across this store's consecutive publishes into the folder (for at most
// `publish_lease`, and given up early when another writer waits for it): a copy of many
// small objects takes it about once a second, not once per object, and learns what each
// publish replaces from one listing of the folder instead of a stat per object.
// Keys outside every project pass through uncharged, unless `require_project` is set.
//
// Once the wrapped store has published an object, its commit succeeds even if the ledger
// then cannot be reached: the object is there, and refusing would lie. The reservation then
// expires on its own and the usage is short until `sluice usage reconcile` recounts it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "sluice/ledger/ledger.h"
#include "sluice/store/store.h"

namespace sluice::ledger {

struct ChargingOptions {
  std::optional<Tier> tier;  // charge this tier instead of the project's own
  std::optional<Kind> kind;  // charge as this kind instead of the project's default
  // Refuse (PermissionDenied) writes to keys no project owns.
  bool require_project = false;
  // The smallest step a reservation grows by when a writer passes what it reserved.
  uint64_t min_growth = 64ull << 20;
  // Stores that cannot say what a publish replaced (object stores): how long the lock of a
  // key's folder lasts unless renewed (a crashed writer's is then taken over, judged by the
  // ledger's clock), and how long a writer waits for another's before it fails with
  // Unavailable.
  std::chrono::seconds publish_hold{120}, publish_wait{300};
  // How long one lease on a folder's lock is kept across consecutive publishes and
  // removals (a publish after it takes the lock again); 0: taken and let go for each one,
  // with a stat of the key instead of a listing.
  std::chrono::milliseconds publish_lease{1000};
};

// Loads the projects from the ledger now (and again, at most every few seconds, when a
// key has no owner), so a ledger that cannot be reached fails here.
Result<std::unique_ptr<store::Store>> with_charging(std::shared_ptr<store::Store> store,
                                                    std::shared_ptr<Ledger> ledger,
                                                    const ChargingOptions& options = {});

}  // namespace sluice::ledger
