#!/usr/bin/python3
"""`sluice team|project|quota|usage` and quota enforcement on `sluice cp`, end to end, on
the embedded SQLite ledger and on a real PostgreSQL server (tests/integration/pg_harness.py).

Usage: ledger_test.py PATH/TO/sluice. The PostgreSQL half reports SKIP (with the reason)
when no server can run here; the SQLite half always runs.
"""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pg_harness import Postgres, PostgresUnavailable  # noqa: E402
from s3_harness import Runner, S3rver, Skip, find_s3rver  # noqa: E402

BIN = None
MiB = 1 << 20


class Env:
    """A fresh SLUICE_HOME and a ledger (a SQLite path or a PostgreSQL database)."""

    def __init__(self, ledger_uri):
        self.dir = tempfile.mkdtemp(prefix="sluice-ledger-")
        self.home = os.path.join(self.dir, "home")
        self.ledger = ledger_uri or os.path.join(self.home, "ledger.db")

    def run(self, *args, check=True, timeout=120):
        env = dict(os.environ, SLUICE_HOME=self.home, SLUICE_LEDGER=self.ledger)
        r = subprocess.run([BIN, *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"sluice {' '.join(args)} exited {r.returncode}: {r.stderr}")
        return r

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def file(self, name, size):
        p = self.path("src", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(os.urandom(size))
        return p

    def account(self, team, tier):
        accs = json.loads(self.run("quota", "show", team, "--json").stdout)
        return next(a for a in accs if a["tier"] == tier)

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def expect_fail(r, code_name, *words):
    assert r.returncode != 0, f"expected a failure, got 0: {r.stdout}"
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr, r.stderr
    assert code_name in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, f"{w!r} not in: {r.stderr}"


def t_bad_input(env):
    env.run("team", "add", "vision")
    expect_fail(env.run("team", "add", "vision", check=False), "already_exists", "'vision'")
    expect_fail(env.run("team", "add", "../etc", check=False), "invalid_argument", "team name")
    expect_fail(env.run("project", "add", "p", "--team", "ghost", "--location", env.path("d"), check=False),
                "not_found", "unknown team 'ghost'")
    for flags, word in ((["--hard-bytes", "-5"], "--hard-bytes"), (["--hard-bytes", "12Q"], "--hard-bytes"),
                        (["--hard-objects", "1.5"], "--hard-objects"), (["--grace", "soon"], "--grace"),
                        (["--soft-bytes", "20M", "--hard-bytes", "10M"], "soft limit above")):
        r = env.run("quota", "set", "vision", "--tier", "nvme", *flags, check=False)
        expect_fail(r, "invalid_argument", word)
    expect_fail(env.run("quota", "set", "vision", "--tier", "tape", check=False), "invalid_argument", "tier 'tape'")
    expect_fail(env.run("quota", "set", "ghost", "--tier", "nvme", "--hard-bytes", "1G", check=False),
                "not_found", "ghost")
    expect_fail(env.run("quota", "show", "ghost", check=False), "not_found", "ghost")
    expect_fail(env.run("usage", "--by", "colour", check=False), "invalid_argument", "--by")
    # A ledger that cannot be reached: a clear error, and a write refused rather than uncounted.
    bad = dict(os.environ, SLUICE_HOME=env.home, SLUICE_LEDGER="postgresql://u:pw@127.0.0.1:1/none")
    r = subprocess.run([BIN, "usage"], capture_output=True, text=True, env=bad, timeout=60)
    expect_fail(r, "unavailable", "127.0.0.1:1")
    assert "pw" not in r.stderr.replace("pwd", ""), r.stderr
    src = env.file("x", 1000)
    os.makedirs(env.path("anywhere"), exist_ok=True)
    r = subprocess.run([BIN, "cp", src, env.path("anywhere", "x")], capture_output=True, text=True, env=bad,
                       timeout=60)
    expect_fail(r, "unavailable", "ledger")
    assert not os.path.exists(env.path("anywhere", "x"))
    # A mistyped ledger path is an error, never a new ledger in a new directory.
    r = env.run("usage", "--ledger", env.path("no-such-dir", "ledger.db"), check=False)
    expect_fail(r, "io_error", "no-such-dir")
    assert not os.path.exists(env.path("no-such-dir"))
    # cp --ledger names the ledger to charge; an unreachable one refuses the write.
    r = env.run("cp", src, env.path("anywhere", "y"), "--ledger", "postgresql://u@127.0.0.1:1/none", check=False)
    expect_fail(r, "unavailable", "--ledger")
    assert not os.path.exists(env.path("anywhere", "y"))
    # An empty value is refused, not read as "not given".
    for flags in (["quota", "set", "vision", "--tier", "nvme", "--hard-bytes", ""],
                  ["gc", "run", "--delay", ""], ["capacity", "set", "nvme", "--bytes", ""]):
        r = env.run(*flags, check=False)
        assert r.returncode == 2 and "must not be empty" in r.stderr, (flags, r.stderr)


def t_cp_is_charged_and_refused_at_the_limit(env):
    env.run("team", "add", "nlp")
    data = env.path("data")
    os.makedirs(data)
    env.run("project", "add", "nlp-ckpt", "--team", "nlp", "--location", data, "--kind", "checkpoint")
    env.run("quota", "set", "nlp", "--tier", "nvme", "--hard-bytes", "10M", "--hard-objects", "100")
    env.run("cp", env.file("a", 3 * MiB), os.path.join(data, "a"))
    env.run("cp", env.file("b", 4 * MiB), os.path.join(data, "b"))
    a = env.account("nlp", "nvme")
    assert (a["used_bytes"], a["used_objects"], a["reserved_bytes"]) == (7 * MiB, 2, 0), a
    # Over the limit: refused before writing, with the team, tier, limit and usage named;
    # nothing left at the destination.
    r = env.run("cp", env.file("c", 6 * MiB), os.path.join(data, "c"), check=False)
    expect_fail(r, "quota_exceeded", "team 'nlp'", "tier nvme", "hard limit 10.00 MiB", "used 7.00 MiB")
    assert sorted(os.listdir(data)) == ["a", "b"], os.listdir(data)
    # An overwrite charges the difference; outside every project nothing is charged.
    env.run("cp", env.file("a2", 1 * MiB), os.path.join(data, "a"))
    os.makedirs(env.path("elsewhere"))
    env.run("cp", env.file("big", 20 * MiB), env.path("elsewhere", "big"))
    a = env.account("nlp", "nvme")
    assert (a["used_bytes"], a["used_objects"]) == (5 * MiB, 2), a
    by_kind = json.loads(env.run("usage", "--by", "kind", "--json").stdout)
    assert by_kind == [{"kind": "checkpoint", "bytes": 5 * MiB, "objects": 2,
                        "updated_ns": by_kind[0]["updated_ns"]}], by_kind
    out = env.run("quota", "show").stdout
    assert "nlp" in out and "ok" in out, out


def t_every_spelling_of_a_project_is_charged(env):
    """Relative, dotted, doubled-slash and symlinked spellings of a project's directory are
    the project (so its quota holds); a symlink alias cannot become a second project; an
    overwrite near the limit reserves only the difference."""
    env.run("team", "add", "sp")
    data = env.path("d")
    proj = os.path.join(data, "p")
    os.makedirs(proj)
    os.makedirs(os.path.join(data, "other"))
    os.symlink(proj, os.path.join(data, "plink"))
    env.run("project", "add", "sp-p", "--team", "sp", "--location", proj)
    expect_fail(env.run("project", "add", "alias", "--team", "sp", "--location", os.path.join(data, "plink"),
                        check=False), "conflict", "overlaps")
    env.run("quota", "set", "sp", "--tier", "nvme", "--hard-bytes", "1M")
    src = env.file("k", 100_000)
    spellings = [os.path.join(data, "other", "..", "p", "a"), data + "//p/b", os.path.join(data, "plink", "c"),
                 "file://" + os.path.join(data, "other", "..", "p", "d")]
    for dst in spellings:
        env.run("cp", src, dst)
    env2 = dict(os.environ, SLUICE_HOME=env.home, SLUICE_LEDGER=env.ledger)
    for cwd, dst in ((data, "p/e"), (proj, "./f"), (proj, "g")):
        r = subprocess.run([BIN, "cp", src, dst], capture_output=True, text=True, env=env2, cwd=cwd, timeout=60)
        assert r.returncode == 0, r.stderr
    a = env.account("sp", "nvme")
    assert (a["used_bytes"], a["used_objects"]) == (7 * 100_000, 7), a
    # 700 KB of 1 MiB used: a 300 KB new file does not fit, rewriting one of 100 KB with
    # 150 KB does (50 KB more), and so does rewriting it smaller.
    r = subprocess.run([BIN, "cp", env.file("big", 400_000), "p/h"], capture_output=True, text=True, env=env2,
                       cwd=data, timeout=60)
    expect_fail(r, "quota_exceeded", "team 'sp'")
    env.run("cp", env.file("k2", 150_000), os.path.join(proj, "a"))
    env.run("cp", env.file("k3", 10_000), os.path.join(proj, "b"))
    a = env.account("sp", "nvme")
    assert (a["used_bytes"], a["used_objects"]) == (5 * 100_000 + 150_000 + 10_000, 7), a
    os.mkfifo(os.path.join(data, "fifo"))
    expect_fail(env.run("project", "add", "fifo", "--team", "sp", "--location", os.path.join(data, "fifo"),
                        check=False), "invalid_argument", "not a directory")
    for bad in ("s3:///x", "http://h/x", "/", "S3://b/x"):
        expect_fail(env.run("project", "add", "bad", "--team", "sp", "--location", bad, check=False),
                    "invalid_argument", "location")


def t_sixteen_processes_race_at_a_hard_limit(env):
    """16 `sluice cp` processes at once, each 1 MiB, against a 10 MiB hard limit: exactly
    ten succeed and usage never passes the limit."""
    env.run("team", "add", "race")
    data = env.path("race")
    os.makedirs(data)
    env.run("project", "add", "race-p", "--team", "race", "--location", data)
    env.run("quota", "set", "race", "--tier", "nvme", "--hard-bytes", "10M")
    srcs = [env.file(f"r{i}", MiB) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: env.run("cp", srcs[i], os.path.join(data, f"r{i}"), check=False),
                                range(16)))
    ok = [r for r in results if r.returncode == 0]
    refused = [r for r in results if r.returncode != 0]
    for r in refused:
        assert "quota_exceeded" in r.stderr, r.stderr
    assert len(ok) == 10, [r.stderr for r in refused]
    assert len(os.listdir(data)) == 10, os.listdir(data)
    a = env.account("race", "nvme")
    assert (a["used_bytes"], a["used_objects"], a["reserved_bytes"]) == (10 * MiB, 10, 0), a


def t_sixteen_overwrites_of_one_key_charge_what_is_left(env):
    """Defect 11 of the hostile test: 16 `sluice cp` processes overwrite one key at once, with
    sources of different sizes; usage equals the one object left, with no reconcile."""
    env.run("team", "add", "ow")
    data = env.path("ow")
    os.makedirs(data)
    env.run("project", "add", "ow-p", "--team", "ow", "--location", data)
    srcs = [env.file(f"o{i}", (i + 1) * 256 * 1024) for i in range(16)]
    dst = os.path.join(data, "one")
    for round_ in range(2):
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda i: env.run("cp", srcs[i], dst, check=False), range(16)))
        assert all(r.returncode == 0 for r in results), [r.stderr for r in results if r.returncode]
        a = env.account("ow", "nvme")
        assert (a["used_bytes"], a["used_objects"], a["reserved_bytes"]) == (os.path.getsize(dst), 1, 0), \
            (round_, a, os.path.getsize(dst))


