#!/usr/bin/env bash
# Installs (once) the pinned npm packages of the end-to-end tests: the TypeScript MCP client (tests/e2e/ts, the
# default), the MCP conformance suite with its Node 22 (tests/e2e/conformance), or the MCP Inspector with its
# Node 22 (tests/e2e/inspector).
# Usage: tests/e2e/setup-node.sh DIR [ts|conformance|inspector]   — prints DIR when ready (DIR/node_modules).
set -euo pipefail
dir="$1"
here="$(cd "$(dirname "$0")" && pwd)/${2:-ts}"
stamp="$dir/.installed-$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  mkdir -p "$dir"
  cp "$here/package.json" "$here/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  touch "$stamp"
fi
echo "$dir"
