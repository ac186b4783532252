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
#   PYTHON_IMAGE   base image to build on (skips the debootstrap base)
#   DEBIAN_MIRROR  mirror for debootstrap (default http://deb.debian.org/debian)
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

# A minimal Debian with Python 3.11, venv and pip: what python:3.11-slim-bookworm
# gives, from Debian's archive. It trusts this machine's CA bundle (pip in the
# build stage must reach the package index through this machine's network).
build_base() {
  local rootfs="${cache}/rootfs" tarball="${cache}/python-3.11-${suite}.tar"
  if [[ ! -f "${tarball}" ]]; then
    command -v debootstrap >/dev/null 2>&1 || { echo "debootstrap missing: apt-get install debootstrap" >&2; exit 1; }
    stamp "debootstrap ${suite} (once; cached in ${cache})"
    rm -rf "${rootfs}" && mkdir -p "${rootfs}"
    debootstrap --variant=minbase --include=python3.11,python3.11-venv,python3-pip,python-is-python3 \
      "${suite}" "${rootfs}" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"${cache}/debootstrap.log" 2>&1 \
      || { tail -n 20 "${cache}/debootstrap.log" >&2; exit 1; }
    cp /etc/ssl/certs/ca-certificates.crt "${rootfs}/etc/ssl/certs/ca-certificates.crt"
    # What a container never needs: package caches and lists, docs, man pages, locales.
    rm -rf "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/lib/apt/lists/* \
      "${rootfs}"/usr/share/doc/* "${rootfs}"/usr/share/man/* "${rootfs}"/usr/share/info/* \
      "${rootfs}"/usr/share/locale/* "${rootfs}"/var/log/*.log "${rootfs}"/var/cache/debconf/*-old
    tar -C "${rootfs}" --numeric-owner -cf "${tarball}.tmp" . && mv "${tarball}.tmp" "${tarball}"
    rm -rf "${rootfs}"
  fi
  if ! podman image exists "${base_tag}"; then
    stamp "import the base into podman as ${base_tag}"
    podman import --quiet --change 'CMD ["python3"]' "${tarball}" "${base_tag}" >/dev/null
  fi
}

args=(--build-arg "VERSION=${version}" -t "${image}:${version}")
case "${engine}" in
  docker)
    [[ -n "${PYTHON_IMAGE:-}" ]] && args+=(--build-arg "PYTHON_IMAGE=${PYTHON_IMAGE}")
    stamp "docker build ${image}:${version}"
    docker build "${args[@]}" "${root}"
    ;;
  podman)
    if [[ -z "${PYTHON_IMAGE:-}" ]]; then
      mkdir -p "${cache}"
      build_base
    fi
    stamp "podman build ${image}:${version}"
    # No layer cache: the sources change on every commit, so the pip step reruns
    # anyway, and cached intermediate images would pile up on a CI machine.
    podman build --isolation chroot --network host --layers=false \
      --build-arg "PYTHON_IMAGE=${PYTHON_IMAGE:-${base_tag}}" "${args[@]}" "${root}"
    # The image this build replaced, now untagged.
    podman image prune --force --filter "label=org.opencontainers.image.title=gpu-health" >/dev/null
    ;;
  *) echo "ENGINE must be docker or podman, not ${engine}" >&2; exit 1 ;;
esac

stamp "check the image"
# Inside the image, as its USER: the UID, both entry points, and package data
# (XID catalogue, scenario parsing) by reading simulated GPUs once.
check_script='set -e
echo "uid $(id -u)"
for entry in gpu-health-agent gpu-health-operator; do "$entry" --help >/tmp/help.txt; head -n 1 /tmp/help.txt; done
printf "gpus: 2\nmodel: NVIDIA H100 80GB HBM3\ndriverVersion: 570.124.06\n" >/tmp/scenario.yaml
gpu-health-agent check --backend sim --sim-scenario /tmp/scenario.yaml -o json >/dev/null
echo "agent check on simulated GPUs: ok"'
if [[ "${engine}" == docker ]]; then
  out="$(docker run --rm --network none --entrypoint sh "${image}:${version}" -c "${check_script}" 2>&1)" || status=$?
else
  # `podman run` needs a runtime allowed to set rlimits, which sandboxes
  # (like CI's) refuse; a one-step build FROM the image runs the same
  # commands in its root filesystem, as its USER and with its ENV.
  ctx="$(mktemp -d)"
  printf '%s\n' "${check_script}" >"${ctx}/check.sh"
  printf 'FROM %s\nCOPY check.sh /tmp/check.sh\nRUN sh /tmp/check.sh\n' "${image}:${version}" >"${ctx}/Containerfile"
  out="$(podman build --isolation chroot --network host --no-cache --layers=false \
    --iidfile "${ctx}/iid" -f "${ctx}/Containerfile" "${ctx}" 2>&1)" || status=$?
  [[ -s "${ctx}/iid" ]] && podman rmi --force "$(cat "${ctx}/iid")" >/dev/null 2>&1
  rm -rf "${ctx}"
fi
echo "${out}" | grep -v -E '^(STEP|COMMIT|-->|[0-9a-f]{64}$)' | sed 's/^/  /'
failures=0
if [[ "${status:-0}" -ne 0 ]]; then
  echo "FAIL: the checks inside the image failed" >&2; failures=1
elif ! grep -qx 'uid 65532' <<<"${out}"; then
  echo "FAIL: the image does not run as UID 65532" >&2; failures=1
else
  echo "runs as UID 65532, both entry points start, package data present: ok"
fi
size="$("${engine}" image inspect --format '{{.Size}}' "${image}:${version}")"
echo "image ${image}:${version}: $(( size / 1000000 )) MB"
stamp "done"
exit "${failures}"