def t_sixteen_overwrites_on_s3_charge_what_is_left(env):
    """Defect 11 on an object store, which cannot say what a PUT replaced: 16 `sluice cp`
    processes overwrite one key at once; the key's lock in the ledger orders look, publish
    and charge, so usage equals the one object left, with no reconcile."""
    if not find_s3rver():
        raise Skip("s3rver not installed")
    s3 = S3rver(buckets=("owb",))
    try:
        os.environ.update({"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"})
        env.run("team", "add", "ows3")
        env.run("project", "add", "ows3-p", "--team", "ows3", "--location", "s3://owb/data")
        srcs = [env.file(f"s{i}", (i + 1) * 64 * 1024) for i in range(16)]
        for round_ in range(2):
            with ThreadPoolExecutor(16) as pool:
                results = list(pool.map(
                    lambda i: env.run("cp", srcs[i], "s3://owb/data/one", "--endpoint-url", s3.endpoint,
                                      check=False), range(16)))
            assert all(r.returncode == 0 for r in results), [r.stderr for r in results if r.returncode]
            plan = json.loads(env.run("usage", "reconcile", "--dry-run", "--json", "--endpoint-url",
                                      s3.endpoint).stdout)
            found = plan["projects"][0]
            a = env.account("ows3", "object")
            assert (a["used_bytes"], a["used_objects"], a["reserved_bytes"]) == \
                (found["found_bytes"], 1, 0), (round_, a, found)
    finally:
        s3.close()


