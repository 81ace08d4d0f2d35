#!/usr/bin/env bash
# Creates (once) a Python venv with the pinned MCP client used by the end-to-end tests.
# Usage: tests/e2e/setup-venv.sh DIR   — prints DIR/bin/python when ready.
set -euo pipefail
dir="$1"
here="$(cd "$(dirname "$0")" && pwd)"
stamp="$dir/.installed-$(sha256sum "$here/requirements.txt" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  # The pinned packages need Python 3.11 or newer (httpx2, starlette, uvicorn and others of these versions).
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    { echo "the end-to-end tests need Python 3.11 or newer: $(python3 --version)" >&2; exit 1; }
  python3 -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  touch "$stamp"
fi
echo "$dir/bin/python"
