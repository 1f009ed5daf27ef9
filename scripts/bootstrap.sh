#!/usr/bin/env bash
# Installs what flashcpp builds with, pinned, and is safe to repeat:
#   Debian: cmake, ninja, g++, GoogleTest, OpenBLAS, ccache (skipped when already present)
#   .deps/googletest: a copy of Debian's GoogleTest sources, to carry to the GPU machine
#   PyPI:   nvidia-cutlass==4.2.0.0, whose wheel ships the CUTLASS/CuTe headers; they are
#           unpacked into .deps/cutlass/include (git-ignored, never committed).
# The GPU machine has no registry: .deps/ is the self-contained folder to carry there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${FLASHCPP_DEPS_DIR:-$root/.deps}"
cutlass_version="4.2.0.0"

debian_packages=(cmake ninja-build g++ libgtest-dev libopenblas-dev ccache pkg-config)
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for pkg in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
fi
# Python with pip and venv (the CUTLASS download and the Python tests); a python3 that already
# has both, e.g. a pyenv one, is used as it is.
if ! { python3 -m pip --version && python3 -m venv --help; } >/dev/null 2>&1; then
  missing+=(python3 python3-pip python3-venv)
fi
if ((${#missing[@]})); then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

stamp="$deps/cutlass/VERSION"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$cutlass_version" ]]; then
  echo "bootstrap: fetching nvidia-cutlass==$cutlass_version headers from PyPI"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$cutlass_version"
  python3 - "$tmp" "$deps/cutlass" <<'PY'
import pathlib, shutil, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("nvidia_cutlass-*.whl"))
dest = pathlib.Path(sys.argv[2])
shutil.rmtree(dest, ignore_errors=True)
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = dest / "include" / name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
PY
  echo "$cutlass_version" > "$stamp"
fi
# GoogleTest sources from Debian's libgtest-dev, for machines without it (the GPU machine):
# the test CMake builds them with add_subdirectory when find_package(GTest) fails.
if [[ -d /usr/src/googletest && ! -f "$deps/googletest/CMakeLists.txt" ]]; then
  mkdir -p "$deps"
  cp -r /usr/src/googletest "$deps/googletest"
fi

echo "bootstrap: ready (CUTLASS $(cat "$stamp") in $deps/cutlass/include)"