def t_upgrade_drops_cache_usage_charged_by_changes(env):
    """A ledger from before cache tallies (table set 3) held cache usage charged by changes,
    which each cache's first tally would count again: opening it with this sluice drops that
    usage (nvme, cache) and takes it off the accounts; every cache sets its own figure when
    it next starts."""
    if env.ledger.startswith("postgres"):
        raise Skip("the old ledger is made with Python's sqlite3")
    env.run("team", "add", "old")
    data = env.path("old")
    os.makedirs(data)
    env.run("project", "add", "old-p", "--team", "old", "--location", data)
    env.run("cp", env.file("k", MiB), os.path.join(data, "k"))
    db = sqlite3.connect(env.ledger)
    with db:
        db.execute("INSERT INTO usage (project, tier, kind, team, bytes, objects, updated_ns)"
                   " VALUES ('old-p', 'nvme', 'cache', 'old', 7340032, 0, 1)")
        db.execute("UPDATE accounts SET used_bytes = used_bytes + 7340032 WHERE team = 'old'"
                   " AND tier = 'nvme'")
        db.execute("UPDATE sluice_meta SET value = '3' WHERE name = 'table_set'")
    db.close()
    a = env.account("old", "nvme")  # opens (and upgrades) the ledger
    assert (a["used_bytes"], a["used_objects"]) == (MiB, 1), a
    kinds = {u["kind"] for u in json.loads(env.run("usage", "--by", "kind", "--json").stdout)}
    assert "cache" not in kinds, kinds


