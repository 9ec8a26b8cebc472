// src/ledger/sql.h: the ledger's statements that run on both SQLite and PostgreSQL.
// Parameters are $1..$N (ledger/db.h); every statement names its parameters above it.
#pragma once

namespace sluice::ledger::sql {

// Whether adding ($3 bytes, $4 objects) at time $5 keeps the account within its quota:
// never past a hard limit; past a soft limit only while its grace period runs.
#define SLUICE_QUOTA_OK                                                                 \
  "(hard_bytes IS NULL OR used_bytes + reserved_bytes + $3 <= hard_bytes)"              \
  " AND (hard_objects IS NULL OR used_objects + reserved_objects + $4 <= hard_objects)" \
  " AND (over_soft_since_ns IS NULL OR $5 - over_soft_since_ns < grace_ns"              \
  " OR ((soft_bytes IS NULL OR used_bytes + reserved_bytes + $3 <= soft_bytes)"         \
  " AND (soft_objects IS NULL OR used_objects + reserved_objects + $4 <= soft_objects)))"

// $1 team, $2 tier, $3 bytes, $4 objects, $5 now: reserves, or changes no row when the
// quota would not hold (or the account is missing). The check and the change are one
// statement: PostgreSQL re-evaluates the WHERE clause on the newest row after waiting for
// its lock, and SQLite runs one writer at a time.
inline constexpr const char* kReserve =
    "UPDATE accounts SET reserved_bytes = reserved_bytes + $3,"
    " reserved_objects = reserved_objects + $4, updated_ns = $5"
    " WHERE team = $1 AND tier = $2 AND " SLUICE_QUOTA_OK;

// PostgreSQL: reserves for several writers of one account at once, and records their
// reservations, in one statement: $1 team, $2 tier, $3 and $4 the bytes and objects of
// them all, $5 now, then $6 ids, $7 bytes, $8 objects, $9 expiry times (arrays, one entry
// per writer). Inserts every row or none.
inline constexpr const char* kReserveGroupPg =
    "WITH a AS (UPDATE accounts SET reserved_bytes = reserved_bytes + $3,"
    " reserved_objects = reserved_objects + $4, updated_ns = $5"
    " WHERE team = $1 AND tier = $2 AND " SLUICE_QUOTA_OK
    " RETURNING 1)"
    " INSERT INTO reservations (id, team, tier, bytes, objects, expires_ns)"
    " SELECT u.id, CAST($1 AS TEXT), CAST($2 AS TEXT), u.b, u.o, u.e FROM a,"
    " unnest(CAST($6 AS TEXT[]), CAST($7 AS BIGINT[]), CAST($8 AS BIGINT[]),"
    " CAST($9 AS BIGINT[])) AS u(id, b, o, e)";

#undef SLUICE_QUOTA_OK

// PostgreSQL: settles many writers in one statement. $1 the reservations to end (array),
// then per account $2 teams, $3 tiers, $4 bytes and $5 objects the usage changes by
// (arrays), $6 now. Like kSettle for each account.
inline constexpr const char* kSettleAllPg =
    "WITH d AS (DELETE FROM reservations WHERE id = ANY(CAST($1 AS TEXT[]))"
    " RETURNING team, tier, bytes, objects),"
    " rel AS (SELECT team, tier, SUM(bytes) AS rb, SUM(objects) AS ro FROM d GROUP BY team, tier),"
    " v AS (SELECT * FROM unnest(CAST($2 AS TEXT[]), CAST($3 AS TEXT[]), CAST($4 AS BIGINT[]),"
    " CAST($5 AS BIGINT[])) AS v(team, tier, db, dobj)),"
    " x AS (SELECT COALESCE(rel.team, v.team) AS team, COALESCE(rel.tier, v.tier) AS tier,"
    " COALESCE(rel.rb, 0) AS rb, COALESCE(rel.ro, 0) AS ro, COALESCE(v.db, 0) AS db,"
    " COALESCE(v.dobj, 0) AS dobj FROM rel FULL OUTER JOIN v ON rel.team = v.team AND rel.tier = "
    "v.tier)"
    " UPDATE accounts a SET reserved_bytes = a.reserved_bytes - x.rb,"
    " reserved_objects = a.reserved_objects - x.ro,"
    " used_bytes = GREATEST(a.used_bytes + x.db, 0),"
    " used_objects = GREATEST(a.used_objects + x.dobj, 0),"
    " over_soft_since_ns = CASE WHEN (a.soft_bytes IS NOT NULL AND a.used_bytes + x.db > "
    "a.soft_bytes)"
    " OR (a.soft_objects IS NOT NULL AND a.used_objects + x.dobj > a.soft_objects)"
    " THEN COALESCE(a.over_soft_since_ns, CAST($6 AS BIGINT)) ELSE NULL END,"
    " updated_ns = CAST($6 AS BIGINT)"
    " FROM x WHERE a.team = x.team AND a.tier = x.tier";

// PostgreSQL: kUsageAdd for many usage rows (each key once): $1 projects, $2 tiers,
// $3 kinds, $4 teams, $5 bytes, $6 objects (arrays), $7 now.
inline constexpr const char* kUsageAddAllPg =
    "WITH u AS (SELECT * FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS TEXT[]), CAST($3 AS TEXT[]),"
    " CAST($4 AS TEXT[]), CAST($5 AS BIGINT[]), CAST($6 AS BIGINT[]))"
    " AS u(project, tier, kind, team, b, o))"
    " INSERT INTO usage AS g (project, tier, kind, team, bytes, objects, updated_ns)"
    " SELECT project, tier, kind, team, GREATEST(b, 0), GREATEST(o, 0), CAST($7 AS BIGINT) FROM u"
    " ON CONFLICT (project, tier, kind) DO UPDATE SET"
    " bytes = GREATEST(g.bytes + (SELECT u.b FROM u WHERE u.project = g.project"
    " AND u.tier = g.tier AND u.kind = g.kind), 0),"
    " objects = GREATEST(g.objects + (SELECT u.o FROM u WHERE u.project = g.project"
    " AND u.tier = g.tier AND u.kind = g.kind), 0),"
    " updated_ns = CAST($7 AS BIGINT)";

// $1 id, $2 team, $3 tier, $4 bytes, $5 objects, $6 expires_ns.
inline constexpr const char* kInsertReservation =
    "INSERT INTO reservations (id, team, tier, bytes, objects, expires_ns)"
    " VALUES ($1, $2, $3, $4, $5, $6)";

// $1 id.
inline constexpr const char* kDeleteReservation =
    "DELETE FROM reservations WHERE id = $1 RETURNING team, tier, bytes, objects";

// $1 team, $2 tier, $3 bytes, $4 objects: a reservation ends without a charge.
inline constexpr const char* kUnreserve =
    "UPDATE accounts SET reserved_bytes = reserved_bytes - $3,"
    " reserved_objects = reserved_objects - $4 WHERE team = $1 AND tier = $2";

// $1 team, $2 tier, $3 bytes and $4 objects released from reservations, usage changed by
// $5 bytes and $6 objects (never below zero), $7 now. Notes when the account first went
// past a soft limit, and forgets it once it is back under.
inline constexpr const char* kSettle =
    "UPDATE accounts SET reserved_bytes = reserved_bytes - $3,"
    " reserved_objects = reserved_objects - $4,"
    " used_bytes = CASE WHEN used_bytes + $5 < 0 THEN 0 ELSE used_bytes + $5 END,"
    " used_objects = CASE WHEN used_objects + $6 < 0 THEN 0 ELSE used_objects + $6 END,"
    " over_soft_since_ns = CASE WHEN (soft_bytes IS NOT NULL AND used_bytes + $5 > soft_bytes)"
    " OR (soft_objects IS NOT NULL AND used_objects + $6 > soft_objects)"
    " THEN COALESCE(over_soft_since_ns, $7) ELSE NULL END, updated_ns = $7"
    " WHERE team = $1 AND tier = $2";

// $1 project, $2 tier, $3 kind, $4 team, usage changed by $5 bytes and $6 objects (never
// below zero), $7 now.
inline constexpr const char* kUsageAdd =
    "INSERT INTO usage (project, tier, kind, team, bytes, objects, updated_ns)"
    " VALUES ($1, $2, $3, $4, CASE WHEN $5 < 0 THEN 0 ELSE $5 END,"
    " CASE WHEN $6 < 0 THEN 0 ELSE $6 END, $7)"
    " ON CONFLICT (project, tier, kind) DO UPDATE SET"
    " bytes = CASE WHEN usage.bytes + $5 < 0 THEN 0 ELSE usage.bytes + $5 END,"
    " objects = CASE WHEN usage.objects + $6 < 0 THEN 0 ELSE usage.objects + $6 END,"
    " updated_ns = $7";

}  // namespace sluice::ledger::sql
