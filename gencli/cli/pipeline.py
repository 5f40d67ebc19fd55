"""gencli run CONFIG.toml: the whole retrain as one command (what cron calls).

The config lists the steps in order; each step's options sit under a table
named after the step, spelled exactly like the command's long options::

    steps = ["ingest", "embed", "quantize", "init-vocab", "sft", "eval", "cold-eval"]
    [ingest]
    items = "items.csv"          # paths are relative to the config file
    interactions = "interactions.csv"
    [quantize]
    levels = 3
    codes = 256

Every step goes through the same command as when typed by hand, so up-to-date
steps are skipped, and the first failing step stops the run with its exit code.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from gencli.cli.common import JSON_OPTION, fail, workdir_option

# Options that name files: resolved relative to the config file's folder.
PATH_OPTIONS = {"items", "interactions", "codebooks-from", "model"}
# Quick overrides: option -> the steps whose option of the same name it sets.
OVERRIDES = {"init": ("init-vocab",), "model": ("init-vocab",), "seed": ("quantize", "init-vocab", "cpt", "sft")}


def load_pipeline(path: Path) -> dict[str, Any]:
    from gencli.errors import InputError

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"pipeline config {path} does not exist; see sample_data/pipeline.toml for an example") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"pipeline config {path} is not valid TOML: {e}") from None
    from gencli.steps import pipeline_steps

    steps = config.get("steps")
    problems = []
    if not isinstance(steps, list) or not steps:
        problems.append("`steps` must be a non-empty list, e.g. steps = [\"ingest\", \"embed\", \"quantize\"]")
        steps = []
    known = pipeline_steps()
    for s in steps:
        if s not in known:
            problems.append(f"unknown step {s!r} in `steps`; choose from {', '.join(known)}")
    for table in config:
        if table != "steps" and table not in steps:
            problems.append(f"table [{table}] is not a step listed in `steps` (typo?)")
    if problems:
        raise InputError(f"pipeline config {path}:\n" + "\n".join(f"  - {p}" for p in problems))
    return config


def step_args(step: str, options: dict[str, Any], base: Path) -> list[str]:
    """TOML table -> the command's argv (true -> --flag, false -> its off form, lists -> a,b,c)."""
    off = _off_switches(step)
    args: list[str] = []
    for key, value in options.items():
        opt = f"--{key.replace('_', '-')}"
        if isinstance(value, bool):
            args.append(opt if value else off.get(opt, f"--no-{opt[2:]}"))
            continue
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        if key.replace("_", "-") in PATH_OPTIONS and isinstance(value, str):
            candidate = base / value
            value = str(candidate) if candidate.exists() else value
        args += [opt, str(value)]
    return args


def _off_switches(step: str) -> dict[str, str]:
    """--flag -> its off form for a step's on/off options (``--sid-softmax`` -> ``--full-softmax``)."""
    from gencli.cli import cli

    command = cli.get_command(click.Context(cli, info_name="gencli"), step)
    return {opt: p.secondary_opts[0] for p in (command.params if command else ())
            if isinstance(p, click.Option) and p.secondary_opts for opt in p.opts}


@click.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--init", default=None, help="Override init-vocab's --init (random, mean, centroid, gti).")
@click.option("--model", default=None, help="Override init-vocab's --model (tiny, smollm2-135m or a folder).")
@click.option("--seed", type=int, default=None, help="Override the seed of every seeded step.")
@click.option("--set", "sets", multiple=True, metavar="STEP.OPTION=VALUE", help="Override any option, repeatable.")
@click.option("--force", is_flag=True, help="Rerun every step even when up to date.")
@workdir_option
@JSON_OPTION
def run(config, init, model, seed, sets, force, workdir, json_mode):
    """Run the steps listed in a TOML config in order, skipping those that are up to date.

    \b
    Examples:
      gencli run sample_data/pipeline.toml
      gencli run sample_data/pipeline.toml --init gti --set sft.epochs=3 --json
    """
    from gencli.cli import cli
    from gencli.errors import InputError

    try:
        pipeline = load_pipeline(config)
        tables = {s: dict(pipeline.get(s, {})) for s in pipeline["steps"]}
        for name, value in (("init", init), ("model", model), ("seed", seed)):
            if value is not None:
                for s in OVERRIDES[name]:
                    if s in tables:
                        tables[s][name] = value
        for item in sets:
            target, _, value = item.partition("=")
            s, _, key = target.partition(".")
            if s not in tables or not key or not _:
                raise InputError(f"--set {item!r}: use STEP.OPTION=VALUE with a step listed in {config}")
            tables[s][key] = _parse_value(value)
        base = config.resolve().parent
        step_argv = {step: step_args(step, tables[step], base) for step in pipeline["steps"]}
        check_args(step_argv, config)
    except Exception as e:  # noqa: BLE001
        fail(e, json_mode)
    summary: list[dict[str, Any]] = []
    started = time.time()
    for step in pipeline["steps"]:
        args = [step, *step_argv[step]]
        if workdir:
            args += ["--workdir", str(workdir)]
        if force:
            args.append("--force")
        if json_mode:
            args.append("--json")
        elif step != pipeline["steps"][0]:
            click.echo("")
        t0 = time.time()
        try:
            cli.main(args, prog_name="gencli", standalone_mode=False)
        except SystemExit as e:
            if e.code:
                if not json_mode:
                    click.echo(f"pipeline stopped at '{step}' (exit {e.code})", err=True)
                sys.exit(e.code)
        except click.ClickException as e:  # a bad option in the config
            fail(InputError(f"step '{step}' in {config}: {e.format_message()}"), json_mode)
        summary.append({"step": step, "seconds": round(time.time() - t0, 2)})
    _print_results(workdir, summary, time.time() - started, json_mode)


def check_args(step_argv: dict[str, list[str]], config: Path) -> None:
    """Parse every step's options before any step runs: an unknown option or a bad value stops the run at once
    (exit 2) rather than after the earlier steps have worked for minutes."""
    from gencli.cli import cli
    from gencli.errors import InputError

    root = click.Context(cli, info_name="gencli")
    problems = []
    for step, args in step_argv.items():
        try:
            cli.get_command(root, step).make_context(step, list(args), parent=root)
        except click.ClickException as e:
            problems.append(f"[{step}] {e.format_message()}")
    if problems:
        raise InputError(f"pipeline config {config}:\n" + "\n".join(f"  - {p}" for p in problems))


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _print_results(workdir: Path | None, summary: list[dict], seconds: float, json_mode: bool) -> None:
    from gencli.cli.common import open_workspace
    from gencli.steps import REGISTRY

    ws = open_workspace(workdir)
    results = {}
    for step in (s.name for s in REGISTRY if s.ranking):
        entry = ws.manifest.get(step) if (ws.root / "manifest.json").exists() else None
        if entry and entry.get("status") == "done":
            results[step] = ws.step_record(step)["metrics"]
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json({"status": "done", "seconds": round(seconds, 2), "steps": summary, "results": results})
        return
    from gencli.ui.output import console, ranking_blocks, results_table

    c = console()
    c.print(f"\n[bold green]pipeline finished[/bold green] in {seconds:.1f}s (workdir {ws.root})")
    rows = {f"{step} {group}": block for step, metrics in results.items()
            for group, block in ranking_blocks(metrics).items()}
    if rows:
        c.print(results_table("results", rows))
    if any(s["step"] == "recommend" for s in summary) and ws.freshness("recommend") == "done":
        from gencli.cli.recommend_io import show_examples

        show_examples(ws)  # what the tool is for: a few users' history and their top 5
