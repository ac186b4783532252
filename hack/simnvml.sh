#!/usr/bin/env bash
# Build the simulated NVML library (native/simnvml/simnvml.c) once, against NVIDIA's own nvml.h, into a
# cache outside the checkout keyed by the header's version and the source's hash. Prints the directory
# on stdout; it holds one folder per driver profile, each with a libnvidia-ml.so.1:
#
#   <dir>/full/libnvidia-ml.so.1         every function the agent calls
#   <dir>/old-driver/libnvidia-ml.so.1   a driver before R535: some functions absent (FunctionNotFound)
#
# Point LD_LIBRARY_PATH at one of them and pynvml loads it as it loads the driver's (docs/simulated-nvml.md).
#
#   hack/simnvml.sh                 build (if needed) and print the directory
#   SIMNVML_NVML_H=path/nvml.h      use that header instead of fetching go-nvml's
#
# Why go-nvml: NVIDIA ships nvml.h in the github.com/NVIDIA/go-nvml Go module, and the Go module proxy is
# a registry this project can reach (hack/testbin.sh fetches the control plane the same way).
set -euo pipefail

GO_NVML_VERSION="${GO_NVML_VERSION:-v0.13.4-1}"
PROFILES=(full old-driver)

log() { echo "simnvml: $*" >&2; }
die() { echo "simnvml: error: $*" >&2; exit 1; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source_file="$root/native/simnvml/simnvml.c"
[[ -f "$source_file" ]] || die "no $source_file"
CC="${CC:-cc}"
command -v "$CC" >/dev/null 2>&1 || die "no C compiler ('$CC'); install one (e.g. 'apt-get install gcc') or set CC"

hash="$(cat "$source_file" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
header_key="go-nvml-${GO_NVML_VERSION}"
[[ -n "${SIMNVML_NVML_H:-}" ]] && header_key="header-$(sha256sum "$SIMNVML_NVML_H" | cut -c1-16)"
CACHE_ROOT="${GPUHEALTH_SIMNVML_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-health/simnvml}"
OUT="$CACHE_ROOT/${header_key}_src-${hash}"
complete() { for p in "${PROFILES[@]}"; do [[ -f "$OUT/$p/libnvidia-ml.so.1" ]] || return 1; done; }
if complete; then echo "$OUT"; exit 0; fi

# One build at a time: a second caller (parallel test workers, checkouts) waits for the first.
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9
if complete; then echo "$OUT"; exit 0; fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
header="${SIMNVML_NVML_H:-}"
if [[ -z "$header" ]]; then
  command -v go >/dev/null 2>&1 || die "Go is needed to fetch nvml.h (github.com/NVIDIA/go-nvml); install Go or set SIMNVML_NVML_H=path/to/nvml.h"
  log "fetching nvml.h from github.com/NVIDIA/go-nvml@$GO_NVML_VERSION (Go module proxy)"
  (cd "$WORK" && go mod init gpuhealth.local/simnvml >/dev/null 2>&1)
  dir="$(cd "$WORK" && GOFLAGS=-mod=mod go mod download -json "github.com/NVIDIA/go-nvml@$GO_NVML_VERSION" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  header="$dir/pkg/nvml/nvml.h"
  [[ -f "$header" ]] || die "github.com/NVIDIA/go-nvml@$GO_NVML_VERSION has no pkg/nvml/nvml.h (GOPROXY=$(go env GOPROXY))"
fi
mkdir -p "$WORK/include"
cp "$header" "$WORK/include/nvml.h"

flags=(-std=c11 -D_POSIX_C_SOURCE=200809L -O2 -g0 -Wall -Wextra -Werror -fPIC -shared
       -fvisibility=default -Wl,-soname,libnvidia-ml.so.1 -I"$WORK/include")
for profile in "${PROFILES[@]}"; do
  extra=()
  [[ "$profile" == old-driver ]] && extra=(-DSIMNVML_OLD_DRIVER)
  mkdir -p "$WORK/$profile"
  "$CC" "${flags[@]}" "${extra[@]}" "$source_file" -o "$WORK/$profile/libnvidia-ml.so.1" -lpthread \
    || die "compiling $source_file ($profile) failed (see the compiler output above)"
done
mkdir -p "$OUT"
for profile in "${PROFILES[@]}"; do
  rm -rf "$OUT/$profile"
  mv "$WORK/$profile" "$OUT/$profile"
done
cp "$WORK/include/nvml.h" "$OUT/nvml.h"  # the header it was built against, for readers
log "built $OUT"
echo "$OUT"
