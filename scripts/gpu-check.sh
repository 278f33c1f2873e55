#!/usr/bin/env bash
# One command for a machine with a GPU (issue 38): the GPU test layer (pytest -m gpu), then bench/mfu.py
# (trainer vs bare loop, the same data path on both sides, peak memory vs the planner, the async-save stall),
# then one section of figures -- device, driver, CUDA, torch -- written newest-first into docs/gpu.md.
#
#   scripts/gpu-check.sh                 # at most 9 minutes (tests 200 s, bench 330 s) on one H100/H200
#   GPU_CHECK_QUICK=1 scripts/gpu-check.sh   # the tests and a short bench (fewer steps, no checkpoint)
#
# Outputs land in $OUT (the device tool's folder) or a temp dir: gpu-tests.xml, mfu.json, mfu.log, tests.log and
# gpu-section.md (the section as added to docs/gpu.md). Exit status: the tests' (the bench's figures are reported
# against their targets, never asserted: non-negotiable 3).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    py=.venv/bin/python
  else
    py=python3
  fi
fi
# a GPU image may lack this project's pure-Python dependencies: install the carried wheels, never the network
if ! "$py" -c 'import pydantic, yaml, pytest, typer, rich, jinja2, psutil' 2>/dev/null && [ -d .gpuwheels ]; then
  "$py" -m pip install -q --no-index --no-deps .gpuwheels/*.whl >"$out/pip.log" 2>&1 || true
fi
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "scripts/gpu-check.sh: torch sees no CUDA device here ($py); run it on a GPU machine" >&2
  exit 2
fi
started=$(date +%s)
echo "== GPU tests (pytest -m gpu) =="
timeout "${GPU_TESTS_TIMEOUT_S:-200}" "$py" -m pytest -m gpu -q -p no:cacheprovider \
  --junitxml "$out/gpu-tests.xml" tests/gpu 2>&1 | tee "$out/tests.log" | tail -25
tests_rc=${PIPESTATUS[0]}
echo "== bench/mfu.py =="
bench_args=(--steps 20 --warmup 8)
[ -n "${GPU_CHECK_QUICK:-}" ] && bench_args=(--steps 8 --warmup 5 --no-checkpoint)
timeout "${GPU_BENCH_TIMEOUT_S:-330}" "$py" bench/mfu.py "${bench_args[@]}" --dir "$out" --figures "$out/mfu.json" \
  2>&1 | tee "$out/mfu.log"
"$py" scripts/gpu_report.py --tests "$out/gpu-tests.xml" --mfu "$out/mfu.json" --bench-args "${bench_args[*]}" \
  --seconds $(( $(date +%s) - started )) --section "$out/gpu-section.md" --docs docs/gpu.md
cp docs/gpu.md "$out/gpu.md" 2>/dev/null || true
exit "$tests_rc"
