#!/usr/bin/env bash
# strata built HERE for the GPU box's Python and staged for a device call's `carry`, so that the call spends none of
# the box's scarce time building (a build there takes 60-100 s of every call that needs one):
#   tools/box_build.sh [--python PY] [--source TREE] [--build DIR] OUT
#   then, on the box:  STRATA_SRC=$PWD/OUT PYTHONPATH=$PWD/tools/side_by_side python3 -m pytest -m gpu tests/...
# PY is an interpreter of the box's Python version (3.12) with numpy, Cython and scikit-build-core; TREE the
# source tree (default: this checkout; a `git archive` unpacked elsewhere builds another ref, for side-by-side
# runs); DIR the build folder (default: build/box-<python version>, ignored; kept, so a later call only rebuilds
# what changed). OUT gets the package as the box imports it: TREE's src/strata and the two extension modules
# (production and test hooks), stripped. Put OUT under an ignored folder of the checkout (.box/NAME, say) and name
# that folder in `carry`: two builds fit the call's 64 MiB beside the tree. sm_90 only, as the box is.
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3.12
source_tree=$PWD
build=""
while (($#)); do
  case "$1" in
    --python) python=$2; shift ;;
    --source) source_tree=$(realpath "$2"); shift ;;
    --build) build=$2; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
(($# == 1)) || { echo "usage: tools/box_build.sh [--python PY] [--source TREE] [--build DIR] OUT" >&2; exit 2; }
out=$1
version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
build=$(realpath -m "${build:-build/box-$version}")
if [[ ! -f $build/build.ninja ]]; then
  cmake -S "$source_tree" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real \
    -DSTRATA_CHECKS=ON -DPython_EXECUTABLE="$(command -v "$python")" > "$build.configure.log" 2>&1 \
    || { tail -20 "$build.configure.log"; exit 1; }
fi
ninja -C "$build" -j"$(nproc)"
tag=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
modules=("$build/_native$tag" "$build/_native_check$tag")
for module in "${modules[@]}"; do
  [[ -f $module ]] || { echo "the build made no $module" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out"
cp -a "$source_tree/src/strata" "$out/strata"
find "$out/strata" -name '*.so' -delete
find "$out/strata" -name '__pycache__' -prune -exec rm -rf {} +
cp "${modules[@]}" "$out/strata/"
strip --strip-unneeded "$out"/strata/*.so
echo "staged $(du -sh "$out" | cut -f1) in $out (Python $version, sm_90): carry its folder, STRATA_SRC=\$PWD/$out there"
