#!/bin/bash
# The CUDA path of Monel's torch backend and Python package, checked on a machine with a GPU,
# in a few minutes: 2 ranks sharing the GPU. Needs Python with torch (CUDA) and Monel's
# wheel; nothing from a registry. Writes everything it prints to $OUT/gpu-check.txt
# (default: target/gpu-check). Every phase runs even if one before it failed; the script
# fails if any did.
#   scripts/gpu-check.sh [WHEEL] [DIGITS.npz]
# 1. every operation on CUDA tensors (dtypes, 1 element to 64 MiB, in place and out of place,
#    async and blocking) against the same operation on CPU tensors; stream order; bad input:
#    through CUDA IPC at every size (a), and staged through host memory (b, MONEL_CUDA_IPC=0);
# 2. FSDP2 on a CUDA module against one process; monel.Communicator on CUDA arrays;
# 3. examples/ddp_train.py on CUDA, 2 ranks, on Monel and on Gloo: the same loss curve within
#    1e-4, and bitwise-equal parameters across ranks;
# 4. float32 all_reduce, 1 KiB to 64 MiB, Monel (as it chooses, and staged alone) against Gloo
#    on CUDA tensors (and Monel on CPU tensors), medians.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/gpu-check}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.txt") 2>&1
py=${PYTHON:-python3}
if [ -n "${1:-}" ]; then  # the wheel, unpacked where this run alone imports it
  site=$(mktemp -d)
  "$py" -m zipfile -e "$1" "$site" || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
digits=${2:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$py" -c "import torch, monel; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" || exit 1
# Each phase within its own time (GPU_CHECK_PHASE seconds, default 150), so one that hangs
# is named and the others still run.
limit=${GPU_CHECK_PHASE:-150}
run() { timeout "$limit" "$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$@"; }
failed=()
phase() {  # phase NAME COMMAND...: runs it, timed, and remembers a failure
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  if "$@"; then
    echo "-- $name: passed in $((SECONDS - t0)) s"
  else
    echo "-- $name: FAILED (exit $?) after $((SECONDS - t0)) s"
    failed+=("$name")
  fi
}
ddp() {
  for b in monel gloo; do
    run examples/ddp_train.py --backend "$b" --device cuda --epochs 3 \
      ${digits:+--digits "$digits"} --json "$out/ddp-$b.json" || return 1
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
}
race() {
  run python/tests/gpu_check.py race monel | tee "$out/race-monel.jsonl" &&
    MONEL_CUDA_IPC=0 run python/tests/gpu_check.py race monel-host | tee "$out/race-monel-host.jsonl" &&
    run python/tests/gpu_check.py race gloo | tee "$out/race-gloo.jsonl" || return 1
  "$py" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for b in ("monel", "monel-host", "gloo")
        for l in open(f"{sys.argv[1]}/race-{b}.jsonl") if l.startswith("{")]
t = {(r["backend"], r["tensors"], r["bytes"]): r["median_us"] for r in rows}
print(f"{'bytes':>10} {'monel us':>13} {'monel staged us':>16} {'gloo us':>10} "
      f"{'monel cpu us':>13} {'gloo/monel':>10} {'gloo/staged':>12}")
for size in sorted({r["bytes"] for r in rows}):
    m, h = t[("monel", "cuda", size)], t[("monel-host", "cuda", size)]
    g, c = t[("gloo", "cuda", size)], t[("monel", "cpu", size)]
    print(f"{size:>10} {m:>13.1f} {h:>16.1f} {g:>10.1f} {c:>13.1f} {g / m:>9.2f}x {g / h:>11.2f}x")
PY
}
start=$SECONDS
ipc_ops() { MONEL_CUDA_IPC_MIN=0 run python/tests/gpu_check.py ops; }
phase "1a. every operation on CUDA tensors against CPU tensors (CUDA IPC at every size)" ipc_ops
staged_ops() { MONEL_CUDA_IPC=0 MONEL_CUDA_CHUNK=1048576 run python/tests/gpu_check.py ops; }
phase "1b. every operation on CUDA tensors against CPU tensors (staged, MONEL_CUDA_IPC=0)" \
  staged_ops
phase "2a. FSDP2 on CUDA against one process" run python/tests/gpu_check.py fsdp
phase "2b. monel.Communicator on CUDA arrays" timeout "$limit" "$py" python/tests/gpu_check.py comm
phase "3. DDP on CUDA, Monel and Gloo" ddp
phase "4. all_reduce, Monel against Gloo" race
if [ ${#failed[@]} -gt 0 ]; then
  echo "== gpu-check FAILED in $((SECONDS - start)) s: ${failed[*]}"
  exit 1
fi
echo "== gpu-check passed in $((SECONDS - start)) s"
