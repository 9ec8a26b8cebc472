#include "ledger/uri.h"

#include <libpq-fe.h>

#include <cctype>
#include <map>

namespace sluice::ledger {

Result<LedgerUri> parse_ledger_uri(std::string_view uri) {
  auto quoted = [&] { return "'" + std::string(uri) + "'"; };
  std::string u(uri);
  if (u.starts_with("postgresql://") || u.starts_with("postgres://")) {
    if (u.find("connect_timeout") == std::string::npos)
      u += (u.find('?') == std::string::npos ? "?" : "&") + std::string("connect_timeout=10");
    return LedgerUri{LedgerUri::Kind::kPostgres, std::move(u)};
  }
  if (u.starts_with("sqlite://")) {
    std::string path = u.substr(9);
    if (path.empty() || path[0] != '/')
      return fail(Code::kInvalidArgument,
                  "ledger URI " + quoted() + ": expected sqlite:///absolute/path.db");
    return LedgerUri{LedgerUri::Kind::kSqlite, std::move(path)};
  }
  // libpq's key=value form ("host=db1 dbname=ledger password=..."), which a plain path must
  // never be taken for: that made an empty SQLite ledger named after the password and
  // turned quotas off. What libpq parses as one, with only its own keywords, is one.
  if (u.find('=') != std::string::npos && u.find("://") == std::string::npos) {
    char* error = nullptr;
    PQconninfoOption* options = PQconninfoParse(u.c_str(), &error);
    if (error) PQfreemem(error);
    if (options) {
      PQconninfoFree(options);
      if (u.find("connect_timeout") == std::string::npos) u += " connect_timeout=10";
      return LedgerUri{LedgerUri::Kind::kPostgres, std::move(u)};
    }
    // Not conninfo, and a path holding '=' is more likely a mistyped conninfo (which may
    // hold a password) than a file: refused, without echoing it.
    return fail(Code::kInvalidArgument,
                "the ledger URI holds '=' but is not a PostgreSQL connection string libpq "
                "accepts (not shown: it may hold a password); expected sqlite:///path.db, a "
                "path, postgresql://user@host:port/db or host=... dbname=...");
  }
  if (u.find("://") == std::string::npos && !u.empty())
    return LedgerUri{LedgerUri::Kind::kSqlite, std::move(u)};
  // Only the scheme is quoted: what follows "://" may hold a password.
  const size_t sep = u.find("://");
  return fail(Code::kInvalidArgument,
              "unsupported ledger URI" +
                  (sep == std::string::npos ? std::string(" (empty)")
                                            : " '" + u.substr(0, sep) + "://...'") +
                  ": expected sqlite:///path.db, a path, or postgresql://user@host:port/db");
}

namespace {

// `s` with every byte but RFC 3986's unreserved ones percent-encoded, so no part of a
// rebuilt URI can read as another (a user name holding ':' or '@').
std::string encoded(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace

std::string redact_ledger_uri(const std::string& uri) {
  // libpq decides what the password is (a percent-encoded "password" keyword, an '@' in the
  // query, a second userinfo...), so the URI is parsed by libpq and rebuilt from the parts
  // that are not secret; editing the text found passwords libpq would not see, and missed
  // ones it would (fuzz/ledger_uri_fuzz).
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(uri.c_str(), &error);
  if (error) PQfreemem(error);
  if (!options) return "postgresql://(a URI libpq cannot parse, not shown)";
  std::map<std::string, std::string, std::less<>> v;
  for (const PQconninfoOption* o = options; o->keyword; ++o)
    if (o->val && *o->val) v[o->keyword] = o->val;
  PQconninfoFree(options);
  std::string out = "postgresql://";
  if (v.contains("user")) out += encoded(v["user"]) + "@";
  const std::string host = v.contains("host") ? v["host"] : v["hostaddr"];
  const bool ipv6 = host.find(':') != std::string::npos &&
                    host.find_first_not_of("0123456789abcdefABCDEF:.") == std::string::npos;
  out += ipv6 ? "[" + host + "]" : encoded(host);
  if (v.contains("port")) out += ":" + encoded(v["port"]);
  out += "/" + encoded(v["dbname"]);
  return out;
}

}  // namespace sluice::ledger
