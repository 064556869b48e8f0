#!/usr/bin/env bash
# Builds a wheel with pip, installs it into a fresh virtual environment, imports it, runs `strata doctor`,
# and checks what the extension exports, what it links and how big the wheel is. Run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_WHEEL_MIB=${MAX_WHEEL_MIB:-64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python -m pip wheel --no-deps -q -w "$work/dist" .
wheel=$(ls "$work"/dist/strata_moe-*.whl)
size_mib=$(( $(stat -c %s "$wheel") / 1048576 ))
echo "wheel: $(basename "$wheel") (${size_mib} MiB)"
if (( size_mib > MAX_WHEEL_MIB )); then
  echo "wheel is ${size_mib} MiB, over the ${MAX_WHEEL_MIB} MiB budget" >&2; exit 1
fi

# The test hooks (strata._native_check, strata_check, the binding sources: the .pyx, strata/libstrata/ and
# strata/binding/ with their check/ folders) are for development builds only.
hooks=$(python -m zipfile -l "$wheel" | awk '{print $1}' \
  | grep -E '_native_check|/check/|strata/(libstrata|binding)/|\.(pyx|pxd|pxi|hpp)$' || true)
if [[ -n "$hooks" ]]; then
  echo "the wheel holds test hooks or binding sources:" >&2; echo "$hooks" >&2; exit 1
fi

python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$wheel"
# Import from outside the source tree so the installed wheel, not the checkout, is what runs.
(cd "$work" && "$work/venv/bin/python" -c "import strata, strata._native; print('import: ok, devices:', strata.device_count())")
(cd "$work" && "$work/venv/bin/strata" doctor)

extension=$(find "$work/venv" -name '_native.cpython*.so' | head -n 1)
# Hidden visibility: the module's init function is the only symbol it exports.
exported=$(nm -D --defined-only --extern-only "$extension" | awk '{print $3}' | grep -v -E '^(PyInit__native|_init|_fini)$' || true)
if [[ -n "$exported" ]]; then
  echo "the extension exports symbols beyond PyInit__native:" >&2; echo "$exported" | head -20 >&2; exit 1
fi
# The CUDA runtime is linked statically and the driver is found at run time: neither is a NEEDED library.
needed=$(readelf -d "$extension" | grep NEEDED || true)
if grep -q -E 'libcuda\.so|libcudart' <<<"$needed"; then
  echo "the extension links the CUDA driver or runtime dynamically:" >&2; echo "$needed" >&2; exit 1
fi
# Nothing of the test hooks' library is linked in: none of its messages is in the extension.
for marker in "raise_error: unknown kind" "exchange needs n_layer" "expert_matvec" "wrote outside its output buffer"; do
  if grep -a -q -F "$marker" "$extension"; then
    echo "the extension carries the test hooks (found \"$marker\")" >&2; exit 1
  fi
done
echo "test hooks: none in the wheel"
echo "wheel check: ok"
