#!/usr/bin/env bash
# Per-packet engine time (criterion medians) beside a 4 KiB memcpy measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q -p monel-rc --bench engine -- --warm-up-time 2 --measurement-time 8 >/dev/null
python3 - <<'PY'
import json
m = {b: json.load(open(f"target/criterion/engine/{b}/new/estimates.json"))["median"]["point_estimate"]
     for b in ("write_4k_mtu_per_packet", "baseline_memcpy_4k")}
e, c = m["write_4k_mtu_per_packet"], m["baseline_memcpy_4k"]
print(f"engine per packet (median): {e:.1f} ns = {1e3/e:.2f} Mpps per core")
print(f"baseline 4 KiB memcpy (median, same run): {c:.1f} ns")
print(f"engine / memcpy: {e/c:.2f}")
PY
