// The ledger's URI (--ledger, $SLUICE_LEDGER, sluiced's "ledger"): parse_ledger_uri, and
// redact_ledger_uri, which names a PostgreSQL ledger in messages. libpq (PQconninfoParse,
// which parses without connecting) is the oracle: a redacted URI must not give libpq a
// password. Also the other names the ledger parses from users: project
// locations, tiers and kinds.
#include <libpq-fe.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_util.h"
#include "ledger/uri.h"
#include "sluice/ledger/ledger.h"

using namespace sluice;

namespace {

// The password libpq would use for `conninfo`; nullopt when it does not parse.
std::optional<std::string> libpq_password(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (err) PQfreemem(err);
  if (!opts) return std::nullopt;
  std::string password;
  for (PQconninfoOption* o = opts; o->keyword; ++o)
    if (std::strcmp(o->keyword, "password") == 0 && o->val) password = o->val;
  PQconninfoFree(opts);
  return password;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::text_of(data, size);
  if (text.find('\0') != std::string_view::npos) return -1;  // not a C string: never a URI
  if (auto u = ledger::parse_ledger_uri(text); u && u->kind == ledger::LedgerUri::Kind::kPostgres) {
    const std::string shown = ledger::redact_ledger_uri(u->target);
    if (auto leaked = libpq_password(shown))
      SLUICE_FUZZ_CHECK(leaked->empty(), "a redacted ledger URI holds no password");
  }
  (void)ledger::redact_ledger_uri(std::string(text));
  (void)ledger::validate_location("fuzz", text);
  // normalise_location resolves file paths on disk: only the other schemes here.
  if (text.find("://") != std::string_view::npos && !text.starts_with("file://"))
    (void)ledger::normalise_location(text);
  (void)ledger::parse_tier(text);
  (void)ledger::parse_kind(text);
  return 0;
}
