#!/usr/bin/env bash
# Install llama-cpp-python (the `llamacpp` extra, the llama.cpp backend) into ./.venv, built
# from its sdist once with a portable CPU configuration and kept in a wheelhouse.
#   bash scripts/install_llamacpp.sh          # scripts/install.sh test / llamacpp call this
#   bash scripts/install_llamacpp.sh --if-cached   # only where the wheelhouse has the wheel
#                                                  # (no build; scripts/quickstart.sh)
#
# The wheel is looked up in $NEST_WHEELHOUSE (default ~/.cache/nest-integrations/wheels), one
# folder per CPU level, and installed from there (seconds). Without one the sdist is built
# (cold: 6.4 min on 2 cores of an Intel Xeon, docs/backends.md) and put there; later runs, and
# other checkouts on the machine, reuse it. pip's own wheel cache is bypassed on purpose: it keys
# a built wheel by the sdist alone, so a wheel built with other flags (llama-cpp-python's default
# is -march=native) would be reused silently.
#
# Levels (LLAMA_CPP_LEVEL overrides the one detected from /proc/cpuinfo):
#   avx512  AVX2 + AVX512 F/BW/DQ/VL + VBMI + VNNI + BF16  (Intel Ice Lake+/Sapphire Rapids, AMD Zen 4+)
#   avx2    AVX2 + FMA + F16C + BMI2                        (Intel Haswell+, AMD Zen 1+)
#   generic no explicit instruction sets (llama.cpp's portable baseline)
# Never GGML_NATIVE=ON: on a CPU that lists AMX without the kernel granting it (these VMs),
# -march=native builds AMX kernels that die with SIGILL.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${LLAMA_CPP_VERSION:-0.3.36}"
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { for f in "$@"; do case "$flags" in *" $f "*) ;; *) return 1 ;; esac; done; }
level="${LLAMA_CPP_LEVEL:-}"
if [ -z "$level" ]; then
  if has avx2 fma f16c bmi2 avx512f avx512bw avx512dq avx512vl avx512vbmi avx512_vnni avx512_bf16; then
    level=avx512
  elif has avx2 fma f16c bmi2; then
    level=avx2
  else
    level=generic
  fi
fi
base="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
base="$base -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF"
avx2="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
case "$level" in
  avx512) isa="$avx2 -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" ;;
  avx2) isa="$avx2" ;;
  generic) isa="" ;;
  *) echo "LLAMA_CPP_LEVEL must be avx512, avx2 or generic, not '$level'" >&2; exit 2 ;;
esac
wheels="${NEST_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/nest-integrations/wheels}/llama-cpp-python-$level"
pip=".venv/bin/python -m pip"
if [ "${1:-}" = "--if-cached" ] && ! ls "$wheels"/llama_cpp_python-"$version"-*.whl >/dev/null 2>&1; then
  exit 0  # no wheel for this CPU level yet: no build, the torch backend serves
fi
if ! ls "$wheels"/llama_cpp_python-"$version"-*.whl >/dev/null 2>&1; then
  mkdir -p "$wheels"
  echo "building llama-cpp-python $version for $level CPUs, once (about 6-7 min on 2 cores)" >&2
  start=$(date +%s)
  CMAKE_ARGS="$base $isa" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    $pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$wheels" \
    "llama-cpp-python==$version"
  echo "built in $(( $(date +%s) - start )) s into $wheels" >&2
fi
# The wheel from the wheelhouse (never a build), its dependencies from the index.
$pip install -q --find-links "$wheels" --only-binary llama-cpp-python "llama-cpp-python==$version"
