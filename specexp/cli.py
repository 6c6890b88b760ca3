"""Command line: ``python -m specexp <command>`` (also installed as ``specexp``).

Hydra parses argv itself, so the subcommand is stripped before Hydra sees the rest. The config directory
is always passed to Hydra as an absolute path (a relative ``config_path`` under ``python -m`` is resolved
as a package path and fails in Hydra 1.3); see :func:`conf_dir` for where it is found.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from specexp.errors import ConfigError

USAGE = """\
usage: python -m specexp <command> [args]

commands:
  run [+exp=NAME] [key=value ...] [-m]   run one experiment; -m runs a sweep (one process per job);
                                         an experiment that declares a sweep always runs as one
  resume SWEEP_DIR                       run again only the jobs of a sweep without an ok record
                                         (also: run ... +resume=SWEEP_DIR)
  list                                   every config group: pairs, experiments, workloads, ...
  train +zoo=NAME [key=value ...]        train a demo model of the zoo (specexp.zoo.recipe)
  report PATH... [--out DIR]             report on runs: run or sweep directories, globs, any mix
                                         (specexp.analysis.report)
  export-specbench SWEEP_DIR OUT_DIR     a sweep's answers in Spec-Bench's layout (model_answer_temp0_run_{1,2,3}/)
  completion bash|zsh                    tab completion: eval "$(python -m specexp completion bash)"

examples:
  python -m specexp run +exp=quickstart
  python -m specexp run +exp=quickstart backend=hf speculator.num_speculative_tokens=2
  python -m specexp run +exp=depth_sweep workload.num_prompts=2    # k = 0..8: it declares that sweep
  python -m specexp run --cfg job +exp=quickstart     # print the composed config, run nothing

Config groups live in the config directory (SPECEXP_CONF_DIR overrides it); runs are written to
$SPECEXP_RUNS_DIR (default experiments/runs), each in a directory of its own. Free-form values go under
extra.* (+extra.note=baseline). Exit status: 0 ok, 1 a run or sweep job failed, 2 bad input (nothing
ran), 130 / 143 interrupted by SIGINT / SIGTERM.
"""

# Config groups whose choice can be checked against the files of the config directory before Hydra runs.
GROUP_LABELS = {
    "exp": "experiment", "pair": "pair", "backend": "backend", "workload": "workload", "engine": "engine",
    "sampling": "sampling", "speculator": "speculator", "short_conv": "short_conv", "tracking": "tracking",
    "zoo": "zoo model",
}
_GROUP_OVERRIDE = re.compile(r"^(?:\+{1,2}|~)?(?P<group>[A-Za-z_]+)=(?P<value>[^=]*)$")
_SWEEP_SYNTAX = re.compile(r"[()\[\]*{}$]")


def conf_dir() -> Path:
    """The absolute config directory: ``$SPECEXP_CONF_DIR`` if set, else ``specexp/conf`` inside an installed
    package (a wheel ships the top-level ``conf/`` there), else the source checkout's top-level ``conf/``."""
    env = os.environ.get("SPECEXP_CONF_DIR")
    if env:
        path = Path(env).expanduser().resolve()
        if not (path / "config.yaml").is_file():
            raise ConfigError(f"SPECEXP_CONF_DIR={env} has no config.yaml: point it at specexp's conf directory")
        return path
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise ConfigError(f"no config directory found (looked in {package / 'conf'} and {package.parent / 'conf'})")


