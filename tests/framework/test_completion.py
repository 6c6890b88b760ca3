"""Tab completion as a bash user gets it: `eval "$(python -m specexp completion bash)"`, then TAB."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from specexp.cli import conf_dir

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def env():
    return {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}


def complete(line: str, setup: str = 'eval "$(python -m specexp completion bash)"') -> list[str]:
    """What bash's completion function offers for ``line`` with the cursor at its end (bash splits words at
    COMP_WORDBREAKS, so ``pair=ti`` is the three words ``pair`` ``=`` ``ti``, as on a terminal)."""
    program = f'''
{setup}
COMP_LINE={line!r}
COMP_POINT=${{#COMP_LINE}}
read -r -a COMP_WORDS <<< "$(sed -e 's/=/ = /g' <<< "$COMP_LINE")"
[[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
_specexp_complete "${{COMP_WORDS[0]}}" "${{COMP_WORDS[COMP_CWORD]}}" ""
printf '%s\\n' "${{COMPREPLY[@]}}"
'''
    proc = subprocess.run(["bash", "-c", program], capture_output=True, text=True, env=env(), timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line]


def test_commands_complete_for_python_dash_m_and_the_console_script():
    assert complete("python -m specexp r") == ["run", "report"]
    assert complete("specexp ") == ["run", "list", "train", "report", "completion"]


def test_group_options_experiments_and_keys_complete_after_run():
    assert "tiny_lfm2" in complete("python -m specexp run pair=tiny_l")
    assert complete("specexp run +exp=") == sorted(p.stem for p in (conf_dir() / "exp").glob("*.yaml"))
    assert "quickstart" in complete("specexp run +exp=")
    assert complete("python -m specexp run +exp=quickstart engine.max_n") == ["engine.max_num_seqs="]


def test_zoo_models_complete_after_train():
    expected = sorted(p.stem for p in (conf_dir() / "zoo").glob("tiny_llama*.yaml"))
    assert complete("python -m specexp train +zoo=tiny_llama") == expected
    assert {"tiny_llama", "tiny_llama_draft"} <= set(expected)


def test_a_python_line_that_is_not_specexp_is_left_to_other_completion():
    assert complete("python other_script.py ar") == []


def test_hydra_help_recipe_prints_the_same_script():
    hydra_way = subprocess.run([sys.executable, "-m", "specexp", "run", "-sc", "install=bash"], capture_output=True,
                               text=True, env=env(), timeout=120, check=True).stdout
    assert hydra_way == subprocess.run([sys.executable, "-m", "specexp", "completion", "bash"], capture_output=True,
                                       text=True, env=env(), timeout=120, check=True).stdout
    assert complete("python -m specexp run pair=tiny_l", setup='eval "$(python -m specexp -sc install=bash)"')


def test_an_unsupported_shell_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "specexp", "-sc", "install=fish"], capture_output=True, text=True,
                          env=env(), timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "specexp: error: completion for 'fish' is not available: choose bash or zsh"
