#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, run on such a machine (CI has none): the NVML collector
# against the real library (and the fake held to it), the checkpoint engine's pinned-memory path,
# weight transfer GPU to GPU over TCP and UCX, then the figures of benchmarks/gpu.py and of the
# host-side benchmarks this machine can run. Stops loudly where there is no GPU.
#
#   bash scripts/gpu-check.sh [OUTPUT_DIR]     # logs go to OUTPUT_DIR (default ./gpu-check-out)
#
# PYTHON names the interpreter (default .venv/bin/python, else python3). Needs the project's
# runtime dependencies, torch with CUDA, and the 'ucx' extra for the UCX parts.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check-out}"
mkdir -p "$out"
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
export PYTHONUNBUFFERED=1
status=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $out/NAME.log
    local name="$1" limit="$2"
    shift 2
    echo "== $name: $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,temperature.gpu,power.draw --format=csv \
    || { echo "gpu-check: nvidia-smi failed: no NVIDIA GPU here" >&2; exit 2; }
"$py" - <<'PY' || exit 2
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu-check: torch {torch.__version__} sees no GPU")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(0)}")
PY
# The native copy+CRC loop of the transfer path, built where it is not yet (optional: a Python
# fallback is used where it cannot be).
build_log="$("$py" setup.py -q build_ext --inplace 2>&1)" || echo "$build_log"
"$py" -c 'from recovery.transfer.copy_digest import NATIVE_CRC32C as n; print("native copy+crc32c:", n is not None)'

step tests 150 "$py" -m pytest -p no:cacheprovider --confcutdir=tests/on_gpu tests/on_gpu -v -s
# The agent on the real GPU for a few rounds, its batches recorded (the server is absent: the
# agent spools, which is what it does when the server is down).
scratch="$(mktemp -d)"
mkdir -p "$scratch/run"
timeout --signal=TERM 8 "$py" -m agents --node gpu-check --token gpu-check \
    --server http://127.0.0.1:9 --interval 1 --run-dir "$scratch/run" --spool-dir "$scratch/spool" \
    --record "$out/agent-batches.jsonl" --log-level ERROR > "$out/agent.log" 2>&1
rm -rf "$scratch"
# Every batch carries the real GPUs' samples (none simulated).
"$py" - "$out/agent-batches.jsonl" <<'PY' || { echo "== agent: FAILED (see agent.log)"; status=1; }
import json, sys
batches = [json.loads(line) for line in open(sys.argv[1])]
assert batches, "no batch recorded"
for batch in batches:
    gpus = {s["labels"]["gpu"] for s in batch["samples"] if "gpu" in s["labels"]}
    assert gpus and not any("simulated" in s["labels"] for s in batch["samples"]), batch
models = {s["labels"]["model"] for b in batches for s in b["samples"] if s["name"] == "gpu_info"}
print(f"== agent: {len(batches)} batches of real GPU samples ({', '.join(sorted(models))})")
PY
step bench-gpu 120 "$py" benchmarks/gpu.py --size-mb 1024 --transfer-mb 1024
step bench-transfer 150 "$py" benchmarks/transfer.py --parts tcp,shm,ucx --repeat 5
step bench-checkpoint 100 "$py" benchmarks/checkpoint.py --restore-only --repeat 3
step bench-ingest 120 "$py" benchmarks/ingest.py
exit "$status"
