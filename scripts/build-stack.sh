#!/usr/bin/env bash
# Build the pinned CPU test stack into .venv: torch 2.10.0 and torchvision 0.25.0 (the release's
# pins; PyPI's CUDA builds, which run on CPU), vLLM 0.23.0 (empty target), vllm-ascend 0.23.0.post1
# (pure Python), test tools, and both distributions of this repository (editable).
# Idempotent: a stamp file records a finished build; delete .venv to rebuild.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
STAMP=$VENV/.stack-ok
# What a built stack depends on: any change to these rebuilds it.
stack_inputs() {
  cat constraints.txt scripts/build-stack.sh setup.cfg setup.py loader/* \
    simulator/setup.cfg simulator/setup.py simulator/loader/*
}
PY=${PYTHON:-python3}
if [[ -f $STAMP ]] && cmp -s "$STAMP" <(stack_inputs); then
  exit 0
fi
t0=$(date +%s)
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
export PIP_CONSTRAINT=$ROOT/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK=1
# This machine's pip config names extra local indexes that may be absent; pip then warns once per
# package ("Location ... is ignored"). Drop those lines, keep everything else, keep pip's status.
pip() {
  "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
pip install -q torch==2.10.0
pip install -q 'setuptools>=77.0.3,<81' 'setuptools-scm>=8' 'setuptools-rust>=1.9' wheel 'packaging>=24.2' jinja2
if ! "$VENV/bin/python" -c 'import importlib.metadata as m; assert m.version("vllm")=="0.23.0"' 2>/dev/null; then
  # No cargo on PATH: vLLM's optional Rust frontend is skipped instead of fetching crates.
  NOCARGO_PATH=$(echo "$PATH" | tr ':' '\n' | grep -v -e cargo -e rustup | paste -sd:)
  PATH=$NOCARGO_PATH VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=0.23.0 \
    pip install -q --no-build-isolation --no-binary vllm vllm==0.23.0
fi
# xgrammar drags in a CUDA triton (~1 GB); vllm-ascend's CI removes it too.
pip uninstall -y -q triton >/dev/null 2>&1 || true
COMPILE_CUSTOM_KERNELS=0 SOC_VERSION=ascend910b1 \
  pip install -q --no-deps --no-build-isolation vllm-ascend==0.23.0.post1
pip install -q transformers==5.5.4 scipy pandas numba msgpack quart decorator pybind11 \
  torchvision==0.25.0 pytest pytest-mock pytest-timeout ruff
pip uninstall -y -q triton >/dev/null 2>&1 || true
# compat mode: a plain path entry instead of an import finder (~8 ms less per process).
pip install -q --no-build-isolation --no-deps --config-settings editable_mode=compat \
  -e . -e simulator
pip install -q 'wrapt>=2.4,!=2.2.0,<3' tqdm matplotlib
stack_inputs > "$STAMP"
echo "stack built in $(( $(date +%s) - t0 )) s"
