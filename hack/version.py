#!/usr/bin/env python3
"""The one version of gpu-health, and every place that must agree with it.

The source is `__version__` in api/gpuhealth_api/__init__.py (PEP 440, e.g. `0.2.0` or `0.2.0.dev0`):
the package metadata reads it at build time (pyproject.toml `dynamic = ["version"]`), the image is
tagged with it, and the chart's `appVersion` (the default image tag) is it. The rest is derived and
checked here: Chart.yaml `version` (the same version in SemVer: `0.2.0.dev0` -> `0.2.0-dev.0`, which
Helm requires), the Dockerfile's default `ARG VERSION`, and CHANGELOG.md (an `[Unreleased]` section on
top; a release version has its own section; a development version is newer than every released one).

    hack/version.py            print the version
    hack/version.py check      exit 1 naming each place that disagrees (make release-check)
    hack/version.py chart      print the chart's SemVer version
    hack/version.py set V      write V into every place (make release does this)
    hack/version.py cut V DATE move CHANGELOG's [Unreleased] entries into a new [V] - DATE section

Stdlib only: `make release` and CI run it before any virtualenv exists.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path("api/gpuhealth_api/__init__.py")
CHART = Path("charts/gpu-health/Chart.yaml")
DOCKERFILE = Path("Dockerfile")
PYPROJECT = Path("pyproject.toml")
CHANGELOG = Path("CHANGELOG.md")
REPOSITORY = "https://github.com/gpu-health/gpu-health"
"""The public repository's address (see docs/release.md: a placeholder until it is published)."""

