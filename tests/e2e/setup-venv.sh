#!/usr/bin/env bash
# Creates (once) a Python venv with the pinned MCP client used by the end-to-end tests.
# Usage: tests/e2e/setup-venv.sh DIR   — prints DIR/bin/python when ready.
set -euo pipefail
dir="$1"
here="$(cd "$(dirname "$0")" && pwd)"
stamp="$dir/.installed-$(sha256sum "$here/requirements.txt" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  python3 -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  touch "$stamp"
fi
echo "$dir/bin/python"
