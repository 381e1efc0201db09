#!/usr/bin/env bash
# Install with the test extras, then run the test suite (CI runs exactly this).
#   bash scripts/test.sh                 # everything, on 2 pytest-xdist workers (plus the install)
#   NEST_TEST_WORKERS=0 bash scripts/test.sh   # in one process (about twice as long on 2 cores)
#   bash scripts/test.sh -m "not slow"   # the quick subset: no real-model end-to-end tests
#   CI=true bash scripts/test.sh -q      # as .ci/run: a skip outside tests/allowed_skips.txt fails
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
# The definition family of `benchmarks.answers` reads FOLDOC from Debian's dict-foldoc package
# (tests/benchmarks/test_answer_sets.py checks the real file): fetched once, where apt is.
foldoc=".nest/bench/answers"
if ! ls "$foldoc"/dict-foldoc_*.deb >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  mkdir -p "$foldoc"
  (cd "$foldoc" && { apt-get download -qq dict-foldoc 2>/dev/null \
     || { [ "$(id -u)" = 0 ] && apt-get update -qq && apt-get download -qq dict-foldoc; }; }) \
    >/dev/null 2>&1 || echo "test.sh: could not fetch dict-foldoc (its test will skip)" >&2
fi
# The tests keep their own home (./.nest, or $NEST_TEST_HOME; tests/conftest.py), whatever
# $NEST_HOME says: no test depends on the caller's home or cache.
export ANONYMIZED_TELEMETRY=False HF_HUB_OFFLINE=1
# Two workers by default (the tests use one torch thread each, so both cores work), one file at a
# time each, in the order of tests/_policy.py (longest first). An explicit -n/--numprocesses, or
# NEST_TEST_WORKERS=0, decides instead.
workers="${NEST_TEST_WORKERS:-2}"
for arg in "$@"; do
  case "$arg" in -n|-n*|--numprocesses*) workers="" ;; esac
done
if [ -n "$workers" ] && [ "$workers" != 0 ]; then
  set -- -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
fi
exec .venv/bin/python -m pytest "$@"
