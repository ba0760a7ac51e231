#!/usr/bin/env bash
# The GPU suite: the tests that need CUDA (tests/gpu and the CUDA tests of the CPU suite) and the GPU
# benchmarks, with a report in OUTDIR (default ./gpu-report, or $OUT on the device machine).
# On a machine without a CUDA GPU it prints why and exits 0: nothing to check there.
# Usage: bash scripts/gpu_check.sh [OUTDIR]   (OUTDIR/REPORT.md: each section's tail; OUTDIR/log.txt: all output)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-report}}"
reason=$(python3 -c 'import torch; print("" if torch.cuda.is_available() else "torch.cuda.is_available() is False (torch " + torch.__version__ + ")")' 2>&1)
if [ -n "$reason" ]; then
  echo "gpu_check: skipped: no CUDA GPU on this machine: $reason"
  exit 0
fi
mkdir -p "$out"
runs=$(mktemp -d)  # the examples' logdirs: checkpoints stay out of the report folder
report="$out/REPORT.md"
: >"$out/log.txt"
status=0
{
  echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  echo '```'
} >"$report"

section() {  # section TITLE SECONDS COMMAND...: run under a time limit, keep the output's tail in the report
  local title=$1 limit=$2; shift 2
  echo "== $title: $*"
  { echo; echo "## $title"; echo; echo "\`$*\`"; echo; echo '```'; } >>"$report"
  local start=$SECONDS part
  part=$(mktemp)
  timeout -k 10 "$limit" "$@" >"$part" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "gpu_check: stopped after its limit of ${limit} s" >>"$part"
  { echo "== $title: $*"; cat "$part"; } >>"$out/log.txt"  # every section's whole output, in order
  tail -n 40 "$part" | tee -a "$report"
  rm -f "$part"
  echo '```' >>"$report"
  echo "exit code $rc, $((SECONDS - start)) s" >>"$report"
  return $rc
}

# Measured on one H200 (2026-11-29): 250 s in all, 143 s of it test_resume_kill's runs (process starts are slow
# there); -v keeps each test's result in log.txt even when the section is stopped at its limit.
section "GPU tests" 420 python3 -m pytest -v -rs --timeout 240 --durations=15 tests/gpu tests/runner/test_amp.py \
  tests/runner/test_pipeline.py tests/metrics/test_base.py tests/runner/test_host_syncs.py \
  tests/runner/test_resume_kill.py || status=1
section "GPU benchmarks" 240 python3 scripts/bench/gpu.py --out "$out/benchmarks.md" || status=1
# This round's features on the GPU(s): rollback past bad batches (CUDA snapshots), FSDP2 and DDP on a
# transformer (NCCL, DCP checkpoints); TP and HSDP need 2+ GPUs (a mesh of one GPU per rank).
section "Rollback example" 120 python3 scripts/rollback_example.py "$runs/rollback" || status=1
section "Parallelism example, fsdp" 120 python3 scripts/parallelism_example.py "$runs/fsdp" fsdp || status=1
section "Parallelism example, ddp" 120 python3 scripts/parallelism_example.py "$runs/ddp" ddp || status=1
section "ResNet, fp32" 180 python3 scripts/bench/resnet.py --device cuda --batches 50 --batch-size 256 --repeats 5 \
  || status=1
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -ge 2 ]; then  # NCCL takes one GPU per rank: on one GPU these would fail or measure the CPU
  section "Parallelism example, tp" 180 python3 scripts/parallelism_example.py "$runs/tp" tp || status=1
  section "Parallelism example, hsdp" 180 python3 scripts/parallelism_example.py "$runs/hsdp" hsdp || status=1
  section "DDP scaling" 180 python3 scripts/bench/ddp_scaling.py || status=1
  section "FSDP memory" 180 python3 scripts/bench/fsdp_memory.py || status=1
fi
echo "gpu_check: report in $report (exit $status)"
exit $status
