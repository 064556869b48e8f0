#!/usr/bin/env bash
# compute-sanitizer over the GPU tests, on the GPU box after a build (tools/gpu-check.sh --gpu-only --no-bench):
#   tools/sanitize.sh [--timeout SECONDS] [--tools memcheck,racecheck,synccheck] OUTDIR [TEST_FILE...] [-- ARGS]
# One `pytest -m gpu` run per tool and test file, so that a hang or a crash costs one file, each cut off after
# --timeout seconds (default 300): memcheck reports out-of-bounds, misaligned and freed-memory accesses and failing
# CUDA calls, racecheck shared-memory races, synccheck barriers that not every thread of a block reaches. TEST_FILEs
# default to every file holding a GPU test; ARGS after `--` go to compute-sanitizer (e.g. --print-limit 20).
# Logs: OUTDIR/TOOL/AREA-FILE.log, the sanitizer's report and pytest's output together. One SANITIZE line per (tool,
# file), again all together last: the errors the sanitizer counted (its ERROR or RACECHECK SUMMARY), pytest's
# tally and pass, fail (a test failed or the sanitizer reported an error), timeout, or none (no GPU test ran).
# Exit status 1 if any failed or timed out.
# The sanitizer slows kernels 10-100x, so a test that fails with 0 errors may have run into one of its own waits'
# timeouts: its log says which. compute-sanitizer is $COMPUTE_SANITIZER, else the one on PATH, else the CUDA
# toolkit's ($CUDA_HOME, $CUDA_PATH, nvcc's toolkit, /usr/local/cuda*).
set -uo pipefail
cd "$(dirname "$0")/.."
timeout_s=300; tools=memcheck,racecheck,synccheck; out=; files=(); sanitizer_args=()
while (($#)); do
  case "$1" in
    --timeout) timeout_s=${2-}; shift ;;
    --tools) tools=${2-}; shift ;;
    --) shift; sanitizer_args=("$@"); break ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) if [[ -z $out ]]; then out=$1; else files+=("$1"); fi ;;
  esac
  shift
done
[[ -n $out ]] || { echo "usage: $(sed -n 3p "$0" | cut -c5-)" >&2; exit 2; }
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || { echo "--timeout takes whole seconds > 0, got '$timeout_s'" >&2; exit 2; }
for tool in ${tools//,/ }; do
  [[ $tool =~ ^(memcheck|racecheck|synccheck)$ ]] \
    || { echo "--tools: no tool '$tool' (memcheck, racecheck, synccheck)" >&2; exit 2; }
done

find_sanitizer() {
  local root candidate nvcc roots=("${CUDA_HOME:-}" "${CUDA_PATH:-}")
  for candidate in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer)"; do
    [[ -n $candidate && -x $candidate ]] && { echo "$candidate"; return 0; }
  done
  nvcc=$(command -v nvcc) && roots+=("$(dirname "$(dirname "$(readlink -f "$nvcc")")")")
  roots+=(/usr/local/cuda /usr/local/cuda-*)
  for root in "${roots[@]}"; do
    for candidate in "$root/bin/compute-sanitizer" "$root/compute-sanitizer/compute-sanitizer"; do
      [[ -n $root && -x $candidate ]] && { echo "$candidate"; return 0; }
    done
  done
  return 1
}
sanitizer=$(find_sanitizer) || { echo "compute-sanitizer not found: set COMPUTE_SANITIZER or CUDA_HOME" >&2; exit 1; }

source tools/carried-wheels.sh
python3 -c "import strata._native_check" 2>/dev/null \
  || { echo "strata is not built here with its test hooks: run tools/gpu-check.sh --gpu-only --no-bench" >&2; exit 1; }
if ((${#files[@]} == 0)); then
  mapfile -t files < <(python3 -m pytest --collect-only -q -p no:cacheprovider -m gpu tests 2>/dev/null \
                       | grep '::' | cut -d: -f1 | sort -u)
  ((${#files[@]})) || { echo "no GPU test collected (python3 -m pytest --collect-only -m gpu tests)" >&2; exit 1; }
fi
echo "sanitize: $("$sanitizer" --version | tail -n 1); tools $tools; ${#files[@]} test files; ${timeout_s} s each"

summary=()
for tool in ${tools//,/ }; do
  mkdir -p "$out/$tool"
  for file in "${files[@]}"; do
    name=${file#tests/}; name=${name%.py}; name=${name//\//-}  # tests/kernels/test_x.py: kernels-test_x
    log="$out/$tool/$name.log"
    # timeout signals its whole process group: the sanitizer and the pytest it runs
    timeout --kill-after=30 "$timeout_s" "$sanitizer" --tool "$tool" --target-processes all "${sanitizer_args[@]}" \
      python3 -m pytest -q -p no:cacheprovider -m gpu "$file" >"$log" 2>&1
    rc=$?
    # memcheck and synccheck end a process's report with "ERROR SUMMARY: N errors", racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"
    reports=$(grep -cE '(ERROR|RACECHECK) SUMMARY:' "$log")
    errors=$({ grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | grep -Eo '[0-9]+$'
               grep -Eo 'RACECHECK SUMMARY: .*\([0-9]+ error' "$log" | grep -Eo '\([0-9]+' | tr -d '('; } \
             | awk '{n += $1} END {print n + 0}')
    tally=$(grep -v '^=========' "$log" | grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected)' | tail -n 1 \
            | sed -E 's/^[= ]+|[= ]+$//g')
    if ((rc == 124 || rc == 137)); then
      verdict=timeout
    elif ((errors > 0)); then
      verdict=fail
    elif ((rc == 5)) || [[ $rc == 0 && $tally != *passed* ]]; then
      verdict=none
    elif ((rc == 0 && reports > 0)); then
      verdict=pass
    else
      verdict=fail
    fi
    line="$tool $name: $verdict, $errors errors in $reports sanitizer reports (${tally:-no pytest tally}; rc $rc)"
    echo "SANITIZE $line"
    summary+=("$line")
  done
done
echo
echo "================ SANITIZE SUMMARY (logs in $out) ================"
printf 'SANITIZE %s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -qE ': (fail|timeout),'