def choices(group: str) -> list[str]:
    """Option names of config group ``group`` (yaml files under ``conf/<group>/``)."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def check_group_choices(overrides: list[str]) -> None:
    """:class:`ConfigError` for a ``group=NAME`` override naming an option that does not exist (sweep lists
    ``a,b`` are checked element by element)."""
    for override in overrides:
        match = _GROUP_OVERRIDE.match(override)
        if not match or match["group"] not in GROUP_LABELS or override.startswith("~"):
            continue
        value, group = match["value"], match["group"]
        if _SWEEP_SYNTAX.search(value):
            continue
        valid = choices(group)
        for name in value.split(","):
            if name not in valid:
                raise ConfigError(f"unknown {GROUP_LABELS[group]} '{name}': choose one of {', '.join(valid)}")


def compose_config(overrides: list[str] = (), config_name: str = "config", return_hydra_config: bool = False):
    """The config ``python -m specexp run OVERRIDES`` would compose (Hydra's compose API), for notebooks and
    tests. ``OmegaConf.to_container(cfg, resolve=True)`` gives the plain dict
    :func:`specexp.experiment.execute` takes."""
    from hydra import compose, initialize_config_dir

    overrides = list(overrides)
    check_group_choices(overrides)
    if config_name == "config":  # unknown keys refused, keys the option files leave out need no '+'
        from specexp.overrides import normalize

        overrides = normalize(overrides, conf_dir(), multirun=False)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=return_hydra_config)


def list_configs() -> str:
    """Every config group with its options and their descriptions (:mod:`specexp.catalog`)."""
    from specexp.catalog import render

    return render(conf_dir())


def _run_hydra(config_name: str, task, args: list[str]) -> None:
    import hydra

    saved = sys.argv
    sys.argv = [saved[0], *args]
    try:
        hydra.main(config_path=str(conf_dir()), config_name=config_name, version_base="1.3")(task)()
    finally:
        sys.argv = saved


def train_task(cfg) -> None:
    """Hydra task of ``specexp train``: hands the composed ``train`` config to ``specexp.zoo.recipe.main``."""
    try:
        from specexp.zoo import recipe
    except ImportError as e:
        print(f"specexp: error: the training recipe specexp.zoo.recipe cannot be imported ({e})", file=sys.stderr)
        sys.exit(2)
    try:
        return recipe.main(cfg)
    except ConfigError as e:  # inside Hydra's task: Hydra would print a traceback
        print(f"specexp: error: {e}", file=sys.stderr)
        sys.exit(2)


_MULTIRUN_FLAGS = ("-m", "--multirun")
_NO_RUN_FLAGS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--resolve", "-p", "--package")


def declared_sweep(args: list[str]) -> str | None:
    """The experiment named by a ``+exp=NAME`` in ``args`` when its yaml declares ``hydra.sweeper.params``
    (it is a sweep by definition: e.g. ``depth_sweep``, ``backend_compare``), else None."""
    for arg in args:
        match = re.fullmatch(r"\+{1,2}exp=(?P<name>[\w.-]+)", arg)
        if not match:
            continue
        path = conf_dir() / "exp" / f"{match['name']}.yaml"
        if not path.is_file():
            return None
        from omegaconf import OmegaConf

        params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params")
        return match["name"] if params else None
    return None


def run_args(args: list[str]) -> list[str]:
    """``args`` for Hydra: a run of an experiment that declares a sweep becomes a multirun (``-m``), unless it
    already is or only prints (``--cfg``, ``--info``, help). A swept key set on the command line still wins
    (``+exp=depth_sweep speculator.num_speculative_tokens=3`` is one job)."""
    if any(a in _MULTIRUN_FLAGS for a in args) or any(a.split("=")[0] in _NO_RUN_FLAGS for a in args):
        return list(args)
    name = declared_sweep(args)
    if name is None:
        return list(args)
    print(f"specexp: experiment '{name}' declares a sweep: running it as a multirun (-m), one process per job",
          file=sys.stderr)
    return ["-m", *args]


def _cmd_run(args: list[str]) -> int:
    from specexp import launch

    return launch.run_command(["run", *args])


def _cmd_resume(args: list[str]) -> int:
    from specexp import launch

    return launch.run_command(["resume", *args])


def _cmd_train(args: list[str]) -> int:
    if not (conf_dir() / "train.yaml").is_file():
        raise ConfigError(f"{conf_dir() / 'train.yaml'} not found: the training recipe is not installed")
    check_group_choices(args)
    if not any(re.fullmatch(r"\+{1,2}zoo=\S+", a) for a in args) and not any(a.split("=")[0] in _NO_RUN_FLAGS
                                                                         for a in args):
        raise ConfigError(f"no zoo model chosen: add +zoo=NAME, one of {', '.join(choices('zoo'))}")
    _run_hydra("train", train_task, args)
    return 0


def _cmd_report(args: list[str]) -> int:
    if not args:
        raise ConfigError("report needs one or more PATHs (run directories, sweep directories or globs, e.g. "
                          "experiments/runs) [--out DIR]")
    try:
        from specexp.analysis import report
    except ImportError as e:
        raise ConfigError(f"report is not available: specexp.analysis.report cannot be imported ({e})") from e
    result = report.main(args)
    return result if isinstance(result, int) else 0


def _cmd_export_specbench(args: list[str]) -> int:
    from specexp.tracking import spec_bench_export

    return spec_bench_export.main(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m specexp``; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    commands = {"run": _cmd_run, "resume": _cmd_resume, "train": _cmd_train, "report": _cmd_report,
                "export-specbench": _cmd_export_specbench}
    try:
        from specexp import completion

        completed = completion.run_flag(argv)  # Hydra's -sc install=bash, as --hydra-help advises
        if completed is not None:
            return completed
        if command == "completion":
            return completion.main(rest)
        if command == "list":
            print(list_configs())
            return 0
        if command not in commands:
            raise ConfigError(f"unknown command '{command}': choose one of completion, export-specbench, list,"
                              " report, resume, run, train")
        return commands[command](rest)
    except BrokenPipeError:  # e.g. `specexp list | head`: the reader has gone, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's own flush at exit stays quiet
        return 0
    except ConfigError as e:
        print(f"specexp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # a run's result.json already says "interrupted"
        print("specexp: interrupted", file=sys.stderr)
        return getattr(e, "exit_status", 130)
