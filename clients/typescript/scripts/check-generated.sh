#!/usr/bin/env bash
# Regenerates into a temporary directory and diffs against the committed src/gen/.
# Exit 0: up to date; exit 1: drift (run scripts/generate.sh and commit); other: error.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$here/scripts/generate.sh" "$tmp"

if ! diff -rq "$here/src/gen" "$tmp/src/gen" >/dev/null; then
  # The descriptor is one long base64 line: show which files differ and a short diff.
  diff -rq "$here/src/gen" "$tmp/src/gen" >&2 || true
  diff -ru "$here/src/gen" "$tmp/src/gen" | cut -c1-200 | head -n 80 >&2 || true
  echo "check-generated: clients/typescript/src/gen is out of date; run clients/typescript/scripts/generate.sh" >&2
  exit 1
fi
echo "check-generated: clients/typescript/src/gen is up to date"
