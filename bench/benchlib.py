"""Small helpers shared by the benchmark scripts (standard library only)."""
import os

SLUICE_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin", "sluice")


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
