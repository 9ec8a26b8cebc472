// The ledger as a session opens it (sluice/client/ledger.h).
#include "sluice/client/ledger.h"

#include <filesystem>

#include "sluice/ledger/charging_store.h"

namespace sluice::client {

Result<std::unique_ptr<ledger::Ledger>> open_ledger(const Session& session) {
  const std::string& home = session.options().home;
  if (session.ledger_uri() == home + "/ledger.db") {  // the embedded one, however it was named
    std::error_code ec;
    std::filesystem::create_directories(home, ec);
  }
  auto l = ledger::Ledger::open(session.ledger_uri());
  if (!l) return std::unexpected(l.error().with_context("cannot open the ledger"));
  return l;
}

Result<std::shared_ptr<ledger::Ledger>> ledger_for_writes(const Session& session) {
  if (!session.has_ledger()) return std::shared_ptr<ledger::Ledger>{};  // nothing to charge
  const std::string uri = session.ledger_uri();
  const LedgerChoice& chosen = session.options().ledger;
  const std::string how = chosen.source.empty() ? uri : chosen.source;
  auto l = ledger::Ledger::open(uri);
  if (!l)
    return std::unexpected(
        l.error().with_context("cannot open the ledger (" + how +
                               ") to charge this write; a configured ledger is never skipped"));
  auto projects = (*l)->projects();
  if (!projects) return std::unexpected(projects.error());
  if (projects->empty()) return std::shared_ptr<ledger::Ledger>{};
  return std::shared_ptr<ledger::Ledger>(std::move(*l));
}

namespace {

class LedgerCharging final : public Charging {
 public:
  Result<std::shared_ptr<store::Store>> charged(const Session& session,
                                                std::shared_ptr<store::Store> store,
                                                std::optional<ledger::Kind> kind) const override {
    SLUICE_ASSIGN_OR_RETURN(auto ledger, ledger_for_writes(session));
    if (!ledger) return store;
    SLUICE_ASSIGN_OR_RETURN(
        auto wrapped, ledger::with_charging(std::move(store), std::move(ledger), {.kind = kind}));
    return std::shared_ptr<store::Store>(std::move(wrapped));
  }
};

}  // namespace

std::shared_ptr<const Charging> ledger_charging() {
  static const std::shared_ptr<const Charging> charging = std::make_shared<LedgerCharging>();
  return charging;
}

}  // namespace sluice::client
