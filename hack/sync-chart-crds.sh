#!/usr/bin/env bash
# Copy the CRDs (source of truth: crds/) into the Helm chart, byte for byte.
#
#   hack/sync-chart-crds.sh          copy crds/*.yaml to charts/gpu-health/crds/
#   hack/sync-chart-crds.sh --check  exit 1 if the chart's copy has drifted
#
# Helm installs files in a chart's crds/ before any template and never
# upgrades or deletes them, so the chart must ship exactly what crds/ holds;
# tests/test_layout.py fails on drift.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="${root}/crds"
dst="${root}/charts/gpu-health/crds"

shopt -s nullglob
sources=("${src}"/*.yaml)
if [[ ${#sources[@]} -eq 0 ]]; then
  echo "no CRDs in ${src}" >&2
  exit 1
fi

if [[ "${1:-}" == "--check" ]]; then
  if diff -r --exclude='.*' "${src}" "${dst}" >/dev/null 2>&1; then
    echo "chart CRDs match crds/"
    exit 0
  fi
  echo "charts/gpu-health/crds/ differs from crds/: run hack/sync-chart-crds.sh" >&2
  diff -r --exclude='.*' "${src}" "${dst}" >&2 || true
  exit 1
fi

mkdir -p "${dst}"
# Remove copies of CRDs that no longer exist in the source.
for f in "${dst}"/*.yaml; do
  [[ -e "${src}/$(basename "${f}")" ]] || rm -f -- "${f}"
done
cp -- "${sources[@]}" "${dst}/"
echo "copied ${#sources[@]} CRD(s) to ${dst#"${root}"/}"