def t_reconcile_repairs_drift(env):
    env.run("team", "add", "drift")
    data = env.path("drift")
    os.makedirs(data)
    env.run("project", "add", "drift-p", "--team", "drift", "--location", data)
    env.run("cp", env.file("a", 2 * MiB), os.path.join(data, "a"))
    env.run("cp", env.file("b", 1 * MiB), os.path.join(data, "b"))
    # Behind sluice's back: one deleted, one written by another tool.
    os.remove(os.path.join(data, "a"))
    with open(os.path.join(data, "c"), "wb") as f:
        f.write(b"x" * 5000)
    plan = json.loads(env.run("usage", "reconcile", "--dry-run", "--json").stdout)
    entry = plan["projects"][0]
    assert entry["changed"] and entry["found_bytes"] == MiB + 5000 and entry["found_objects"] == 2, entry
    assert env.account("drift", "nvme")["used_bytes"] == 3 * MiB  # a dry run changes nothing
    out = env.run("usage", "reconcile").stdout
    assert "fixed" in out, out
    a = env.account("drift", "nvme")
    assert (a["used_bytes"], a["used_objects"]) == (MiB + 5000, 2), a
    assert "ok" in env.run("usage", "reconcile").stdout
    # A location that cannot be listed is reported and left as it was, never taken as empty.
    shutil.rmtree(data)
    r = env.run("usage", "reconcile", check=False)
    assert r.returncode == 1 and "not recounted" in r.stdout and "left as they were" in r.stderr, (r.stdout, r.stderr)
    assert env.account("drift", "nvme")["used_bytes"] == MiB + 5000
    # A project can go only once nothing is charged to it.
    expect_fail(env.run("project", "rm", "drift-p", check=False), "conflict", "still has")


def t_ckpt_and_dataset_pack_are_charged(env):
    """Checkpoint saves charge `checkpoint`, gc uncharges what it removes, a save past the
    limit fails with nothing committed; dataset pack charges `dataset`. The ledger agrees
    with a recount after each."""
    env.run("team", "add", "ml")
    tier = env.path("tier")
    os.makedirs(tier)
    env.run("project", "add", "ml-p", "--team", "ml", "--location", tier)
    state = env.path("state")
    os.makedirs(state)
    with open(os.path.join(state, "model.bin"), "wb") as f:
        f.write(os.urandom(3 * MiB))
    for step in ("1", "2"):
        env.run("ckpt", "save", "--series", "s", "--step", step, "--to", tier, state)

    def recount_agrees():
        plan = json.loads(env.run("usage", "reconcile", "--dry-run", "--json").stdout)
        assert not plan["projects"][0]["changed"], plan

    by_kind = {r["kind"]: r for r in json.loads(env.run("usage", "--by", "kind", "--json").stdout)}
    assert by_kind["checkpoint"]["bytes"] > 6 * MiB, by_kind
    recount_agrees()
    env.run("ckpt", "gc", "--series", "s", "--keep-last", "1", "--from", tier)
    by_kind = {r["kind"]: r for r in json.loads(env.run("usage", "--by", "kind", "--json").stdout)}
    assert 3 * MiB < by_kind["checkpoint"]["bytes"] < 4 * MiB, by_kind
    recount_agrees()
    env.run("quota", "set", "ml", "--tier", "nvme", "--hard-bytes", "5M")
    r = env.run("ckpt", "save", "--series", "s", "--step", "3", "--to", tier, state, check=False)
    expect_fail(r, "quota_exceeded", "team 'ml'")
    ls = json.loads(env.run("ckpt", "ls", "--series", "s", "--from", tier, "--json").stdout)
    assert [c["step"] for c in ls] == [2], ls
    # Over quota on a later tier: refused before the first tier gets a byte.
    free = env.path("free-tier")
    r = env.run("ckpt", "save", "--series", "s", "--step", "3", "--to", free, "--to", tier, state,
                check=False)
    expect_fail(r, "quota_exceeded", "team 'ml'", "checkpoint tier", "step 3")
    ls = json.loads(env.run("ckpt", "ls", "--series", "s", "--from", free, "--json").stdout)
    assert ls == [], ls
    left = [os.path.join(dp, f) for dp, _, fs in os.walk(free) for f in fs]
    assert left == [], left
    recount_agrees()
    env.run("quota", "set", "ml", "--tier", "nvme", "--hard-bytes", "none")
    imgs = env.path("imgs")
    os.makedirs(imgs)
    for i in range(3):
        with open(os.path.join(imgs, f"{i}.jpg"), "wb") as f:
            f.write(os.urandom(1000))
    env.run("dataset", "pack", imgs, os.path.join(tier, "ds"))
    by_kind = {r["kind"]: r for r in json.loads(env.run("usage", "--by", "kind", "--json").stdout)}
    assert by_kind["dataset"]["objects"] == 3, by_kind  # one shard, its index, the record
    recount_agrees()


