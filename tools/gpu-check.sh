#!/usr/bin/env bash
# The GPU box recipe: from the repository root on a machine with a GPU and no network, build strata, run the
# GPU tests (then the rest of the suite), then every benchmark, in one call, and print a compact summary
# last. Pure-Python wheels the box lacks travel in ./.whl (see CONTRIBUTING.md).
#   tools/gpu-check.sh [--gpu-only] [--no-bench] [-- extra pytest args]
# Logs and benchmark JSON go to $OUT when it is set (the device tool's result folder), else ./gpu-check-out.
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

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/strata-site .whl/*.whl \
    || { echo "installing the carried wheels failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/strata-site${PYTHONPATH:+:$PYTHONPATH}
fi

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
