#!/usr/bin/env bash
# The main job on the embedded default: install, ingest the shipped sample corpus into an
# embedded Chroma store (with the token keys of every passage), then answer with citations.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export ANONYMIZED_TELEMETRY=False HF_HUB_OFFLINE=1
.venv/bin/nest ingest --sample
.venv/bin/nest info
.venv/bin/nest ask "${1:-How does the assert statement work in Python?}" --max-new-tokens "${2:-96}"
