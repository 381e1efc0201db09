#!/usr/bin/env bash
# The main job on the embedded default: install, ingest the shipped sample corpus into an
# embedded Chroma store (with the token keys of every passage), then answer with citations.
#   bash scripts/quickstart.sh [--fast] [QUESTION [MAX_NEW_TOKENS]]
# --fast (or NEST_LLAMACPP=1) also installs the llama.cpp backend (the llamacpp extra: its wheel
# from the wheelhouse in seconds, else built once, about 6-7 min on 2 cores), which the default
# backend (auto) then runs where it is the faster exact engine (`nest info` says why). Without
# it the wheel is installed only when the wheelhouse already has it; NEST_LLAMACPP=0: never.
set -euo pipefail
cd "$(dirname "$0")/.."
fast="${NEST_LLAMACPP:-}"
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then fast=1; else args+=("$arg"); fi
done
set -- ${args[@]+"${args[@]}"}
case "$fast" in
  1) bash scripts/install.sh llamacpp ;;
  0) bash scripts/install.sh ;;
  *) bash scripts/install.sh && bash scripts/install_llamacpp.sh --if-cached ;;
esac
export ANONYMIZED_TELEMETRY=False HF_HUB_OFFLINE=1
.venv/bin/nest ingest --sample
.venv/bin/nest info
.venv/bin/nest ask "${1:-How does the assert statement work in Python?}" --max-new-tokens "${2:-96}"
