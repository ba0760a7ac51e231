#!/usr/bin/env bash
# The GPU suite: the tests that need CUDA (tests/gpu and the CUDA tests of the CPU suite) and the GPU
# benchmarks, with a report in OUTDIR (default ./gpu-report, or $OUT on the device machine).
# On a machine without a CUDA GPU it prints why and exits 0: nothing to check there.
# Usage: bash scripts/gpu_check.sh [OUTDIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-report}}"
reason=$(python3 -c 'import torch; print("" if torch.cuda.is_available() else "torch.cuda.is_available() is False (torch " + torch.__version__ + ")")' 2>&1)
if [ -n "$reason" ]; then
  echo "gpu_check: skipped: no CUDA GPU on this machine: $reason"
  exit 0
fi
mkdir -p "$out"
report="$out/REPORT.md"
status=0
{
  echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  echo '```'
} >"$report"

section() {  # section TITLE COMMAND...: run, keep the output's tail in the report
  local title=$1; shift
  echo "== $title: $*"
  { echo; echo "## $title"; echo; echo "\`$*\`"; echo; echo '```'; } >>"$report"
  "$@" >"$out/log.txt" 2>&1
  local rc=$?
  tail -n 40 "$out/log.txt" | tee -a "$report"
  echo '```' >>"$report"
  echo "exit code $rc" >>"$report"
  return $rc
}

section "GPU tests" python3 -m pytest -q -rs tests/gpu tests/runner/test_amp.py tests/runner/test_pipeline.py \
  tests/metrics/test_base.py tests/runner/test_host_syncs.py tests/runner/test_resume_kill.py || status=1
section "GPU benchmarks" python3 scripts/bench/gpu.py --out "$out/benchmarks.md" || status=1
section "ResNet, fp32" python3 scripts/bench/resnet.py --device cuda --batches 50 --batch-size 256 --repeats 5 || status=1
section "DDP scaling" python3 scripts/bench/ddp_scaling.py || status=1
if [ -f scripts/bench/fsdp_memory.py ]; then
  section "FSDP memory" python3 scripts/bench/fsdp_memory.py || status=1
fi
echo "gpu_check: report in $report (exit $status)"
exit $status
