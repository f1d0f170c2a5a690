"""Medians of scripts/xfer-race.sh rounds, as a markdown table per batch size: GB/s of each
path and Monel's ratios to Mooncake and to each path's raw baseline.
Usage: summarize.py RACE_OUTPUT...   (the lines `round R block B batch N: ...`)"""
import re
import statistics
import sys
from collections import defaultdict

FIELDS = [
    ("raw write-bw", "raw RNIC"), ("monel xfer rdma", "RDMA"), ("raw tcp", "raw TCP"),
    ("monel xfer tcp", "TCP"), ("raw memcpy", "memcpy"), ("raw cma", "raw CMA"),
    ("monel xfer shm", "shm"), ("mooncake tcp", "Mooncake"),
]


def parse(paths):
    runs = defaultdict(lambda: defaultdict(list))  # (batch, block) -> field -> [GB/s]
    for p in paths:
        for line in open(p):
            m = re.match(r"round \d+ block (\d+) batch (\d+): (.*)", line)
            if not m:
                continue
            key = (int(m[2]), int(m[1]))
            for part in m[3].split(";"):
                for name, _ in FIELDS:
                    v = re.match(rf"\s*{name} ([0-9.]+)", part)
                    if v:
                        runs[key][name].append(float(v[1]))
    return runs


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main():
    runs = parse(sys.argv[1:])
    cols = [label for _, label in FIELDS]
    head = cols + ["RDMA/MC", "TCP/MC", "shm/MC", "RDMA/raw", "TCP/raw", "shm/CMA", "shm/memcpy"]
    print("| block | batch | n | " + " | ".join(head) + " |")
    print("|" + "---|" * (len(head) + 3))
    for (batch, block) in sorted(runs, key=lambda k: (k[1], k[0])):
        f = runs[(batch, block)]
        med = {n: statistics.median(f[n]) if f[n] else None for n, _ in FIELDS}
        n = max((len(v) for v in f.values()), default=0)

        def ratio(a, b, x=""):
            return f"{med[a] / med[b]:.2f}{x}" if med[a] and med[b] else "-"

        row = [f"{med[k]:.2f}" if med[k] else "-" for k, _ in FIELDS]
        row += [ratio("monel xfer rdma", "mooncake tcp", "x"), ratio("monel xfer tcp", "mooncake tcp", "x"),
                ratio("monel xfer shm", "mooncake tcp", "x"), ratio("monel xfer rdma", "raw write-bw"),
                ratio("monel xfer tcp", "raw tcp"), ratio("monel xfer shm", "raw cma"),
                ratio("monel xfer shm", "raw memcpy")]
        print(f"| {size(block)} | {batch} | {n} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
