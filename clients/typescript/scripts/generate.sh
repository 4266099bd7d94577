#!/usr/bin/env bash
# Regenerates src/gen/ from the repo's proto/ with buf and the LOCAL protoc-gen-es from
# node_modules (versions pinned in package-lock.json); no remote plugins, no network but npm.
#
#   scripts/generate.sh           regenerate into src/gen/ (commit the result)
#   scripts/generate.sh DIR       generate into DIR/src/gen/ instead (used by check-generated.sh)
#
# BUF overrides the buf binary (default: the repo's .venv/bin/buf from PyPI `buf-bin`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
buf="${BUF:-$repo/.venv/bin/buf}"
cd "$here"

if [[ ! -x "$buf" ]]; then
  echo "generate.sh: buf not found at $buf (run 'make setup' in $repo, or set BUF)" >&2
  exit 2
fi
if [[ ! -x node_modules/.bin/protoc-gen-es ]]; then
  npm ci --no-audit --no-fund
fi

if [[ $# -ge 1 ]]; then
  "$buf" generate --template buf.gen.yaml --output "$1"
else
  "$buf" generate --template buf.gen.yaml
fi
