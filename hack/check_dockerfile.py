"""Project rules for the Dockerfile that a generic linter does not know.

hadolint checks Dockerfile hygiene; these check what the Helm chart and the
security story rely on: a multi-stage build from a slim Python 3.11 base that
builds our wheel, a final stage running as the numeric non-root user 65532,
and a build context limited by .dockerignore. Usage:
    python hack/check_dockerfile.py Dockerfile .dockerignore
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import sys

NON_ROOT_USER = "65532:65532"
BASE_PATTERN = re.compile(r"^python:3\.11-slim(-[a-z]+)?$")


@dataclasses.dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    arguments: str


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), arguments.strip()))
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def resolve_args(instructions: list[Instruction]) -> dict[str, str]:
    """Defaults of the ARGs declared before the first FROM (the ones FROM may use)."""
    values: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG" and "=" in instruction.arguments:
            name, _, value = instruction.arguments.partition("=")
            values[name.strip()] = value.strip()
    return values


def base_image(from_arguments: str, args: dict[str, str]) -> str:
    image = from_arguments.split(maxsplit=1)[0]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), image)


def check(dockerfile: str, dockerignore: str) -> list[str]:
    problems: list[str] = []
    instructions = parse(dockerfile)
    all_stages = stages(instructions)
    args = resolve_args(instructions)
    if len(all_stages) < 2:
        problems.append("the build must be multi-stage (builder + runtime)")
        return problems
    for stage in all_stages:
        image = base_image(stage[0].arguments, args)
        if not BASE_PATTERN.match(image):
            problems.append(f"line {stage[0].line}: base image {image!r} is not a slim Python 3.11 image")
    builder, final = all_stages[0], all_stages[-1]
    builds_wheel = re.compile(r"\bpip wheel\b[^&]*\s\.(\s|$)")
    if not any(i.keyword == "RUN" and builds_wheel.search(i.arguments) for i in builder):
        problems.append("the builder stage must build our wheel with `pip wheel ... .`")
    users = [i for i in final if i.keyword == "USER"]
    if not users:
        problems.append("the final stage must set USER")
    elif users[-1].arguments != NON_ROOT_USER:
        user = users[-1]
        problems.append(f"line {user.line}: the final USER must be {NON_ROOT_USER}, not {user.arguments!r}")
    for instruction in instructions:
        if instruction.keyword == "ADD":
            problems.append(f"line {instruction.line}: use COPY, not ADD")
        secret = re.search(r"(PASSWORD|TOKEN|SECRET)\w*=", instruction.arguments, re.IGNORECASE)
        if instruction.keyword in {"ENV", "ARG"} and secret:
            problems.append(f"line {instruction.line}: no secrets in ENV/ARG")
    if not any(i.keyword == "COPY" and "--from=" in i.arguments for i in final):
        problems.append("the final stage must copy the build result from the builder stage")
    entry_points = {"gpu-health-agent", "gpu-health-operator"}
    if not all(name in dockerfile for name in entry_points):
        problems.append("the image must provide both entry points: " + ", ".join(sorted(entry_points)))
    ignore_lines = [line.strip() for line in dockerignore.splitlines()]
    patterns = [line for line in ignore_lines if line and not line.startswith("#")]
    if not patterns or patterns[0] != "*":
        problems.append(".dockerignore must first exclude everything (`*`), then list what the build needs")
    return problems


def main(argv: list[str]) -> int:
    dockerfile_path, dockerignore_path = (pathlib.Path(a) for a in argv[1:3])
    problems = check(dockerfile_path.read_text(), dockerignore_path.read_text())
    for problem in problems:
        print(f"{dockerfile_path}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{dockerfile_path}: project rules hold")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
