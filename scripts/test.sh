#!/usr/bin/env bash
# Install with the test extras, then run the test suite (CI runs exactly this).
#   bash scripts/test.sh                 # everything (about 4 min of tests, 5-6 min with the install, on 2 CPU cores)
#   bash scripts/test.sh -m "not slow"   # the quick subset: no real-model end-to-end tests
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
export NEST_HOME="${NEST_HOME:-$(pwd)/.nest}" ANONYMIZED_TELEMETRY=False HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
