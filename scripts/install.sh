#!/usr/bin/env bash
# Install everything falsify needs on a fresh Debian machine (idempotent).
# - Python: the package in editable mode with docs and interop extras; torch is pinned to the
#   CPU build (2.13.0) in pyproject.toml, so no multi-GB CUDA wheel is pulled.
# - Debian's chromium: the docs-site test renders pages headless.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "install.sh: chromium is missing and this is not root: run 'sudo apt-get install -y chromium'" >&2
    exit 2
  fi
fi
python3 -m pip install -q --disable-pip-version-check -e '.[dev]'