def sql(env, statement):
    """Runs SQL on the test's ledger directly (to lay down a synthetic history)."""
    if env.ledger.startswith("postgresql://"):
        subprocess.run(["psql", env.ledger, "-qc", statement], check=True, capture_output=True)
    else:
        import sqlite3
        db = sqlite3.connect(env.ledger)
        db.execute(statement)
        db.commit()
        db.close()


def t_forecast(env):
    """Steady growth of 10 GiB a day to 700 GiB against a 1 TiB soft limit: the line says
    32.4 days; a team that is flat apart from one burst gets no date; bad flags fail."""
    GiB = 1 << 30
    for team in ("grow", "burst"):
        env.run("team", "add", team)
        env.run("project", "add", team + "-p", "--team", team, "--location", env.path(team))
        env.run("quota", "set", team, "--tier", "nvme", "--soft-bytes", "1T", "--hard-bytes", "2T")
    import time
    now = time.time_ns()
    day = 86400 * 10**9
    for d in range(60):
        t = now - (60 - d) * day
        sql(env, f"INSERT INTO history VALUES ('grow', 'nvme', {t}, {(100 + 10 * d) * GiB}, {d})")
        burst = 400 if d == 59 else 100
        sql(env, f"INSERT INTO history VALUES ('burst', 'nvme', {t}, {burst * GiB}, 1)")
    sql(env, f"UPDATE accounts SET used_bytes = {700 * GiB}, used_objects = 60 WHERE team = 'grow'")
    sql(env, f"UPDATE accounts SET used_bytes = {400 * GiB}, used_objects = 1 WHERE team = 'burst'")
    out = json.loads(env.run("forecast", "--json").stdout)
    grow = next(r for r in out if r["team"] == "grow" and r["metric"] == "bytes")
    days = (grow["verdict_at_ns"] - now) / day
    assert 31.4 <= days <= 33.4, (days, grow["verdict"])  # (1024 - 700) GiB at 10 GiB a day
    assert grow["linear"]["trusted"] and abs(grow["linear"]["rate_per_day"] / GiB - 10) < 0.3, grow["linear"]
    assert grow["limit_kind"] == "soft limit" and len(grow["history"]) >= 30
    burst = next(r for r in out if r["team"] == "burst" and r["metric"] == "bytes")
    assert burst["verdict_at_ns"] is None and "no reliable trend" in burst["verdict"], burst["verdict"]
    text = env.run("forecast", "--team", "grow").stdout
    assert "reaches the limit on" in text and "burst" not in text, text
    expect_fail(env.run("forecast", "--window", "soon", check=False), "invalid_argument", "--window")
    expect_fail(env.run("forecast", "--team", "ghost", check=False), "not_found", "ghost")
    expect_fail(env.run("capacity", "set", "nvme", "--bytes", "-1", check=False), "invalid_argument", "--bytes")
    env.run("capacity", "set", "--tier", "nvme", "--bytes", "10T")
    assert any(r["team"] is None for r in json.loads(env.run("forecast", "--json").stdout))
    # Defect 19 of the hostile test: capacity shows what each tier holds; --tier as quota set.
    tiers = {t["tier"]: t for t in json.loads(env.run("capacity", "ls", "--json").stdout)}
    assert tiers["nvme"]["capacity_bytes"] == 10 * 1024 * GiB, tiers
    assert tiers["nvme"]["used_bytes"] == 1100 * GiB and tiers["ram"]["capacity_bytes"] is None, tiers
    expect_fail(env.run("capacity", "set", "--bytes", "1T", check=False), "invalid_argument", "--tier")


def t_s3_projects_are_folders(env):
    """On s3://, project 'x' owns x/..., not the keys of its neighbour 'xy': cp charges and
    reconcile counts each project's own objects only."""
    if not find_s3rver():
        print("SKIP - s3 projects: s3rver not installed", flush=True)
        return
    s3 = S3rver(buckets=("bkt",))
    try:
        env2 = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
        os.environ.update(env2)
        env.run("team", "add", "one")
        env.run("team", "add", "two")
        env.run("project", "add", "x", "--team", "one", "--location", "s3://bkt/x")
        env.run("project", "add", "xy", "--team", "two", "--location", "s3://bkt/xy")
        src = env.file("o", 1000)
        for dst in ("s3://bkt/x/a", "s3://bkt/x/b", "s3://bkt/xy/c"):
            env.run("cp", src, dst, "--endpoint-url", s3.endpoint)
        assert env.account("one", "object")["used_objects"] == 2
        assert env.account("two", "object")["used_objects"] == 1
        plan = json.loads(env.run("usage", "reconcile", "--dry-run", "--json", "--endpoint-url", s3.endpoint).stdout)
        found = {p["project"]: (p["found_objects"], p["changed"]) for p in plan["projects"]}
        assert found == {"x": (2, False), "xy": (1, False)}, plan
    finally:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.pop(k, None)
        s3.close()


