#!/usr/bin/env bash
# Runs the Go client's tests against a real sessions-server that the tests start themselves
# (the repo's .venv/bin/sessions-server, or $SESSIONS_SERVER_CMD). Extra args go to `go test`.
set -euo pipefail

GO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$GO_DIR"
unformatted="$(gofmt -l sessions internal cmd)"
if [[ -n "$unformatted" ]]; then
  echo "gofmt needed:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
# -count=1: the tests call a Python server that Go's test cache knows nothing about, so a cached
# "ok" could hide a change on the server side.
go test -count=1 "$@" ./...
