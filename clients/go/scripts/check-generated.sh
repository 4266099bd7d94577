#!/usr/bin/env bash
# Regenerates the Go stubs into a temporary directory and fails (exit 1) when the committed
# clients/go/gen differs from what the proto and the pinned plugins produce.
set -euo pipefail

GO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$GO_DIR/scripts/generate.sh" --out "$tmp"

if ! diff -ruN "$GO_DIR/gen" "$tmp/gen"; then
  echo "clients/go/gen is out of date: run clients/go/scripts/generate.sh" >&2
  exit 1
fi
echo "Go generated code is up to date"
