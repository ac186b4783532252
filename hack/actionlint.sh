#!/usr/bin/env bash
# `make lint-ci`: check the GitHub Actions workflows with actionlint (rhysd/actionlint), which the
# development machine cannot run. Built once from the Go module proxy (pinned) into
# ~/.cache/gpu-health/actionlint/<version>/ and reused; prints nothing when the workflows are clean.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="v1.7.12"
cache="${GPU_HEALTH_CACHE:-${HOME}/.cache/gpu-health}/actionlint/${version}"
binary="${cache}/actionlint"
if [[ ! -x "${binary}" ]]; then
  command -v go >/dev/null || { echo "actionlint needs Go to build it once (https://go.dev/dl/)" >&2; exit 2; }
  mkdir -p "${cache}"
  # Into a scratch GOBIN first: an interrupted build leaves no half-written binary in the cache.
  scratch="$(mktemp -d)"
  trap 'rm -rf "${scratch}"' EXIT
  GOBIN="${scratch}" GOFLAGS=-mod=mod go install "github.com/rhysd/actionlint/cmd/actionlint@${version}" >&2
  mv "${scratch}/actionlint" "${binary}"
fi
cd "${root}"
# shellcheck and pyflakes, when installed, also check the workflows' run: scripts.
exec "${binary}" -no-color "$@"