def t_gc_plan_run_restore_purge(env):
    """Rules keep the last 2 and every 2000th step of a series; the newest and a pinned step
    always stay. plan changes nothing; run moves the rest to the trash (usage unchanged,
    the steps unlisted); restore brings a run back intact; run --delay 0 purges."""
    env.run("team", "add", "gc")
    tier = env.path("ckpt")
    os.makedirs(tier)
    env.run("project", "add", "gc-p", "--team", "gc", "--location", tier, "--kind", "checkpoint")
    state = env.path("state")
    os.makedirs(state)
    with open(os.path.join(state, "w.bin"), "wb") as f:
        f.write(os.urandom(MiB))
    for step in range(1000, 7000, 1000):
        env.run("ckpt", "save", "--series", "s", "--step", str(step), "--to", tier, state)

    def steps():
        return [c["step"] for c in json.loads(env.run("ckpt", "ls", "--series", "s", "--from", tier,
                                                      "--json").stdout)]

    assert "no retention rule" in env.run("gc", "plan").stdout
    # A rule that matches nothing is not "no rule": the plan says what it found.
    empty = env.path("empty")
    os.makedirs(empty)
    env.run("project", "add", "gc-empty", "--team", "gc", "--location", empty)
    env.run("gc", "rule", "set", "gc-empty", "--max-age", "1d")
    out = env.run("gc", "plan", "--project", "gc-empty").stdout
    assert "no retention rule" not in out and "found no objects" in out, out
    env.run("gc", "rule", "set", "gc-p", "--series", "s", "--keep-last", "2", "--keep-every", "2000")
    env.run("gc", "pin", "gc-p", "s/step-000000001000/")
    expect_fail(env.run("gc", "rule", "set", "ghost", "--keep-last", "1", check=False), "not_found", "ghost")
    expect_fail(env.run("gc", "rule", "set", "gc-p", "--keep-last", "-1", check=False), "invalid_argument")
    expect_fail(env.run("gc", "rule", "set", "gc-p", "--max-age", "soon", check=False), "invalid_argument")
    # A bare number is not a policy's duration: 30 meant as days would be 30 seconds.
    expect_fail(env.run("gc", "rule", "set", "gc-p", "--max-age", "30", check=False), "invalid_argument",
                "give the unit")
    expect_fail(env.run("quota", "set", "gc", "--tier", "nvme", "--grace", "7", check=False),
                "invalid_argument", "give the unit")
    expect_fail(env.run("gc", "rule", "set", "gc-p", check=False), "invalid_argument", "gc rule rm")
    # set changes the fields given and keeps the others; rm removes the rule.
    env.run("gc", "rule", "set", "gc-p", "--series", "t", "--keep-last", "3")
    out = env.run("gc", "rule", "set", "gc-p", "--series", "t", "--max-age", "30d").stdout
    assert "--keep-last 3 --max-age 30d" in out, out
    rules = json.loads(env.run("gc", "rule", "ls", "--json").stdout)["rules"]
    assert [(r["keep_last"], r["max_age_s"]) for r in rules if r["series"] == "t"] \
        == [(3, 30 * 86400)], rules
    assert "removed" in env.run("gc", "rule", "rm", "gc-p", "--series", "t").stdout
    expect_fail(env.run("gc", "rule", "rm", "gc-p", "--series", "t", check=False), "not_found", "rule ls")
    plan = json.loads(env.run("gc", "plan", "--json").stdout)
    gone = sorted(u["step"] for u in plan["units"] if u["remove"])
    assert gone == [3000], plan
    reasons = {u["step"]: u["reason"] for u in plan["units"]}
    assert reasons[1000] == "pinned" and "multiple of 2000" in reasons[2000], reasons
    assert steps() == [1000, 2000, 3000, 4000, 5000, 6000]  # plan changed nothing
    used = env.account("gc", "nvme")["used_bytes"]
    out = json.loads(env.run("gc", "run", "--json").stdout)
    assert out["trashed_units"] == 1 and out["purged_objects"] == 0, out
    assert steps() == [1000, 2000, 4000, 5000, 6000]
    assert env.account("gc", "nvme")["used_bytes"] == used  # the trash still takes room
    assert not json.loads(env.run("usage", "reconcile", "--dry-run", "--json").stdout)["projects"][0]["changed"]
    run = out["run"]
    trash = json.loads(env.run("gc", "trash", "--json").stdout)
    assert [t["run"] for t in trash] == [run] and trash[0]["objects"] == 3, trash
    env.run("gc", "restore", run)
    assert steps() == [1000, 2000, 3000, 4000, 5000, 6000]
    assert "0 bad" in env.run("ckpt", "verify", "--series", "s", "--step", "3000", "--from", tier).stdout
    assert json.loads(env.run("gc", "trash", "--json").stdout) == []
    expect_fail(env.run("gc", "restore", run, check=False), "not_found", run)
    # Again, and purged at once: the bytes go for good and the usage follows.
    out = json.loads(env.run("gc", "run", "--delay", "0", "--json").stdout)
    assert out["trashed_units"] == 1 and out["purged_objects"] == 3, out
    assert steps() == [1000, 2000, 4000, 5000, 6000]
    assert env.account("gc", "nvme")["used_bytes"] < used
    assert not json.loads(env.run("usage", "reconcile", "--dry-run", "--json").stdout)["projects"][0]["changed"]
    assert not os.path.exists(os.path.join(tier, ".sluice-trash", run))
    # At its hard limit a team can still clean up: moves to the trash need no quota.
    used = env.account("gc", "nvme")["used_bytes"]
    env.run("quota", "set", "gc", "--tier", "nvme", "--hard-bytes", str(used))
    env.run("gc", "rule", "set", "gc-p", "--series", "s", "--keep-last", "1", "--keep-every", "2000")
    out = json.loads(env.run("gc", "run", "--json").stdout)
    assert out["trashed_units"] == 1 and not out["errors"], out  # step 5000 (4000: every 2000)
    at_limit_run = out["run"]
    env.run("quota", "set", "gc", "--tier", "nvme", "--hard-bytes", "none")
    # A project-wide rule never takes a checkpoint step apart, even of a series without a rule.
    env.run("ckpt", "save", "--series", "other", "--step", "1", "--to", tier, state)
    env.run("ckpt", "save", "--series", "other", "--step", "2", "--to", tier, state)
    env.run("gc", "rule", "set", "gc-p", "--max-age", "0s")
    plan = json.loads(env.run("gc", "plan", "--json").stdout)
    assert not [u for u in plan["units"] if u["remove"] and u["unit"].startswith("other/")], plan
    # Whatever the rule, the newest checkpoint stays.
    env.run("gc", "rule", "set", "gc-p", "--series", "s", "--keep-last", "none", "--keep-every", "none",
            "--max-age", "0s")
    env.run("gc", "unpin", "gc-p", "s/step-000000001000/")
    env.run("gc", "run", "--delay", "0")
    assert steps() == [6000], steps()
    left = json.loads(env.run("gc", "trash", "--json").stdout)  # the 24 h run still waits
    assert len(left) == 1 and left[0]["run"] == at_limit_run, left
    # Purges uncharged what they removed: the ledger agrees with a recount.
    assert not json.loads(env.run("usage", "reconcile", "--dry-run", "--json").stdout)["projects"][0]["changed"]


