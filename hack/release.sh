#!/usr/bin/env bash
# `make release VERSION=X.Y.Z`: one command from a clean checkout to every artefact of a release
# (docs/release.md). In order, each step refusing to go on after a failure:
#   1. version    hack/version.py set X.Y.Z, CHANGELOG's [Unreleased] becomes [X.Y.Z] - DATE,
#                 hack/version.py check; committed as "Release X.Y.Z" (skipped when HEAD is that commit:
#                 a failed release is rerun with the same VERSION)
#   2. Python     wheel and sdist (python -m build) into DIST
#   3. SBOM       DIST/gpu-health-X.Y.Z.cdx.json (CycloneDX 1.5, hack/sbom.py: the wheel's dependency
#                 closure as installed in the venv)
#   4. image      hack/build-image.sh for PLATFORMS (default linux/amd64,linux/arm64); with PUSH=1 pushed,
#                 its digest read back; SKIP_IMAGE=1 leaves the image to a machine that can build it
#   5. chart      hack/package-chart.sh into DIST, pinned to the pushed digest; CHART_REGISTRY=oci://...
#                 pushes it
#   6. tag        git tag -a vX.Y.Z on the release commit (only now: a failed step leaves no tag)
# It pushes nothing to git: `git push origin HEAD vX.Y.Z` is yours, after a look.
#
# Environment: VERSION (required), DATE (default: today, UTC), DIST (default dist/X.Y.Z), PY (the venv's
# python, default .venv/bin/python), HELM, IMAGE, PLATFORMS, PUSH, SKIP_IMAGE, CHART_REGISTRY.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
version="${VERSION:-}"
date="${DATE:-$(date -u +%Y-%m-%d)}"
py="${PY:-${root}/.venv/bin/python}"
dist="${DIST:-${root}/dist/${version}}"
platforms="${PLATFORMS-linux/amd64,linux/arm64}"
step() { echo "release ${version}: $*"; }
fail() { echo "release ${version}: $*" >&2; exit 2; }

[[ "${version}" =~ ^[0-9]+\.[0-9]+\.[0-9]+((a|b|rc)[0-9]+)?$ ]] \
  || fail "VERSION must be a release, X.Y.Z or X.Y.Z(a|b|rc)N, not '${version}' (make release VERSION=X.Y.Z)"
[[ -x "${py}" ]] || fail "no ${py}: run make venv first (the SBOM lists what it installed)"
git rev-parse -q --verify "refs/tags/v${version}" >/dev/null && fail "tag v${version} exists already"
[[ -z "$(git status --porcelain --untracked-files=no)" ]] || fail "the checkout has uncommitted changes"

# 1. version
if [[ "$(python3 hack/version.py)" == "${version}" && "$(git log -1 --format=%s)" == "Release ${version}" ]]; then
  step "HEAD is the release commit already; building from it"
else
  python3 hack/version.py set "${version}"
  python3 hack/version.py cut "${version}" "${date}"
  python3 hack/version.py check
  git add api/gpuhealth_api/__init__.py charts/gpu-health/Chart.yaml Dockerfile CHANGELOG.md
  git commit -q -m "Release ${version}" -m "Version ${version} in every place (hack/version.py); CHANGELOG section [${version}] - ${date}."
  step "committed $(git rev-parse --short HEAD) Release ${version}"
fi
python3 hack/version.py check >/dev/null

# 2. wheel and sdist
mkdir -p "${dist}"
"${py}" -m build --outdir "${dist}" . >"${dist}/build.log" 2>&1 || { tail -20 "${dist}/build.log" >&2; fail "python -m build failed"; }
wheel="${dist}/gpu_health-${version}-py3-none-any.whl"
sdist="${dist}/gpu_health-${version}.tar.gz"
[[ -f "${wheel}" && -f "${sdist}" ]] || fail "python -m build made no ${wheel} and ${sdist}"
step "built ${wheel} and ${sdist}"

# 3. SBOM
sbom="${dist}/gpu-health-${version}.cdx.json"
SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)" "${py}" hack/sbom.py "${wheel}" >"${sbom}"
step "SBOM ${sbom}"

# 4. image
digest=""
if [[ -n "${SKIP_IMAGE:-}" ]]; then
  step "SKIP_IMAGE set: no image (build it with make image PLATFORMS=${platforms} PUSH=1, then make chart IMAGE_DIGEST=...)"
else
  VERSION="${version}" PLATFORMS="${platforms}" hack/build-image.sh | tee "${dist}/image.log"
  digest="$(sed -n 's/^pushed .* as .*@\(sha256:[a-f0-9]\{64\}\)$/\1/p' "${dist}/image.log" | tail -1)"
  [[ -z "${PUSH:-}" || -n "${digest}" ]] || fail "PUSH=1 but no digest in ${dist}/image.log"
fi

# 5. chart
HELM="${HELM:-$(hack/testbin.sh)/helm}" CHART_DIST="${dist}" IMAGE_DIGEST="${digest}" \
  CHART_REGISTRY="${CHART_REGISTRY:-}" hack/package-chart.sh

# 6. tag
git tag -a "v${version}" -m "gpu-health ${version}${digest:+ (image ${digest})}"
step "tagged v${version}; artefacts in ${dist}:"
(cd "${dist}" && ls -1 ./*.whl ./*.tar.gz ./*.cdx.json ./*.tgz | sed 's/^/  /')
echo "next: git push origin HEAD v${version}; then set the next development version (hack/version.py set X.Y.Z.dev0)"
