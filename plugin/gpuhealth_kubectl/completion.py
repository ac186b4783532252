"""Shell completion: the candidates for a partial command line, and the bash/zsh scripts that ask for them.

Both scripts and krew's `kubectl_complete-gpuhealth` convention (kubectl 1.26+
runs that executable for `kubectl gpuhealth <TAB>`) call `candidates`; node and
policy names come from the cluster through a callable that returns nothing when
the cluster cannot be asked, so completion never prints an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from gpuhealth_api import vocabulary

COMMANDS: Final = ("status", "why", "check", "drill", "pause", "resume", "completion")
GLOBAL_FLAGS: Final = ("--kubeconfig", "--context", "-o", "--output")
COMMAND_FLAGS: Final = {"drill": ("--ttl", "--stop"), "check": ("--template", "--timeout", "--no-wait")}
OUTPUTS: Final = ("text", "json")
SHELLS: Final = ("bash", "zsh")
FLAGS_WITH_VALUES: Final = frozenset(
    {"--kubeconfig", "--context", "-o", "--output", "--ttl", "--template", "--timeout"}
)

Names = Callable[[str], Sequence[str]]
"""`names("nodes")` / `names("policies")`: what the cluster has, or nothing."""


def candidates(words: Sequence[str], names: Names) -> list[str]:
    """Completions of the last word of `words` (the words after the program name; the last may be '')."""
    *before, current = list(words) or [""]
    if before and before[-1] in {"-o", "--output"}:
        return _matching(OUTPUTS, current)
    if before and before[-1] == "--ttl":
        return _matching(("5m", "10m", "15m", "1h"), current)
    if before and before[-1] in FLAGS_WITH_VALUES:
        return []  # a file or a context name: the shell's default
    positional = [
        w
        for i, w in enumerate(before)
        if not w.startswith("-") and (i == 0 or before[i - 1] not in FLAGS_WITH_VALUES)
    ]
    command = positional[0] if positional else None
    if current.startswith("-"):
        return _matching((*GLOBAL_FLAGS, *COMMAND_FLAGS.get(command or "", ())), current)
    if command is None:
        return _matching(COMMANDS, current)
    argument = len(positional) - 1  # how many arguments of the command are already typed
    if command in {"why", "drill", "check"} and argument == 0:
        return _matching(names("nodes"), current)
    if command == "drill" and argument == 1:
        # Any case, as `drill` accepts it: "ecc" completes to EccUncorrectable.
        return [c.value for c in vocabulary.Condition if c.value.lower().startswith(current.lower())]
    if command in {"pause", "resume"} and argument == 0:
        return _matching(names("policies"), current)
    if command == "completion" and argument == 0:
        return _matching(SHELLS, current)
    return []


def _matching(options: Sequence[str], prefix: str) -> list[str]:
    return [o for o in options if o.startswith(prefix)]


BASH: Final = """\
# kubectl-gpuhealth bash completion: source <(kubectl-gpuhealth completion bash)
_kubectl_gpuhealth() {
    local IFS=$'\\n'
    COMPREPLY=($(kubectl-gpuhealth __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _kubectl_gpuhealth kubectl-gpuhealth
"""

ZSH: Final = """\
#compdef kubectl-gpuhealth
# kubectl-gpuhealth zsh completion: source <(kubectl-gpuhealth completion zsh)
_kubectl_gpuhealth() {
    local -a options
    options=("${(@f)$(kubectl-gpuhealth __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    options=(${options:#})
    (( ${#options} )) && compadd -a options || _files
}
compdef _kubectl_gpuhealth kubectl-gpuhealth
"""

SCRIPTS: Final = {"bash": BASH, "zsh": ZSH}
