#!/usr/bin/env bash
# Build the container image (`make image`), then check it: both entry points
# start inside it, it runs as UID 65532, and its size is printed.
#
# With a running Docker engine: `docker build` on the Dockerfile's default
# base (python:3.11-slim-bookworm from Docker Hub). Without one: Debian's
# podman (`podman build --isolation chroot --network host`) on a Python base
# made here with debootstrap, for machines that reach Debian's archive but no
# container registry. That base is built once and cached outside the checkout
# (${XDG_CACHE_HOME:-~/.cache}/gpu-health/image-base/) and imported into
# podman's storage when missing there.
#
# Environment:
#   IMAGE          image name (default gpu-health)
#   VERSION        tag (default: gpuhealth_api.__version__)
#   ENGINE         docker | podman (default: docker if its engine answers, else podman)
#   PYTHON_IMAGE   base image to build on (skips the debootstrap base; for
#                  PLATFORMS, a multi-arch one such as python:3.11-slim-bookworm)
#   DEBIAN_MIRROR  mirror for debootstrap (default http://deb.debian.org/debian)
#   PLATFORMS      comma-separated, of linux/amd64 and linux/arm64 (default:
#                  this machine's arch only, a plain image IMAGE:VERSION). Set,
#                  one image per arch, IMAGE:VERSION-<arch>, each checked, and
#                  with podman a manifest list IMAGE:VERSION of them. An arch
#                  other than this machine's builds through QEMU user emulation
#                  (binfmt_misc; qemu-user-static): without it, exit 2 saying so.
#   PUSH           1: push the manifest list to IMAGE (a registry path) and
#                  print its digest, the chart's image.digest; needs PLATFORMS
#   DRY_RUN        1: check the arguments and the emulation, print the
#                  commands, build nothing (the tests use it)
#   BINFMT_DIR     where binfmt_misc is mounted (default /proc/sys/fs/binfmt_misc)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${XDG_CACHE_HOME:-${HOME}/.cache}/gpu-health/image-base"
image="${IMAGE:-gpu-health}"
version="${VERSION:-$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "${root}/api/gpuhealth_api/__init__.py")}"
[[ -n "${version}" ]] || { echo "cannot read __version__ from api/gpuhealth_api/__init__.py" >&2; exit 1; }
suite=bookworm
base_tag="localhost/gpu-health-python-base:3.11-${suite}"
start=$(date +%s)
stamp() { echo "image: $* (+$(( $(date +%s) - start ))s)"; }
dry="${DRY_RUN:-}"
# Run a command, or under DRY_RUN only print it.
run() { if [[ -n "${dry}" ]]; then echo "+ $*"; else "$@"; fi; }

# Docker's and OCI's names for this machine's arch.
case "$(uname -m)" in
  x86_64 | amd64) host_arch=amd64 ;;
  aarch64 | arm64) host_arch=arm64 ;;
  *) host_arch="$(uname -m)" ;;
