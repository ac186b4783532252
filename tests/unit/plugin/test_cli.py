"""The plugin's command line without a cluster: usage errors exit 2, no cluster exits 3, completion."""

import pathlib
import subprocess
import sys

import pytest

from gpuhealth_kubectl import cli, completion

NAMES = {"nodes": ["gpu-a", "gpu-b", "cpu-x"], "policies": ["default", "pool-b"]}


def names(kind: str) -> list[str]:
    return NAMES[kind]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([""], list(completion.COMMANDS)),
        (["w"], ["why"]),
        (["why", "gpu"], ["gpu-a", "gpu-b"]),
        (["--kubeconfig", "/k", "why", ""], ["gpu-a", "gpu-b", "cpu-x"]),
        (["drill", "gpu-a", "Ecc"], ["EccUncorrectable"]),
        (["drill", "gpu-a", "ecc"], ["EccUncorrectable"]),
        (
            ["drill", "gpu-a", "EccUncorrectable", "--"],
            ["--kubeconfig", "--context", "--output", "--ttl", "--stop"],
        ),
        (["pause", ""], ["default", "pool-b"]),
        (["resume", "p"], ["pool-b"]),
        (["status", "-o", ""], ["text", "json"]),
        (["completion", ""], ["bash", "zsh"]),
        (["--kubeconfig", ""], []),
        (["why", "gpu-a", ""], []),
    ],
)
def test_completion_candidates(words: list[str], expected: list[str]) -> None:
    assert completion.candidates(words, names) == expected


def test_completion_scripts_call_back_into_the_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in completion.SHELLS:
        assert cli.main(["completion", shell]) == 0
        script = capsys.readouterr().out
        assert "kubectl-gpuhealth __complete" in script
    assert "complete -o default -F _kubectl_gpuhealth kubectl-gpuhealth" in completion.BASH
    assert "compdef _kubectl_gpuhealth kubectl-gpuhealth" in completion.ZSH


def test_bash_completion_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n"], input=completion.BASH, text=True, check=True)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["why"],
        ["drill", "n1"],
        ["status", "-o", "yaml"],
        ["completion", "fish"],
        ["status", "--as-group", "g"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code  # type: ignore[assignment]
    assert code == 2
    assert "error" in capsys.readouterr().err


def test_a_bad_kubeconfig_says_so_in_one_line_and_exits_3(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "config"
    bad.write_text("this: [is not a kubeconfig\n")
    assert cli.main(["status", "--kubeconfig", str(bad)]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: cannot load kubeconfig") and err.count("\n") == 1


def test_an_unreachable_cluster_says_so_in_one_line_and_exits_3(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config"
    config.write_text(
        """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""
    )
    assert cli.main(["-o", "json", "why", "n1", "--kubeconfig", str(config)]) == 3
    err = capsys.readouterr().err
    assert (
        err.startswith("error: cannot reach the API server at https://127.0.0.1:1") and err.count("\n") == 1
    )
    # Completion on TAB never errors: no candidates from an unreachable cluster.
    assert cli.main(["__complete", "--kubeconfig", str(config), "why", ""]) == 0
    assert capsys.readouterr() == ("", "")


def test_the_console_scripts_are_installed_beside_python() -> None:
    bin_dir = pathlib.Path(sys.executable).parent
    for script in ("kubectl-gpuhealth", "kubectl_complete-gpuhealth"):
        assert (bin_dir / script).exists(), f"{script}: run pip install -e ."


def test_bash_completion_end_to_end_through_the_installed_script(tmp_path: pathlib.Path) -> None:
    bin_dir = pathlib.Path(sys.executable).parent
    script = tmp_path / "completion.bash"
    script.write_text(completion.BASH)
    probe = f"""
source {script}
COMP_WORDS=(kubectl-gpuhealth drill node-1 GpuL); COMP_CWORD=3
_kubectl_gpuhealth
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "none")}
    done = subprocess.run(
        ["bash", "-c", probe], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["GPULost"]


def test_kubectl_complete_speaks_cobras_format(tmp_path: pathlib.Path) -> None:
    bin_dir = pathlib.Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "none")}
    done = subprocess.run(
        [str(bin_dir / "kubectl_complete-gpuhealth"), "re"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines() == ["resume", ":4"]
    done = subprocess.run(
        [str(bin_dir / "kubectl_complete-gpuhealth"), "--kubeconfig", ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines() == [":0"]  # a file name: the shell completes it