def t_a_restored_object_keeps_its_age(env):
    """keep-last 1: the older object goes to the trash; restored, it is still the older one,
    so the next plan trashes it again, not the newer one."""
    env.run("team", "add", "age")
    d = env.path("age")
    os.makedirs(d)
    env.run("project", "add", "age-p", "--team", "age", "--location", d)
    for name, t in (("a.bin", 1_600_000_000), ("c.bin", 1_700_000_000)):
        with open(os.path.join(d, name), "wb") as f:
            f.write(os.urandom(1000))
        os.utime(os.path.join(d, name), (t, t))
    env.run("gc", "rule", "set", "age-p", "--keep-last", "1")
    run_id = json.loads(env.run("gc", "run", "--json").stdout)["run"]
    assert not os.path.exists(os.path.join(d, "a.bin"))
    env.run("gc", "restore", run_id)
    assert os.stat(os.path.join(d, "a.bin")).st_mtime == 1_600_000_000
    plan = json.loads(env.run("gc", "plan", "--project", "age-p", "--json").stdout)
    gone = [u["unit"] for u in plan["units"] if u["remove"]]
    assert gone == ["a.bin"], plan


def t_gc_refuses_what_would_lose_data(env):
    """Bad flags fail before anything is purged; a newest step with a torn manifest does not
    shield itself at the cost of the good ones; pins must be real key prefixes, and
    `ckpt gc` and `save --keep-last` honour them; an empty run name restores nothing."""
    env.run("team", "add", "h")
    tier = env.path("ht")
    os.makedirs(tier)
    env.run("project", "add", "h-p", "--team", "h", "--location", tier, "--kind", "checkpoint")
    state = env.path("hstate")
    os.makedirs(state)
    with open(os.path.join(state, "w.bin"), "wb") as f:
        f.write(os.urandom(64 * 1024))
    for step in (1, 2, 3):
        env.run("ckpt", "save", "--series", "s", "--step", str(step), "--to", tier, state)
    env.run("gc", "rule", "set", "h-p", "--series", "s", "--keep-last", "1")
    env.run("gc", "run", "--delay", "0s")  # step 3 stays, 1 and 2 go
    for step in (4, 5):
        env.run("ckpt", "save", "--series", "s", "--step", str(step), "--to", tier, state)
    env.run("gc", "run", "--delay", "24h")  # step 4 waits in the trash
    r = env.run("gc", "run", "--grace", "garbage", check=False)
    expect_fail(r, "invalid_argument", "--grace")
    assert r.returncode == 2 and len(json.loads(env.run("gc", "trash", "--json").stdout)) == 1
    expect_fail(env.run("gc", "restore", "", check=False), "invalid_argument", "RUN")
    # The newest step's manifest torn: step 5 is not "the newest complete checkpoint"; the
    # rule keeps the newest intact one instead of trashing it.
    with open(os.path.join(tier, "s", "step-000000000005", "manifest.json"), "w") as f:
        f.write("{torn")
    plan = json.loads(env.run("gc", "plan", "--json").stdout)
    assert [u["step"] for u in plan["units"] if u["remove"]] == [], plan
    assert any(u["step"] == 5 and "incomplete" in u["reason"] for u in plan["units"]), plan
    for bad in ("/abs/s/", "../s/", "./s/", "s//x", "*"):
        expect_fail(env.run("gc", "pin", "h-p", bad, check=False), "invalid_argument", "pin")
    expect_fail(env.run("gc", "rule", "set", "h-p", "--keep-every", "5", check=False), "invalid_argument",
                "--series")
    # The checkpointer's own retention (ckpt gc, save --keep-last) honours the pins too.
    for step in (6, 7):
        env.run("ckpt", "save", "--series", "s", "--step", str(step), "--to", tier, state)
    env.run("gc", "pin", "h-p", "s/step-000000000006/")

    def manifests():
        return sorted(int(d[5:]) for d in os.listdir(os.path.join(tier, "s"))
                      if os.path.exists(os.path.join(tier, "s", d, "manifest.json")))
    env.run("ckpt", "gc", "--series", "s", "--keep-last", "1", "--from", tier)
    assert manifests() == [5, 6, 7], manifests()  # 5: its torn manifest waits for the grace
    env.run("ckpt", "save", "--series", "s", "--step", "8", "--to", tier, "--keep-last", "1", state)
    assert manifests() == [5, 6, 8], manifests()


