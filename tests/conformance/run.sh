#!/usr/bin/env bash
# Runs the differential conformance suite: upstream agents@0.32.0 (local workerd) vs this server.
# Installs the oracle first (npm ci from tests/conformance/oracle/package-lock.json) when needed.
#   tests/conformance/run.sh                      # everything (~3-4 min on 2 cores)
#   tests/conformance/run.sh -k random            # pytest arguments pass through
#   CONFORMANCE_SEEDS=1-100 CONFORMANCE_STEPS=60 tests/conformance/run.sh -k random
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bash "$here/oracle/ensure.sh"
py="$root/.venv/bin/python"
[ -x "$py" ] || py="$(command -v python3)"
cd "$root"
exec "$py" -m pytest tests/conformance "$@"
