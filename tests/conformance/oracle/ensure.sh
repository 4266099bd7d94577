#!/usr/bin/env bash
# Installs the conformance oracle (agents@0.32.0 + wrangler/miniflare, pinned by package-lock.json)
# when node_modules is missing or older than the lock file. Needs Node >= 20 and npm.
# npm may warn that install scripts were not run (esbuild, workerd, sharp): the workerd binary
# ships inside its npm package and works without them.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node > /dev/null 2>&1; then
  echo "conformance oracle: node not found (need Node >= 20)" >&2
  exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
  echo "conformance oracle: Node >= 20 required, found $(node --version)" >&2
  exit 1
fi
stamp=node_modules/.conformance-installed
exec 9> .ensure.lock          # concurrent runs wait for one install
flock 9
if [ -f "$stamp" ] && [ "$stamp" -nt package-lock.json ] && [ -d node_modules/agents ] && [ -d node_modules/miniflare ]; then
  exit 0
fi
echo "conformance oracle: npm ci in $PWD" >&2
npm ci --no-audit --no-fund --loglevel=error >&2
test -f node_modules/agents/package.json
node -e 'const v=require("./node_modules/agents/package.json").version; if (v !== "0.32.0") { console.error("agents " + v + " installed, want 0.32.0"); process.exit(1); }'
touch "$stamp"
