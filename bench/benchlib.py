"""Small helpers shared by the benchmark scripts (standard library only)."""
import os
import resource

SLUICE_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin", "sluice")


def children_cpu():
    """User + system CPU seconds of this process's waited-for children so far (rusage)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def process_cpu(pid):
    """User + system CPU seconds of a running process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fio_cpu(job, rw):
    """A fio job's CPU seconds over its `rw` ("read" or "write") run, from its JSON: its
    usr_cpu and sys_cpu are percentages of that runtime."""
    return (job["usr_cpu"] + job["sys_cpu"]) / 100 * job[rw]["runtime"] / 1000


def parse_size(s):
    """'4G', '512M', '64K' or plain bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def print_table(header, rows, markdown):
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)] if rows else []
    for row in [header] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
