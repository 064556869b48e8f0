#!/usr/bin/env bash
# The GPU box recipe: from the repository root on a machine with a GPU and no network, build strata, run the
# GPU tests (then the rest of the suite), then every benchmark, in one call, and print a compact summary
# last. Pure-Python wheels the box lacks travel in ./.whl (see CONTRIBUTING.md).
#   tools/gpu-check.sh [--gpu-only] [--no-bench] [-- extra pytest args]
# Logs and benchmark JSON go to $OUT when it is set (the device tool's result folder), else ./gpu-check-out.
# The longer runs, each a call of its own after this script has built strata (see CONTRIBUTING.md):
#   python3 benchmarks/soak_decode.py --json "$OUT/soak.json"    # 10,000 tokens in one session: speed, memory, NaN
#   tools/sanitize.sh "$OUT/sanitize" [TEST_FILE...]             # compute-sanitizer over the GPU tests, file by file
#   The side-by-side bench, every routed expert on the CPU: the default benchmark model (qwen4exp, 16 layers) and
#   the full 48-layer qwen3next geometry in the Q4_K_M expert mix (about 53 GB: synthesize it once, where it fits)
#   python3 -m strata.cli bench --expert-cache 0 --json "$OUT/bench-qwen4exp.json"
#   python3 -m strata.cli synth Q3N.gguf --arch qwen3next --preset full --experts-type q4_k --expert-down-type q6_k
#   python3 -m strata.cli bench Q3N.gguf --expert-cache 0 --json "$OUT/bench-qwen3next-full.json"
set -uo pipefail
cd "$(dirname "$0")/.."
gpu_only=0; bench=1; pytest_extra=()
while (($#)); do
  case "$1" in
    --gpu-only) gpu_only=1 ;;
    --no-bench) bench=0 ;;
    --) shift; pytest_extra=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
out=${OUT:-gpu-check-out}
mkdir -p "$out"
summary=()
stamp() { date +%s; }

source tools/carried-wheels.sh

# Build for this GPU only, with every core.
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.')
export CUDAARCHS=${CUDAARCHS:-${cap:+${cap}-real}}
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
t0=$(stamp)
if ! python3 -m pip install -q --no-build-isolation --no-deps -e . >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"; echo "SUMMARY build: FAILED"; exit 1
fi
summary+=("build: ok in $(( $(stamp) - t0 )) s (CUDAARCHS=${CUDAARCHS:-default})")

run_pytest() {  # name, pytest args...
  local name=$1; shift
  python3 -m pytest -q -p no:cacheprovider "$@" "${pytest_extra[@]}" 2>&1 | tee "$out/pytest-$name.log"
  summary+=("pytest $name: $(grep -E '(passed|failed|error)' "$out/pytest-$name.log" | tail -n 1)")
}
run_pytest gpu -m gpu
((gpu_only)) || run_pytest rest -m "not gpu"

if ((bench)); then
  for script in benchmarks/bench_*.py; do
    [[ -e $script ]] || continue
    name=$(basename "$script" .py)
    if python3 "$script" --json "$out/$name.json" 2>&1 | tee "$out/$name.log"; then
      summary+=("$name: $(grep -E '^RESULT' "$out/$name.log" | tr '\n' ';' | cut -c1-400)")
    else
      summary+=("$name: FAILED (see $name.log)")
    fi
  done
fi

python3 -m strata.cli doctor | tee "$out/doctor.log" >/dev/null
echo
echo "================ SUMMARY ================"
printf 'SUMMARY %s\n' "${summary[@]}"
grep -E '^(GPU|self-test)' "$out/doctor.log" | sed 's/^/SUMMARY doctor: /'
