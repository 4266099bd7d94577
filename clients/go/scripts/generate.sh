#!/usr/bin/env bash
# Regenerates the Go stubs in clients/go/gen from the repo's proto/ module.
#
#   scripts/generate.sh            rewrite clients/go/gen
#   scripts/generate.sh --out DIR  generate into DIR/gen instead (used by check-generated.sh)
#
# The protoc plugins are pinned here and installed with `go install` into clients/go/.bin, so the
# output does not depend on whatever plugins happen to be on PATH. buf comes from the repo's
# virtualenv (PyPI buf-bin, installed by `make setup`); override with BUF=/path/to/buf.
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12      # google.golang.org/protobuf/cmd/protoc-gen-go
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2   # google.golang.org/grpc/cmd/protoc-gen-go-grpc

GO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_ROOT="$(cd "$GO_DIR/../.." && pwd)"
BUF="${BUF:-$REPO_ROOT/.venv/bin/buf}"
BIN="$GO_DIR/.bin"

out_base=""
if [[ "${1:-}" == "--out" ]]; then
  out_base="${2:?--out needs a directory}"
fi

if [[ ! -x "$BUF" ]]; then
  echo "buf not found at $BUF (run 'make setup' at the repo root, or set BUF=...)" >&2
  exit 1
fi

# Installs a plugin unless the pinned version is already in .bin.
install_plugin() {
  local name="$1" pkg="$2" version="$3"
  local have=""
  if [[ -x "$BIN/$name" ]]; then
    have="$("$BIN/$name" --version 2>/dev/null | awk '{print $2}')"
  fi
  if [[ "$have" != "$version" && "v$have" != "$version" ]]; then
    echo "installing $pkg@$version into $BIN" >&2
    GOBIN="$BIN" go install "$pkg@$version"
  fi
}

mkdir -p "$BIN"
install_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

cd "$GO_DIR"
if [[ -z "$out_base" ]]; then
  # Start clean so files for removed protos do not linger.
  rm -rf gen
  "$BUF" generate "$REPO_ROOT" --template buf.gen.yaml
  echo "generated $(find gen -name '*.go' | wc -l | tr -d ' ') files under clients/go/gen" >&2
else
  mkdir -p "$out_base"
  "$BUF" generate "$REPO_ROOT" --template buf.gen.yaml --output "$out_base"
fi
