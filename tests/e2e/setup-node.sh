#!/usr/bin/env bash
# Installs (once) the pinned TypeScript MCP client used by the end-to-end tests (tests/e2e/ts/package-lock.json).
# Usage: tests/e2e/setup-node.sh DIR   — prints DIR when ready (DIR/node_modules holds the SDK).
set -euo pipefail
dir="$1"
here="$(cd "$(dirname "$0")" && pwd)/ts"
stamp="$dir/.installed-$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  mkdir -p "$dir"
  cp "$here/package.json" "$here/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  touch "$stamp"
fi
echo "$dir"
