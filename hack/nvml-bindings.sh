#!/usr/bin/env bash
# Run the NVML-path tests (real pynvml over the simulated NVML library) with the oldest nvidia-ml-py the
# project allows and the newest on the registry (or the versions given), each shadowing the venv's copy.
#
#   hack/nvml-bindings.sh                       oldest allowed (pyproject.toml) and newest on PyPI
#   hack/nvml-bindings.sh 12.550.89 13.580.82   these versions
#
# pynvml is one module (pynvml.py), so each version is installed alone (--no-deps) into a cache folder
# and put first on PYTHONPATH; the tests' subprocesses inherit it. Needs the venv (make venv).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"
py="$venv/bin/python"
[[ -x "$py" ]] || { echo "nvml-bindings: no $py (make venv)" >&2; exit 1; }
OLDEST="${NVML_PY_OLDEST:-12.535.77}"  # the first release the pin nvidia-ml-py>=12.535 admits
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-health/nvidia-ml-py"
TESTS=(tests/unit/agent/test_simnvml.py tests/unit/agent/test_simnvml_profiles.py
       tests/unit/agent/test_simnvml_scenarios.py tests/unit/agent/test_probe.py)

versions=("$@")
if [[ ${#versions[@]} -eq 0 ]]; then
  newest="$("$venv/bin/pip" index versions nvidia-ml-py 2>/dev/null | sed -n 's/^nvidia-ml-py (\(.*\))$/\1/p')"
  [[ -n "$newest" ]] || { echo "nvml-bindings: cannot ask PyPI for nvidia-ml-py's newest version" >&2; exit 1; }
  versions=("$OLDEST" "$newest")
fi
grep -q '"nvidia-ml-py>=12.535,<14"' "$root/pyproject.toml" \
  || echo "nvml-bindings: warning: pyproject.toml's nvidia-ml-py pin changed; check NVML_PY_OLDEST ($OLDEST)" >&2

failed=()
for version in "${versions[@]}"; do
  target="$CACHE/$version"
  if [[ ! -f "$target/pynvml.py" ]]; then
    "$venv/bin/pip" install --quiet --no-deps --target "$target" "nvidia-ml-py==$version"
  fi
  got="$(PYTHONPATH="$target" "$py" -c 'import pynvml, importlib.metadata as m; print(pynvml.__file__)')"
  echo "nvml-bindings: nvidia-ml-py $version ($got)" >&2
  if ! (cd "$root" && PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/pytest" -q -p no:cacheprovider "${TESTS[@]}"); then
    failed+=("$version")
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "nvml-bindings: failed with nvidia-ml-py ${failed[*]}" >&2
  exit 1
fi
echo "nvml-bindings: passed with nvidia-ml-py ${versions[*]}" >&2
