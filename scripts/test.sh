#!/usr/bin/env bash
# Install with the test extras, then run the test suite (CI runs exactly this).
#   bash scripts/test.sh                 # everything (about 8.5 min of tests on 2 CPU cores, 2.5 of them ingesting the sample corpus for tests/test_sample_questions.py; plus the install)
#   bash scripts/test.sh -m "not slow"   # the quick subset: no real-model end-to-end tests
#   CI=true bash scripts/test.sh -q      # as .ci/run: a skip outside tests/allowed_skips.txt fails
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
export NEST_HOME="${NEST_HOME:-$(pwd)/.nest}" ANONYMIZED_TELEMETRY=False HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