esac
archs=()
if [[ -n "${PLATFORMS:-}" ]]; then
  IFS=',' read -ra requested <<<"${PLATFORMS}"
  for platform in ${requested[@]+"${requested[@]}"}; do
    case "${platform}" in
      linux/amd64 | linux/arm64) ;;
      *)
        echo "PLATFORMS: '${platform}' is not linux/amd64 or linux/arm64 (comma-separated, e.g. PLATFORMS=linux/amd64,linux/arm64)" >&2
        exit 2 ;;
    esac
    [[ " ${archs[*]+${archs[*]}} " == *" ${platform#linux/} "* ]] || archs+=("${platform#linux/}")
  done
  [[ ${#archs[@]} -gt 0 ]] || { echo "PLATFORMS names no platform: '${PLATFORMS}'" >&2; exit 2; }
  echo "platforms: $(printf 'linux/%s ' "${archs[@]}")(this machine: linux/${host_arch})"
else
  echo "platforms: linux/${host_arch} (this machine)"
fi
if [[ -n "${PUSH:-}" ]]; then
  if [[ ${#archs[@]} -eq 0 ]]; then
    echo "PUSH=1 pushes a multi-arch manifest list: set PLATFORMS=linux/amd64,linux/arm64 too" >&2
    exit 2
  fi
  if [[ "${image}" != */* ]]; then
    echo "PUSH=1 needs IMAGE=<registry>/<path> (e.g. registry.example.com/gpu/gpu-health), not '${image}'" >&2
    exit 2
  fi
fi

engine="${ENGINE:-}"
if [[ -z "${engine}" ]]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null 2>&1; then
    engine=podman
  else
    echo "neither a Docker engine nor podman: apt-get install podman debootstrap (Debian), or start Docker" >&2
    exit 1
  fi
fi

# Can this builder run the foreign arches' binaries (the RUN steps)? With
# podman on Linux the build runs on this kernel: QEMU must be registered with
# binfmt_misc. Docker's builder says which platforms it runs (Docker Desktop
# emulates in its VM; podman on a Mac builds in its VM, which has QEMU).
missing=()
# (${a[@]+"${a[@]}"}: an empty array under set -u in the bash 3.2 of macOS)
for arch in ${archs[@]+"${archs[@]}"}; do
  [[ "${arch}" == "${host_arch}" ]] && continue
  case "${arch}" in amd64) qemu=qemu-x86_64 ;; arm64) qemu=qemu-aarch64 ;; esac
  if [[ "${engine}" == docker ]]; then
    [[ -n "${dry}" ]] && continue
    docker buildx inspect --bootstrap 2>/dev/null | grep -i '^platforms:' | grep -q "linux/${arch}" \
      || missing+=("linux/${arch}: docker buildx's builder does not list linux/${arch} among its platforms")
  elif [[ "$(uname -s)" == Linux ]]; then
    binfmt="${BINFMT_DIR:-/proc/sys/fs/binfmt_misc}"
    if [[ ! -e "${binfmt}/status" ]]; then
      missing+=("linux/${arch}: binfmt_misc is not mounted at ${binfmt} (mount -t binfmt_misc binfmt_misc ${binfmt})")
    elif ! grep -qsx enabled "${binfmt}/${qemu}" "${binfmt}/${qemu}-static"; then
      missing+=("linux/${arch}: no enabled binfmt_misc entry ${qemu} in ${binfmt}")
    elif ! grep -qsE '^flags: *[A-Z]*F' "${binfmt}/${qemu}" "${binfmt}/${qemu}-static"; then
      # Without F (fix binary) the kernel looks the interpreter up inside the
      # build's root filesystem, where it is not: every RUN step fails.
      missing+=("linux/${arch}: ${binfmt}/${qemu} lacks the F flag (qemu-user-static registers with it; qemu-user does not)")
    fi
  fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
  {
    echo "cannot build for an arch other than this machine's (linux/${host_arch}) here:"
    printf '  %s\n' "${missing[@]}"
    echo "Foreign arches build through QEMU user emulation registered with binfmt_misc:"
    echo "  Debian/Ubuntu: apt-get install qemu-user-static (systemd registers ${qemu} and the others at boot;"
    echo "    where systemd does not run, e.g. in a container: /lib/systemd/systemd-binfmt /usr/lib/binfmt.d/${qemu}.conf)"
    echo "  any Linux with privileged containers: podman run --rm --privileged docker.io/tonistiigi/binfmt --install all"
    echo "or build on a machine of that arch. Without PLATFORMS, make image builds linux/${host_arch} only."
  } >&2
  exit 2
fi

# A minimal Debian with Python 3.11, venv and pip: what python:3.11-slim-bookworm
# gives, from Debian's archive. It trusts this machine's CA bundle (pip in the
# build stage must reach the package index through this machine's network).
# With an arch other than this machine's: that arch's Debian (through QEMU),
# cached and tagged with the arch as suffix; this machine's keeps its names.
build_base() {
  local arch="${1:-${host_arch}}" suffix="" tag
  [[ "${arch}" == "${host_arch}" ]] || suffix="-${arch}"
  tag="${base_tag}${suffix}"
  local rootfs="${cache}/rootfs${suffix}" tarball="${cache}/python-3.11-${suite}${suffix}.tar"
  local bootstrap=(debootstrap --variant=minbase --include=python3.11,python3.11-venv,python3-pip,python-is-python3)
  [[ -z "${suffix}" ]] || bootstrap+=("--arch=${arch}")
  bootstrap+=("${suite}" "${rootfs}" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}")
  if [[ -n "${dry}" ]]; then
    [[ -f "${tarball}" ]] || echo "+ ${bootstrap[*]}"
    echo "+ podman import ${suffix:+--arch ${arch} }${tarball} ${tag} (unless in podman's storage)"
    return
  fi
  if [[ ! -f "${tarball}" ]]; then
    command -v debootstrap >/dev/null 2>&1 || { echo "debootstrap missing: apt-get install debootstrap" >&2; exit 1; }
    stamp "debootstrap ${suite}${suffix:+ for ${arch}} (once; cached in ${cache})"
    rm -rf "${rootfs}" && mkdir -p "${rootfs}"
    "${bootstrap[@]}" >"${cache}/debootstrap${suffix}.log" 2>&1 \
      || { tail -n 20 "${cache}/debootstrap${suffix}.log" >&2; exit 1; }
    cp /etc/ssl/certs/ca-certificates.crt "${rootfs}/etc/ssl/certs/ca-certificates.crt"
    # What a container never needs: package caches and lists, docs, man pages, locales.
    rm -rf "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/lib/apt/lists/* \
      "${rootfs}"/usr/share/doc/* "${rootfs}"/usr/share/man/* "${rootfs}"/usr/share/info/* \
      "${rootfs}"/usr/share/locale/* "${rootfs}"/var/log/*.log "${rootfs}"/var/cache/debconf/*-old
    tar -C "${rootfs}" --numeric-owner -cf "${tarball}.tmp" . && mv "${tarball}.tmp" "${tarball}"
    rm -rf "${rootfs}"
  fi
  if ! podman image exists "${tag}"; then
    stamp "import the base into podman as ${tag}"
    podman import --quiet ${suffix:+--arch "${arch}"} --change 'CMD ["python3"]' "${tarball}" "${tag}" >/dev/null
  fi
}

args=(--build-arg "VERSION=${version}")
[[ "${engine}" != docker || -z "${PYTHON_IMAGE:-}" ]] || args+=(--build-arg "PYTHON_IMAGE=${PYTHON_IMAGE}")
# No layer cache: the sources change on every commit, so the pip step reruns
# anyway, and cached intermediate images would pile up on a CI machine.
podman_args=(--isolation chroot --network host --layers=false)
base_of() { if [[ "$1" == "${host_arch}" ]]; then echo "${base_tag}"; else echo "${base_tag}-$1"; fi; }

if [[ ${#archs[@]} -eq 0 ]]; then
  # This machine's arch: a plain image IMAGE:VERSION (what CI builds).
  case "${engine}" in
    docker)
      stamp "docker build ${image}:${version}"
      run docker build "${args[@]}" -t "${image}:${version}" "${root}"
      ;;
    podman)
      if [[ -z "${PYTHON_IMAGE:-}" ]]; then
        mkdir -p "${cache}"
        build_base
      fi
      stamp "podman build ${image}:${version}"
      run podman build "${podman_args[@]}" \
        --build-arg "PYTHON_IMAGE=${PYTHON_IMAGE:-${base_tag}}" "${args[@]}" -t "${image}:${version}" "${root}"
      ;;
    *) echo "ENGINE must be docker or podman, not ${engine}" >&2; exit 1 ;;
  esac
  refs=("${image}:${version}")
else
  # One image per arch, IMAGE:VERSION-<arch>; podman also lists them in the
  # manifest list IMAGE:VERSION (docker keeps lists in registries only).
  manifest="${image}:${version}"
  refs=()
  case "${engine}" in
    docker)
      for arch in "${archs[@]}"; do
        stamp "docker buildx build ${manifest}-${arch} (linux/${arch})"
        run docker buildx build --platform "linux/${arch}" --load "${args[@]}" -t "${manifest}-${arch}" "${root}"
        refs+=("${manifest}-${arch}")
      done
      ;;
    podman)
      mkdir -p "${cache}"
      if [[ -z "${dry}" ]]; then
        # A list left by another build would keep that build's images beside
        # this one's; a single-arch image of the name would refuse the list.
        if podman manifest exists "${manifest}" 2>/dev/null; then podman manifest rm "${manifest}" >/dev/null; fi
        if podman image exists "${manifest}"; then podman rmi "${manifest}" >/dev/null; fi
      fi
      for arch in "${archs[@]}"; do
        [[ -n "${PYTHON_IMAGE:-}" ]] || build_base "${arch}"
        stamp "podman build ${manifest}-${arch} (linux/${arch})"
        run podman build "${podman_args[@]}" --platform "linux/${arch}" --manifest "${manifest}" \
          --build-arg "PYTHON_IMAGE=${PYTHON_IMAGE:-$(base_of "${arch}")}" "${args[@]}" \
          -t "${manifest}-${arch}" "${root}"
        refs+=("${manifest}-${arch}")
      done
      ;;
    *) echo "ENGINE must be docker or podman, not ${engine}" >&2; exit 1 ;;
  esac
fi
if [[ "${engine}" == podman ]]; then
  # The images this build replaced, now untagged (the per-arch ones are tagged).
  run podman image prune --force --filter "label=org.opencontainers.image.title=gpu-health" >/dev/null
fi

# Inside the image, as its USER: the UID, both entry points, and package data
# (XID catalogue, scenario parsing) by reading simulated GPUs once. A foreign
# arch's image runs through QEMU (slower, same checks).
check_script='set -e
echo "uid $(id -u)"
for entry in gpu-health-agent gpu-health-operator; do "$entry" --help >/tmp/help.txt; head -n 1 /tmp/help.txt; done
printf "gpus: 2\nmodel: NVIDIA H100 80GB HBM3\ndriverVersion: 570.124.06\n" >/tmp/scenario.yaml
gpu-health-agent check --backend sim --sim-scenario /tmp/scenario.yaml -o json >/dev/null
echo "agent check on simulated GPUs: ok"'
failures=0
# check_image REF [ARCH]: the checks inside REF (run as ARCH), then its size.
check_image() {
  local ref="$1" arch="${2:-}" out status=0 ctx size
  local platform=()
  [[ -z "${arch}" ]] || platform=(--platform "linux/${arch}")
  stamp "check the image ${ref}"
  if [[ -n "${dry}" ]]; then echo "+ check ${ref}${arch:+ as linux/${arch}}"; return; fi
  if [[ "${engine}" == docker ]]; then
    out="$(docker run --rm --network none ${platform[@]+"${platform[@]}"} --entrypoint sh "${ref}" -c "${check_script}" 2>&1)" || status=$?
  else
    # `podman run` needs a runtime allowed to set rlimits, which sandboxes
    # (like CI's) refuse; a one-step build FROM the image runs the same
    # commands in its root filesystem, as its USER and with its ENV.
    ctx="$(mktemp -d)"
    printf '%s\n' "${check_script}" >"${ctx}/check.sh"
    printf 'FROM %s\nCOPY check.sh /tmp/check.sh\nRUN sh /tmp/check.sh\n' "${ref}" >"${ctx}/Containerfile"
    out="$(podman build "${podman_args[@]}" --no-cache ${platform[@]+"${platform[@]}"} \
      --iidfile "${ctx}/iid" -f "${ctx}/Containerfile" "${ctx}" 2>&1)" || status=$?
    [[ -s "${ctx}/iid" ]] && podman rmi --force "$(cat "${ctx}/iid")" >/dev/null 2>&1
    rm -rf "${ctx}"
  fi
  echo "${out}" | grep -v -E '^(STEP|COMMIT|-->|[0-9a-f]{64}$)' | sed 's/^/  /'
  if [[ "${status}" -ne 0 ]]; then
    echo "FAIL: the checks inside ${ref} failed" >&2; failures=1
  elif ! grep -qx 'uid 65532' <<<"${out}"; then
    echo "FAIL: ${ref} does not run as UID 65532" >&2; failures=1
  else
    echo "runs as UID 65532, both entry points start, package data present: ok"
  fi
  size="$("${engine}" image inspect --format '{{.Size}}' "${ref}")"
  echo "image ${ref}${arch:+ (linux/${arch})}: $(( size / 1000000 )) MB"
}
if [[ ${#archs[@]} -eq 0 ]]; then
  check_image "${refs[0]}"
else
  for i in "${!archs[@]}"; do check_image "${refs[i]}" "${archs[i]}"; done
fi

if [[ ${#archs[@]} -gt 0 && "${failures}" -eq 0 ]]; then
  if [[ -z "${PUSH:-}" ]]; then
    if [[ "${engine}" == podman ]]; then
      echo "manifest list ${manifest}: $(printf 'linux/%s ' "${archs[@]}")(push it: PUSH=1 IMAGE=<registry>/<path>)"
    else
      echo "one image per arch: ${refs[*]}; docker makes the manifest list in the registry: PUSH=1 IMAGE=<registry>/<path>"
    fi
  else
    # Push by digest: the manifest list's digest is what the chart pins (image.digest).
    digestfile="$(mktemp)"
    stamp "push ${manifest}"
    if [[ "${engine}" == podman ]]; then
      run podman manifest push --all --digestfile "${digestfile}" "${manifest}" "docker://${manifest}"
    else
      platforms="$(printf 'linux/%s,' "${archs[@]}")"
      run docker buildx build --platform "${platforms%,}" --push --metadata-file "${digestfile}.json" \
        "${args[@]}" -t "${manifest}" "${root}"
      [[ -n "${dry}" ]] || sed -n 's/.*"containerimage.digest": *"\(sha256:[a-f0-9]*\)".*/\1/p' "${digestfile}.json" >"${digestfile}"
      rm -f "${digestfile}.json"
    fi
    digest="$(cat "${digestfile}")"
    rm -f "${digestfile}"
    if [[ -n "${dry}" ]]; then
      digest="sha256:<digest>"
    elif [[ ! "${digest}" =~ ^sha256:[a-f0-9]{64}$ ]]; then
      echo "FAIL: pushed ${manifest}, but read no digest ('${digest}')" >&2; exit 1
    fi
    echo "pushed ${manifest} as ${image}@${digest}"
    echo "  pin it in the chart: make chart IMAGE_DIGEST=${digest} (or --set image.digest=${digest})"
  fi
fi
stamp "done"
exit "${failures}"
