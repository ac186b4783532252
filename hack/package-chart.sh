#!/usr/bin/env bash
# Package the Helm chart (`make chart`): dist/gpu-health-<version>.tgz, an
# archive `helm install` and `helm push` take; with CHART_REGISTRY=oci://...
# also push it there (Helm's OCI support: `helm install oci://.../gpu-health
# --version <version>`).
#
# Environment:
#   HELM            the helm binary (make passes the testbin one)
#   CHART_DIST      output directory (default dist/, git-ignored)
#   IMAGE_DIGEST    sha256:<64 hex>: package a copy of the chart whose
#                   values.yaml sets image.digest to it, so the released chart
#                   runs the pushed (multi-arch) image by digest; the
#                   checkout's values.yaml is not changed
#   CHART_REGISTRY  oci://<registry>/<path>: `helm push` the package there
#                   (log in first: `helm registry login <registry>`)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
helm="${HELM:-helm}"
dist="${CHART_DIST:-${root}/dist}"
chart="${root}/charts/gpu-health"
digest="${IMAGE_DIGEST:-}"
registry="${CHART_REGISTRY:-}"

# Refuse bad input before anything is written.
if [[ -n "${digest}" && ! "${digest}" =~ ^sha256:[a-f0-9]{64}$ ]]; then
  echo "IMAGE_DIGEST must be sha256: and 64 lower-case hex digits (the pushed manifest list's digest), not '${digest}'" >&2
  exit 2
fi
if [[ -n "${registry}" && "${registry}" != oci://* ]]; then
  echo "CHART_REGISTRY must be an OCI reference, oci://<registry>/<path>, not '${registry}'" >&2
  exit 2
fi

# The chart ships its own copy of crds/: never package a drifted one.
"${root}/hack/sync-chart-crds.sh" --check

scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT
if [[ -n "${digest}" ]]; then
  # A copy with image.digest set: the one line `  digest: ""` of the image block.
  cp -a "${chart}" "${scratch}/gpu-health"
  chart="${scratch}/gpu-health"
  values="${chart}/values.yaml"
  [[ "$(grep -c '^  digest: ""$' "${values}")" == 1 ]] \
    || { echo "values.yaml must hold exactly one line '  digest: \"\"' (image.digest) to pin" >&2; exit 1; }
  # (no sed -i: BSD sed, on a Mac, wants another spelling of it)
  sed "s/^  digest: \"\"\$/  digest: \"${digest}\"/" "${values}" >"${scratch}/values.yaml"
  mv "${scratch}/values.yaml" "${values}"
fi

mkdir -p "${dist}"
# Into the scratch directory first: a failed package leaves nothing in dist/.
"${helm}" package "${chart}" --destination "${scratch}/out" >/dev/null
package="$(ls "${scratch}"/out/*.tgz)"
"${helm}" lint --strict "${package}" >/dev/null \
  || { "${helm}" lint --strict "${package}" >&2; exit 1; }
mv "${package}" "${dist}/"
package="${dist}/$(basename "${package}")"
echo "chart: ${package}${digest:+ (image.digest ${digest})}"

if [[ -n "${registry}" ]]; then
  "${helm}" push "${package}" "${registry}"
fi
