#!/bin/bash
# The CUDA path of Monel's torch backend, checked on a machine with a GPU, in a few minutes:
# 2 ranks sharing the GPU. Needs Python with torch (CUDA) and Monel's wheel; nothing from a
# registry. Writes everything it prints to $OUT/gpu-check.txt (default: target/gpu-check).
#   scripts/gpu-check.sh [WHEEL] [DIGITS.npz]
# 1. every operation on CUDA tensors (dtypes, 1 element to 64 MiB, in place and out of place,
#    async and blocking) against the same operation on CPU tensors; stream order; bad input;
# 2. examples/ddp_train.py on CUDA, 2 ranks, on Monel and on Gloo: the same loss curve within
#    1e-4, and bitwise-equal parameters across ranks;
# 3. float32 all_reduce, 1 KiB to 64 MiB, Monel against Gloo on CUDA tensors (and Monel on CPU
#    tensors, the staging's cost), medians.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/gpu-check}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.txt") 2>&1
py=${PYTHON:-python3}
if [ -n "${1:-}" ]; then
  "$py" -m pip install -q --no-deps --force-reinstall "$1"
fi
digits=${2:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$py" -c "import torch, monel; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
# Each phase within its own time (GPU_CHECK_PHASE seconds, default 240), so one that hangs
# is named and the others still run.
run() { timeout "${GPU_CHECK_PHASE:-240}" "$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$@"; }
start=$(date +%s)
echo "== 1. every operation on CUDA tensors against CPU tensors"
run python/tests/gpu_check.py ops
echo "== 2. DDP on CUDA, Monel and Gloo"
for b in monel gloo; do
  run examples/ddp_train.py --backend "$b" --device cuda --epochs 3 \
    ${digits:+--digits "$digits"} --json "$out/ddp-$b.json"
done
"$py" - "$out" <<'PY'
import json, sys
m, g = (json.load(open(f"{sys.argv[1]}/ddp-{b}.json")) for b in ("monel", "gloo"))
diff = max(abs(a - b) for a, b in zip(m["losses"], g["losses"]))
print(json.dumps({"phase": "ddp", "steps": len(m["losses"]), "max_loss_diff": diff,
                  "monel_same_params": m["same_params"], "gloo_same_params": g["same_params"],
                  "monel_accuracy": m["accuracy"], "gloo_accuracy": g["accuracy"]}))
assert diff < 1e-4 and m["same_params"] and g["same_params"], "DDP on CUDA"
PY
echo "== 3. all_reduce, Monel against Gloo"
run python/tests/gpu_check.py race monel | tee "$out/race-monel.jsonl"
run python/tests/gpu_check.py race gloo | tee "$out/race-gloo.jsonl"
"$py" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for b in ("monel", "gloo") for l in open(f"{sys.argv[1]}/race-{b}.jsonl")
        if l.startswith("{")]
t = {(r["backend"], r["tensors"], r["bytes"]): r["median_us"] for r in rows}
print(f"{'bytes':>10} {'monel cuda us':>14} {'gloo cuda us':>13} {'monel cpu us':>13} {'gloo/monel':>11}")
for size in sorted({r["bytes"] for r in rows}):
    m, g, c = t[("monel", "cuda", size)], t[("gloo", "cuda", size)], t[("monel", "cpu", size)]
    print(f"{size:>10} {m:>14.1f} {g:>13.1f} {c:>13.1f} {g / m:>10.2f}x")
PY
echo "== gpu-check passed in $(($(date +%s) - start)) s"
