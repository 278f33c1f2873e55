#!/usr/bin/env bash
# Install what the test suite needs and run all of it (README command 2; .ci/run calls this).
#   system packages (Debian): slurm-wlm + munge (real local Slurm), fio (storage bench), shellcheck (node scripts),
#   squashfs-tools (the training image's .sqsh checks), chromium (headless: the HTML run report's screenshot test)
#   Python: .venv with torch==2.13.0 (CPU wheel) and clustertrain[test]
#   Megatron-LM's source (on no registry): $CLUSTERTRAIN_MEGATRON_LM_TARBALL, else ../shared/third_party/
#   megatron-lm-core_v0.16.1.tar.gz; without it the tests that need it skip (tests/support/megatron_lm.py)
# pytest: a per-test timeout (pytest-timeout, pyproject.toml), the 15 slowest tests, then one line
# "skipped N tests: ..." by reason (tests/conftest.py); the exit status is pytest's.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || [ -x /usr/sbin/munged ] || need+=(munge)
command -v fio >/dev/null || need+=(fio)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "== installing clustertrain[test] (torch==2.13.0)"
if ! .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 -e '.[test]' >.venv/pip-install.log 2>&1; then
  grep -v 'is ignored: it is neither' .venv/pip-install.log; exit 1
fi
.venv/bin/python -c "import torch, clustertrain, pytest_timeout
assert torch.__version__.startswith('2.13.0'), torch.__version__"

echo "== running the test suite"
exec .venv/bin/python -m pytest --durations=15 "$@"
