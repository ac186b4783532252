#!/usr/bin/env bash
# Print the path of a kwok binary for `gpu-health-sim demo --kubeconfig` (the demo on a cluster you
# already have): $KUBEBUILDER_ASSETS/kwok, else the one `make testbin` built, else kwok alone built
# once from the Go module proxy (a few minutes; no Kubernetes build) into
# ~/.cache/gpu-health/kwok/<version>/. The version is testbin's pin (hack/testbin.sh KWOK_VERSION).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${KWOK_VERSION:-$(sed -n 's/^KWOK_VERSION="${KWOK_VERSION:-\(v[^}]*\)}"$/\1/p' "${root}/hack/testbin.sh")}"
[[ -n "${version}" ]] || { echo "kwok.sh: no KWOK_VERSION pin in hack/testbin.sh" >&2; exit 1; }
if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "${KUBEBUILDER_ASSETS}/kwok" ]]; then
  echo "${KUBEBUILDER_ASSETS}/kwok"; exit 0
fi
cache="${XDG_CACHE_HOME:-${HOME}/.cache}/gpu-health"
for built in "${GPUHEALTH_TESTBIN_CACHE:-${cache}/testbin}"/*_kwok-"${version}"_*/kwok; do
  [[ -x "${built}" ]] && { echo "${built}"; exit 0; }
done
binary="${cache}/kwok/${version}/kwok"
if [[ ! -x "${binary}" ]]; then
  command -v go >/dev/null || { echo "kwok.sh: Go is needed to build kwok once (https://go.dev/dl/), or set KWOK=/path/to/kwok" >&2; exit 2; }
  echo "kwok.sh: building kwok ${version} once (Go module proxy)" >&2
  scratch="$(mktemp -d)"
  trap 'rm -rf "${scratch}"' EXIT
  GOBIN="${scratch}" GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 \
    go install "sigs.k8s.io/kwok/cmd/kwok@${version}" >&2
  mkdir -p "$(dirname "${binary}")"
  mv "${scratch}/kwok" "${binary}"
fi
echo "${binary}"