def t_a_link_out_of_a_project_stops_no_gc(env):
    """Defect 13 of the hostile test: one symlink leading out of a project (anyone who can
    write there can plant one) is left alone and reported; retention handles the rest."""
    env.run("team", "add", "ln")
    tier = env.path("ln-ckpt")
    os.makedirs(tier)
    env.run("project", "add", "ln-p", "--team", "ln", "--location", tier, "--kind", "checkpoint")
    state = env.path("ln-state")
    os.makedirs(state)
    with open(os.path.join(state, "w.bin"), "wb") as f:
        f.write(os.urandom(64 << 10))
    for step in (1, 2, 3):
        env.run("ckpt", "save", "--series", "s", "--step", str(step), "--to", tier, state)
    os.symlink("/etc/hostname", os.path.join(tier, "planted"))
    env.run("gc", "rule", "set", "ln-p", "--series", "s", "--keep-last", "1")
    r = env.run("gc", "plan", "--json")
    plan = json.loads(r.stdout)
    assert sorted(u["step"] for u in plan["units"] if u["remove"]) == [1, 2], plan
    assert any("planted" in k for k in plan["skipped"]), plan
    assert "planted" in r.stderr, r.stderr
    out = json.loads(env.run("gc", "run", "--json").stdout)
    assert out["trashed_units"] == 2 and any("planted" in k for k in out["skipped"]), out
    assert os.path.islink(os.path.join(tier, "planted"))


def main():
    global BIN
    BIN = os.path.abspath(sys.argv[1])
    runner = Runner()
    tests = (t_bad_input, t_cp_is_charged_and_refused_at_the_limit, t_every_spelling_of_a_project_is_charged,
             t_sixteen_processes_race_at_a_hard_limit, t_sixteen_overwrites_of_one_key_charge_what_is_left,
             t_sixteen_overwrites_on_s3_charge_what_is_left,
             t_upgrade_drops_cache_usage_charged_by_changes, t_reconcile_repairs_drift,
             t_ckpt_and_dataset_pack_are_charged, t_forecast, t_s3_projects_are_folders,
             t_gc_plan_run_restore_purge, t_a_restored_object_keeps_its_age,
             t_gc_refuses_what_would_lose_data,
             t_a_link_out_of_a_project_stops_no_gc)
    for t in tests:
        env = Env(None)
        try:
            runner.run(f"sqlite: {t.__name__}", t, env)
        finally:
            env.close()
    try:
        pg = Postgres()
    except PostgresUnavailable as e:
        print(f"SKIP - postgresql: {e.reason}", flush=True)
        runner.finish()
        return
    try:
        for i, t in enumerate(tests):
            db = f"cli_{i}"
            subprocess.run(["psql", pg.uri, "-qc", f"CREATE DATABASE {db}"], check=True,
                           capture_output=True)
            env = Env(pg.uri.rsplit("/", 1)[0] + "/" + db)
            try:
                runner.run(f"postgresql: {t.__name__}", t, env)
            finally:
                env.close()
    finally:
        pg.close()
    runner.finish()


if __name__ == "__main__":
    main()