_PEP440 = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:(a|b|rc)(\d+))?(?:\.dev(\d+))?$")
_SOURCE_LINE = re.compile(r'^__version__ = "([^"]*)"$', re.MULTILINE)
_CHART_VERSION = re.compile(r"^version: *(\S+)$", re.MULTILINE)
_CHART_APP_VERSION = re.compile(r'^appVersion: *"?([^"\s]*)"?$', re.MULTILINE)
_DOCKER_ARG = re.compile(r"^ARG VERSION=(\S+)$", re.MULTILINE)
_SECTION = re.compile(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", re.MULTILINE)


class VersionError(ValueError):
    """Not a version this project uses; the message says which form it takes."""


def parse(version: str) -> tuple[int, int, int, str, int, int | None]:
    """(major, minor, patch, pre-release kind, its number, dev number); the kind is "~" for none."""
    match = _PEP440.match(version)
    if match is None:
        raise VersionError(f"{version!r} is not X.Y.Z, X.Y.Z(a|b|rc)N or X.Y.Z.devN")
    major, minor, patch, kind, number, dev = match.groups()
    # "~" sorts after "a", "b", "rc": a final release is newer than its pre-releases.
    dev_number = None if dev is None else int(dev)
    return int(major), int(minor), int(patch), kind or "~", int(number or 0), dev_number


def sort_key(version: str) -> tuple[int, int, int, str, int, float]:
    major, minor, patch, kind, number, dev = parse(version)
    return major, minor, patch, kind, number, float("inf") if dev is None else dev


def is_release(version: str) -> bool:
    return parse(version)[5] is None


def chart_version(version: str) -> str:
    """The same version in SemVer 2 (Helm refuses PEP 440's `0.2.0.dev0`)."""
    major, minor, patch, kind, number, dev = parse(version)
    labels = [] if kind == "~" else [kind, str(number)]
    labels += [] if dev is None else ["dev", str(dev)]
    return f"{major}.{minor}.{patch}" + (f"-{'.'.join(labels)}" if labels else "")


def _find(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    return None if match is None else match.group(1)


def source(root: Path = ROOT) -> str:
    found = _find(_SOURCE_LINE, (root / SOURCE).read_text())
    if found is None:
        raise VersionError(f'{SOURCE} has no line __version__ = "..."')
    return found


def problems(root: Path = ROOT) -> list[str]:
    """Every place that disagrees with the source, one line each; empty when all agree."""
    version = source(root)
    try:
        parse(version)
    except VersionError as error:
        return [f"{SOURCE}: {error}"]
    found: list[str] = []
    pyproject = (root / PYPROJECT).read_text()
    if not re.search(r'^dynamic = \["version"\]$', pyproject, re.MULTILINE) or not re.search(
        r'^version = \{attr = "gpuhealth_api.__version__"\}$', pyproject, re.MULTILINE
    ):
        found.append(f'{PYPROJECT}: the version must be dynamic = ["version"], read from gpuhealth_api')
    chart = (root / CHART).read_text()
    if (got := _find(_CHART_VERSION, chart)) != chart_version(version):
        found.append(f"{CHART}: version is {got}, want {chart_version(version)} (SemVer of {version})")
    if (got := _find(_CHART_APP_VERSION, chart)) != version:
        found.append(f'{CHART}: appVersion is {got}, want "{version}"')
    if (got := _find(_DOCKER_ARG, (root / DOCKERFILE).read_text())) != version:
        found.append(f"{DOCKERFILE}: ARG VERSION={got}, want {version}")
    found += _changelog_problems((root / CHANGELOG).read_text(), version)
    return found


def _changelog_problems(text: str, version: str) -> list[str]:
    sections = _SECTION.findall(text)
    if not sections or sections[0] != ("Unreleased", ""):
        return [f"{CHANGELOG}: the first section must be ## [Unreleased]"]
    released = [name for name, _ in sections[1:]]
    found = []
    for name, date in sections[1:]:
        if not date:
            found.append(f"{CHANGELOG}: section [{name}] has no date (## [{name}] - YYYY-MM-DD)")
    try:
        newest = max(released, key=sort_key) if released else None
    except VersionError as error:
        return [*found, f"{CHANGELOG}: {error}"]
    unreleased = text[text.index("## [Unreleased]") + len("## [Unreleased]") :]
    unreleased = unreleased[: m.start()] if (m := _SECTION.search(unreleased)) else unreleased
    if is_release(version) and re.search(r"^- ", unreleased, re.MULTILINE):
        found.append(
            f"{CHANGELOG}: [Unreleased] has entries, yet the version is the release {version}: "
            "set a development version (X.Y.Z.devN) after a release"
        )
    if is_release(version) and version not in released:
        found.append(f"{CHANGELOG}: no section ## [{version}] - YYYY-MM-DD for the release {version}")
    if not is_release(version) and newest is not None and sort_key(version) <= sort_key(newest):
        found.append(f"{CHANGELOG}: {version} is a development version, yet {newest} is released")
    for name in ["Unreleased", *released]:
        if not re.search(rf"^\[{re.escape(name)}\]: {re.escape(REPOSITORY)}/", text, re.MULTILINE):
            found.append(f"{CHANGELOG}: no link [{name}]: {REPOSITORY}/... at the bottom")
    return found


def set_version(version: str, root: Path = ROOT) -> None:
    """Write `version` into the source and every derived place."""
    parse(version)
    edits = [
        (SOURCE, _SOURCE_LINE, f'__version__ = "{version}"'),
        (CHART, _CHART_VERSION, f"version: {chart_version(version)}"),
        (CHART, _CHART_APP_VERSION, f'appVersion: "{version}"'),
        (DOCKERFILE, _DOCKER_ARG, f"ARG VERSION={version}"),
    ]
    for path, pattern, line in edits:
        text = (root / path).read_text()
        new, count = pattern.subn(line, text, count=1)
        if count != 1:
            raise VersionError(f"{path}: no line matching {pattern.pattern}")
        (root / path).write_text(new)


def cut_changelog(version: str, date: str, root: Path = ROOT) -> None:
    """[Unreleased]'s entries become [version] - date; a new empty [Unreleased] goes above it."""
    if not is_release(version):
        raise VersionError(f"{version} is a development version: only releases get a section")
    path = root / CHANGELOG
    text = path.read_text()
    if f"## [{version}]" in text:
        raise VersionError(f"{CHANGELOG} already has a section [{version}]")
    previous = [name for name, _ in _SECTION.findall(text)[1:]]
    text = text.replace("## [Unreleased]\n", f"## [Unreleased]\n\n## [{version}] - {date}\n", 1)
    base = f"v{max(previous, key=sort_key)}" if previous else None
    old_link = re.compile(rf"^\[Unreleased\]: {re.escape(REPOSITORY)}/.*$", re.MULTILINE)
    links = f"[Unreleased]: {REPOSITORY}/compare/v{version}...HEAD\n" + (
        f"[{version}]: {REPOSITORY}/compare/{base}...v{version}"
        if base
        else f"[{version}]: {REPOSITORY}/releases/tag/v{version}"
    )
    text, count = old_link.subn(links, text, count=1)
    if count != 1:
        raise VersionError(f"{CHANGELOG}: no [Unreleased]: {REPOSITORY}/... link to move on")
    path.write_text(text)


def main(argv: list[str]) -> int:
    try:
        match argv:
            case []:
                print(source())
            case ["chart"]:
                print(chart_version(source()))
            case ["check"]:
                found = problems()
                for line in found:
                    print(line, file=sys.stderr)
                if found:
                    print(
                        f"version {source()}: {len(found)} place(s) disagree; hack/version.py set V fixes "
                        "the derived ones",
                        file=sys.stderr,
                    )
                    return 1
                print(f"version {source()} (chart {chart_version(source())}): every place agrees")
            case ["set", version]:
                set_version(version)
            case ["cut", version, date]:
                cut_changelog(version, date)
            case _:
                print(__doc__, file=sys.stderr)
                return 2
    except VersionError as error:
        print(f"hack/version.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
