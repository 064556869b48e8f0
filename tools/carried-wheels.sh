# Sourced by the GPU box scripts (gpu-check.sh, sanitize.sh) from the repository root: the pure-Python wheels the
# box lacks travel in ./.whl (CONTRIBUTING.md) and go into a private folder on the import path, never into the
# box's own site-packages.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/strata-site \
      .whl/*.whl \
    || { echo "installing the carried wheels failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/strata-site${PYTHONPATH:+:$PYTHONPATH}
fi
