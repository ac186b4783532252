#!/usr/bin/env bash
# Build the local control-plane binaries once, from Go modules, into a cache
# outside the checkout keyed by their versions. Prints the directory on stdout.
#
#   hack/testbin.sh            build (if needed) and print the directory
#   KUBEBUILDER_ASSETS=dir     use prebuilt binaries from dir instead
#
# Why build rather than download: the only reachable sources here are package
# registries, and the Go module proxy serves the exact upstream sources.
set -euo pipefail

KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)

log() { echo "testbin: $*" >&2; }
die() { echo "testbin: error: $*" >&2; exit 1; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for b in "${BINARIES[@]}"; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable '$b' (needs: ${BINARIES[*]}); unset it to build them with 'make testbin'"
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

CACHE_ROOT="${GPUHEALTH_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-health/testbin}"
OUT="$CACHE_ROOT/k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
complete() { for b in "${BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done; }
if complete; then echo "$OUT"; exit 0; fi

# One build at a time: a second caller (make -j, parallel checkouts) waits for the first.
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
if ! flock -n 9; then
  log "another build of the control-plane binaries is running; waiting for it"
  flock 9
fi
if complete; then echo "$OUT"; exit 0; fi

command -v go >/dev/null 2>&1 || die "Go is not installed. Install Go >= 1.25 (e.g. 'apt-get install golang' or https://go.dev/dl) or set KUBEBUILDER_ASSETS to a directory holding: ${BINARIES[*]}"

mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

# build MODULE_DIR MODULE@VERSION LDFLAGS PKG... : a throwaway main module that
# requires the upstream module, so its own replace directives do not apply.
build() {
  local dir="$WORK/$1" req="$2" ldflags="$3"; shift 3
  mkdir -p "$dir"
  (cd "$dir" && go mod init "gpuhealth.local/testbin/$1" >/dev/null 2>&1 && cat >>go.mod)
  (cd "$dir" && go get "$req" >/dev/null 2>"$dir/get.log") || { cat "$dir/get.log" >&2; die "could not fetch $req from the Go module proxy (GOPROXY=$(go env GOPROXY))"; }
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$OUT/" "$@") || die "building $* failed (see the compiler output above)"
}

if [[ ! -x "$OUT/kube-apiserver" || ! -x "$OUT/kube-controller-manager" || ! -x "$OUT/kube-scheduler" || ! -x "$OUT/kubectl" ]]; then
  log "building Kubernetes $KUBERNETES_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl); first time takes 15-30 min on 2 cores"
  # k8s.io/kubernetes points its staging modules at ./staging; map each to its published v0.x twin.
  gomod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@$KUBERNETES_VERSION"
  staging="v0.${KUBERNETES_VERSION#v1.}"
  major=1; minor="$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
  v=k8s.io/component-base/version; cv=k8s.io/client-go/pkg/version
  ld="-s -w"
  for p in $v $cv; do
    ld+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  { echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod" | while read -r m; do echo "  $m => $m $staging"; done
    echo ")"; } | build kubernetes "k8s.io/kubernetes@$KUBERNETES_VERSION" "$ld" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi
if [[ ! -x "$OUT/etcd" ]]; then
  log "building etcd $ETCD_VERSION"
  true </dev/null | build etcd "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "-s -w" go.etcd.io/etcd/server/v3
  [[ -x "$OUT/v3" ]] && mv "$OUT/v3" "$OUT/etcd"
  [[ -x "$OUT/server" ]] && mv "$OUT/server" "$OUT/etcd"
fi
if [[ ! -x "$OUT/kwok" ]]; then
  log "building kwok $KWOK_VERSION"
  true </dev/null | build kwok "sigs.k8s.io/kwok@$KWOK_VERSION" "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
fi
if [[ ! -x "$OUT/helm" ]]; then
  log "building helm $HELM_VERSION"
  true </dev/null | build helm "helm.sh/helm/v3@$HELM_VERSION" "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" helm.sh/helm/v3/cmd/helm
fi
complete || die "some binaries are missing in $OUT after the build: $(for b in "${BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || printf '%s ' "$b"; done)"
log "ready in $OUT"
echo "$OUT"
