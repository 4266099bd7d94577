#!/usr/bin/env bash
# Installs the pinned dependencies when missing (npm ci), then builds and runs every test against
# real servers. SESSIONS_SERVER_CMD overrides the server executable (default: the repo's
# .venv/bin/sessions-server).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ ! -d node_modules ]]; then
  npm ci --no-audit --no-fund
fi
npm test
