#!/usr/bin/env bash
# Install everything falsify needs on a fresh Debian machine into the project virtual
# environment .venv (idempotent; a second run with nothing changed takes about a second).
# - Python: the package in editable mode with the dev extras (docs, interop, third-party
#   kernels, build); torch is pinned (2.13.0) in pyproject.toml and installed from the CPU
#   index first, so no multi-GB CUDA wheel is pulled.
# - Never pip-installs into the system Python: Debian's is externally managed (PEP 668), and
#   a package installed there would fight apt. Everything goes into .venv.
# - Debian's chromium: the docs-site test renders pages headless; libseccomp2: the
#   evaluation sandbox.
# PYTHON selects the interpreter that creates .venv (default: python3 on PATH); TORCH_INDEX the
# index torch's CPU build comes from (default: PyTorch's; PyPI's Linux torch is the CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.falsify-installed"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

as_root_or_explain() {  # $1: apt package, $2: why
  if [ "$(id -u)" = 0 ]; then
    echo "install.sh: installing Debian's $1 ($2)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
  else
    echo "install.sh: $2, and this is not root: run 'sudo apt-get install -y $1', then re-run" >&2
    exit 2
  fi
}

if ! command -v chromium >/dev/null 2>&1; then
  as_root_or_explain chromium "chromium is missing (the docs-site test renders pages with it)"
fi

# `falsify eval`'s sandbox loads seccomp filters through libseccomp (falsify/llm/sandbox.py).
if ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; then
  as_root_or_explain libseccomp2 "libseccomp is missing (the evaluation sandbox needs it)"
fi

if [ ! -x "$VENV/bin/python" ]; then
  if ! command -v "$PY" >/dev/null 2>&1; then
    [ "$PY" = python3 ] || { echo "install.sh: PYTHON=$PY is not on PATH" >&2; exit 2; }
    as_root_or_explain python3 "there is no python3 on PATH"
  fi
  # Debian ships the venv module without ensurepip until python3-venv is installed.
  if ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    as_root_or_explain python3-venv "'$PY -m venv' cannot create environments (no ensurepip)"
  fi
  echo "install.sh: creating $VENV with $("$PY" -c 'import sys; print(sys.executable)')" >&2
  "$PY" -m venv "$VENV"
fi

# The interpreter pip installs into must be a virtual environment: refuse anything else
# (a .venv that is a link to, or a copy of, a system interpreter).
if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  managed=$("$VENV/bin/python" -c 'import sysconfig, pathlib
print(pathlib.Path(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED").exists())')
  echo "install.sh: $VENV/bin/python is not a virtual environment (externally managed:" \
       "$managed); refusing to pip-install into it. Remove $VENV and re-run." >&2
  exit 2
fi

# Optional, FALSIFY_LLAMA_CPP=1: llama.cpp's Python binding (the `llama-cpp` extra), which pip
# builds from source (~7 CPU-minutes; its wheel cache makes a second install instant).
llama_cpp_optional() {
  if [ "${FALSIFY_LLAMA_CPP:-0}" = 1 ] && ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    pin=$(grep -o '"llama-cpp-python==[^"]*"' pyproject.toml | tr -d '"')
    echo "install.sh: building $pin (FALSIFY_LLAMA_CPP=1)" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$pin"
  fi
}

# Fast path: nothing to do when this pyproject.toml was installed into this interpreter.
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $("$VENV/bin/python" -c 'import sys; print(sys.version)')"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/falsify" ]; then
  llama_cpp_optional
  exit 0
fi
if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  # the pinned version, from the CPU index too (its 2.13.0+cpu sorts above PyPI's 2.13.0)
  torch_pin=$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')
  extra=(--extra-index-url "$TORCH_INDEX")
  if ! "$VENV/bin/python" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)' "$TORCH_INDEX" \
      >/dev/null 2>&1; then
    # offline mirrors and wheelhouses: pip's own configuration has to provide the CPU build
    echo "install.sh: $TORCH_INDEX is unreachable: $torch_pin comes from pip's configured" \
         "indexes (set TORCH_INDEX to a reachable CPU index to choose)" >&2
    extra=()
  fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${extra[@]}" "$torch_pin"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]'
printf '%s' "$want" > "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
llama_cpp_optional
echo "install.sh: falsify installed in $VENV (run .venv/bin/falsify, .venv/bin/pv)" >&2
