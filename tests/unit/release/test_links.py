"""Every link to the public repository names something that exists here, and the chart says who it is.

The public address is a placeholder until the repository is published (docs/release.md): a link
into it resolves once it is, if the file it names exists in this checkout.
"""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "gpu-health"
REPOSITORY = "https://github.com/gpu-health/gpu-health"
LINK = re.compile(re.escape(REPOSITORY) + r"[^\s)\"'>`]*")
INTO_A_FILE = re.compile(r"^/(?:blob|raw|tree)/main/([^#?]+)(?:#.*)?$")
NOT_FILES = re.compile(r"^(?:|/|/issues|/compare/v[\w.-]+\.\.\.(?:v[\w.-]+|HEAD)|/releases/tag/v[\w.-]+)$")


def _places() -> list[Path]:
    return [
        CHART / "Chart.yaml",
        CHART / "values.yaml",
        *sorted((CHART / "templates").rglob("*")),
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "hack" / "version.py",
    ]


def test_every_link_into_the_repository_names_a_file_that_exists():
    broken = []
    for place in _places():
        if not place.is_file():
            continue
        for link in LINK.findall(place.read_text()):
            rest = link.removeprefix(REPOSITORY).rstrip(".,;")
            if NOT_FILES.match(rest):
                continue
            target = INTO_A_FILE.match(rest)
            if target is None or not (ROOT / target.group(1)).exists():
                broken.append(f"{place.relative_to(ROOT)}: {link}")
    assert broken == []


def test_the_chart_names_its_home_sources_icon_and_maintainers():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith(REPOSITORY)
    assert REPOSITORY in chart["sources"]
    assert chart["icon"].startswith(f"{REPOSITORY}/raw/main/")
    assert (ROOT / chart["icon"].removeprefix(f"{REPOSITORY}/raw/main/")).is_file()
    assert chart["maintainers"]
    for maintainer in chart["maintainers"]:
        assert maintainer["name"]
        assert maintainer.get("url", "").startswith(REPOSITORY) or "@" in maintainer.get("email", "")


def test_the_runbook_links_point_into_the_repositorys_troubleshooting_page():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    runbook = values["metrics"]["prometheusRule"]["runbookBaseUrl"]
    assert runbook == f"{REPOSITORY}/blob/main/docs/troubleshooting.md"
