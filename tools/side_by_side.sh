#!/usr/bin/env bash
# Two builds of strata benchmarked side by side in one process tree, alternating, on the machine it runs on:
#   git archive --format=tar.gz -o before.tar.gz REF        # here: the tree to compare against
#   tools/side_by_side.sh before.tar.gz [--runs N] [--script FILE] [--keep DIR] [-- args]   # on the GPU box
# Each tree (the archive's and this checkout) is built as a wheel into a private folder (sm of this GPU, every
# core, with the test hooks that kernel benchmarks and tests import), then `strata bench ARGS` (or, with --script,
# `python3 FILE ARGS`, e.g. benchmarks/bench_batch.py) runs N times for each, before and after in turn, each
# importing its own build. Logs and JSON go to $OUT (or ./side-by-side-out); a line per run says its tok/s (a
# script's RESULT lines). The benchmark model is synthesized once into $STRATA_CACHE by the first run. With --keep
# DIR the builds stay in DIR, and a later call with the same DIR benchmarks them without building again (several
# scripts, one build).
set -uo pipefail
cd "$(dirname "$0")/.."
(($# >= 1)) || { echo "usage: tools/side_by_side.sh BEFORE.tar.gz [--runs N] [-- bench args]" >&2; exit 2; }
before=$(realpath "$1"); shift
runs=2
script=""
keep=""
while (($#)); do
  case "$1" in
    --runs) runs=$2; shift ;;
    --script) script=$(realpath "$2"); shift ;;
    --keep) keep=$2; shift ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
args=("$@")
((${#args[@]})) || [[ -n $script ]] || args=(--expert-cache 0 --mode token_graph --tokens 64 --prompt-tokens 16)
out=${OUT:-side-by-side-out}
mkdir -p "$out"
work=${keep:-$(mktemp -d)}
mkdir -p "$work"
source tools/carried-wheels.sh
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.')
export CUDAARCHS=${CUDAARCHS:-${cap:+${cap}-real}} CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
[[ -d $work/before-tree ]] || { mkdir -p "$work/before-tree" && tar xzf "$before" -C "$work/before-tree"; }
build() {  # tree name
  [[ -d $work/$2/strata ]] && return 0  # kept from an earlier call
  (cd "$1" && python3 -m pip install -q --no-build-isolation --no-deps --no-compile \
      --config-settings=cmake.define.STRATA_CHECKS=ON --target "$work/$2" .) \
    > "$out/build-$2.log" 2>&1 || { echo "building $2 failed (build-$2.log)"; tail -20 "$out/build-$2.log"; exit 1; }
}
build "$work/before-tree" before & first=$!
build "$PWD" after & second=$!
wait "$first" && wait "$second" || exit 1
name=${script:+$(basename "$script" .py)-}
for i in $(seq "$runs"); do
  for build in before after; do
    log=$out/$name$build-$i
    if [[ -n $script ]]; then
      STRATA_SRC=$work/$build PYTHONPATH=$PWD/tools/side_by_side${PYTHONPATH:+:$PYTHONPATH} \
        python3 "$script" "${args[@]}" --json "$log.json" > "$log.log" 2>&1
      echo "$build run $i: rc=$? $(grep -E '^RESULT' "$log.log" | tr '\n' ';')"
    else
      STRATA_SRC=$work/$build PYTHONPATH=$PWD/tools/side_by_side${PYTHONPATH:+:$PYTHONPATH} \
        python3 -m strata.cli bench "${args[@]}" --json "$log.json" > "$log.log" 2>&1
      echo "$build run $i: rc=$? $(grep -E '^(uncaptured|layer_graphs|token_graph) ' "$log.log" | tr -s ' ' | tr '\n' ';')"
    fi
  done
done
[[ -n $keep ]] || rm -rf "$work"
