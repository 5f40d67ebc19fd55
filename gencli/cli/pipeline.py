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

from gencli.cli.common import fail, workdir_option
from gencli.cli.options import config_options
from gencli.config import RunConfig
from gencli.errors import EXIT_NOT_PROMOTED

# Options that name files: resolved relative to the config file's folder.
PATH_OPTIONS = {"items", "interactions", "codebooks-from", "model", "reuse-from", "warm-start"}
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
        if table != "steps" and table not in steps and table not in RUN_KEYS:
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


RUN_KEYS = ("previous", "requantize", "promote", "promote-tolerance", "promote-users", "keep-bundles")
"""Top-level keys of a pipeline TOML besides ``steps``: :class:`~gencli.config.RunConfig`, spelled as options."""


@click.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--init", default=None, help="Override init-vocab's --init (random, mean, centroid, gti).")
@click.option("--model", default=None, help="Override init-vocab's --model (tiny, smollm2-135m or a folder).")
@click.option("--seed", type=int, default=None, help="Override the seed of every seeded step.")
@click.option("--set", "sets", multiple=True, metavar="STEP.OPTION=VALUE", help="Override any option, repeatable.")
@config_options(RunConfig)
@click.option("--force", is_flag=True, help="Rerun every step even when up to date.")
@workdir_option
@click.option("--json", "json_mode", is_flag=True,
              help="Print one JSON object at the end (every step's result, the retrain report, the promotion); "
                   "no progress bars.")
@click.pass_context
def run(ctx, config, init, model, seed, sets, force, workdir, json_mode, **options):
    """Run the steps listed in a TOML config in order, skipping those that are up to date.

    A nightly retrain passes --previous (yesterday's workdir or the promoted link) and --promote LINK; exit
    codes: 0 done (and promoted), 4 done but not promoted, else the failing step's code (docs/cron.md).

    \b
    Examples:
      gencli run sample_data/pipeline.toml
      gencli run sample_data/pipeline.toml --init gti --set sft.epochs=3 --json
      gencli run pipeline.toml --workdir runs/$(date +%F) --previous current --promote current
    """
    from gencli.cli import cli
    from gencli.errors import InputError

    try:
        pipeline = load_pipeline(config)
        base = config.resolve().parent
        run_cfg = _run_config(ctx, pipeline, options, base)
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
        from gencli.cli.common import open_workspace
        from gencli.cli.retrain import apply_previous, pin_previous, resolve_previous

        root = open_workspace(workdir).root
        previous = pin_previous(root, resolve_previous(run_cfg.previous) if run_cfg.previous else None)
        if previous is not None:
            apply_previous(tables, previous, run_cfg.requantize)
        step_argv = {step: step_args(step, tables[step], base) for step in pipeline["steps"]}
        check_args(step_argv, config)
    except Exception as e:  # noqa: BLE001
        fail(e, json_mode)
    from gencli.ui.progress import log_event

    summary: list[dict[str, Any]] = []
    started = time.time()
    # with --promote, the steps that write what batch consumers read run only once this run's model serves: a night
    # that is not promoted leaves no recommendations.parquet that looks current
    deferred = [s for s in pipeline["steps"] if s in SERVING_STEPS] if run_cfg.promote else []
    log_event(f"gencli run {config}: started; workdir {root}; steps {', '.join(pipeline['steps'])}"
              + (f"; previous {previous}" if previous else "") + (f"; promote {run_cfg.promote}" if run_cfg.promote
                                                                  else ""))

    def run_one(step: str) -> None:
        args = [step, *step_argv[step]]
        if workdir:
            args += ["--workdir", str(workdir)]
        if force:
            args.append("--force")
        if json_mode:
            args.append("--json")
        elif summary:
            click.echo("")
        t0 = time.time()
        before = _finished(root, step)
        log_event(f"step {step}: started")
        code, result = _run_step(cli, args, json_mode)
        if code == -1:  # a bad option in the config
            fail(InputError(f"step '{step}' in {config}: {result['error']}"), json_mode)
        entry = {"step": step, "seconds": round(time.time() - t0, 2)}
        if json_mode:
            entry.update({k: v for k, v in result.items() if k != "step"})
        if code:
            entry["status"] = f"failed (exit {code})"
        elif entry.get("status") not in ("done", "up-to-date"):  # without --json: from the manifest
            entry["status"] = "up-to-date" if before is not None and _finished(root, step) == before else "done"
        log_event(f"step {step}: {entry['status']} in {entry['seconds']:.1f} s")
        summary.append(entry)
        if code:
            line = summary_line(summary, None)
            log_event(f"gencli run: stopped at '{step}', exit {code} after {time.time() - started:.1f} s; {line}")
            if json_mode:
                from gencli.ui.output import emit_json

                emit_json({"status": "error", "exit_code": code, "failed_step": step, "error": result.get("error"),
                           "seconds": round(time.time() - started, 2), "steps": summary, "summary": line})
            else:
                click.echo(f"pipeline stopped at '{step}' (exit {code})", err=True)
            sys.exit(code)

    for step in pipeline["steps"]:
        if step not in deferred:
            run_one(step)
    extra: dict[str, Any] = {}
    try:
        from gencli.cli.retrain import promote, record_previous, retrain_report

        record_previous(root, previous)
        if previous is not None:
            extra["retrain"] = retrain_report(root, previous, run_cfg.requantize)
        if run_cfg.promote:
            log_event(f"promotion: scoring this run's bundle against {run_cfg.promote}")
            extra["promotion"] = promote(root, Path(run_cfg.promote), run_cfg.promote_tolerance,
                                         run_cfg.promote_users, run_cfg.keep_bundles)
            decision = extra["promotion"]
            log_event(f"promotion: {'promoted' if decision['promoted'] else 'not promoted'}: {decision['reason']}")
    except Exception as e:  # noqa: BLE001
        log_event(f"gencli run: failed after the steps ({type(e).__name__}); {summary_line(summary, None)}")
        fail(e, json_mode)
    for step in deferred:
        if extra["promotion"]["promoted"]:
            run_one(step)
        else:
            summary.append({"step": step, "seconds": 0.0, "status": "skipped",
                            "reason": "not promoted: this run's model does not serve, so its recommendations would "
                                      f"not be what {run_cfg.promote} answers (`gencli recommend --bundle "
                                      f"{run_cfg.promote} --output FILE` scores the serving model)"})
            log_event(f"step {step}: skipped (not promoted)")
    line = summary_line(summary, extra.get("promotion"))
    code = EXIT_NOT_PROMOTED if "promotion" in extra and not extra["promotion"]["promoted"] else 0
    log_event(f"gencli run: finished, exit {code} after {time.time() - started:.1f} s; {line}")
    _print_results(workdir, summary, time.time() - started, json_mode, {**extra, "summary": line})
    if code:
        sys.exit(code)


SERVING_STEPS = ("recommend",)
"""Steps whose output batch consumers take as what serves: with --promote they run after a promotion, and not at
all when the run is not promoted."""


def _finished(root: Path, step: str) -> str | None:
    """When ``step`` last finished in the workdir's manifest (None before its first run)."""
    from gencli.workspace.manifest import Manifest

    if not (root / "manifest.json").is_file():
        return None
    try:
        entry = Manifest(root).get(step)
    except Exception:  # noqa: BLE001 - a damaged manifest is the step's own error to report
        return None
    return entry.get("finished") if entry else None


def summary_line(summary: list[dict[str, Any]], promotion: dict[str, Any] | None) -> str:
    """One line for a log: each step's status, then the promotion decision (``summary`` of ``run --json``)."""
    steps = ", ".join(f"{s['step']} {s['status']}" for s in summary) or "no step ran"
    if promotion is None:
        return f"steps: {steps}"
    verdict = "promoted" if promotion["promoted"] else "not promoted"
    return f"steps: {steps}; promotion: {verdict} ({promotion['reason']})"


def _run_config(ctx: click.Context, pipeline: dict[str, Any], options: dict[str, Any], base: Path) -> RunConfig:
    """RunConfig from the TOML's top-level keys, with the command line winning; paths relative to the config."""
    values = {}
    for key in RUN_KEYS:
        if key in pipeline:
            value = pipeline[key]
            if key in ("previous", "promote") and isinstance(value, str) and value:
                value = str(base / value)  # an absolute path stays as it is
            values[key.replace("-", "_")] = value
    for name, value in options.items():
        if name not in values or ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            values[name] = value
    return RunConfig(**values)


def _run_step(cli: click.Group, args: list[str], json_mode: bool) -> tuple[int, dict[str, Any]]:
    """Run one step command; (exit code, its JSON result in --json mode, where its stdout is captured so that
    ``run --json`` prints one object). Exit code -1: click rejected an option."""
    import contextlib
    import io

    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out) if json_mode else contextlib.nullcontext():
        try:
            cli.main(args, prog_name="gencli", standalone_mode=False)
        except SystemExit as e:
            code = int(e.code or 0)
        except click.ClickException as e:
            return -1, {"error": e.format_message()}
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("{")]
    return code, (json.loads(lines[-1]) if lines else {})


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


def _print_results(workdir: Path | None, summary: list[dict], seconds: float, json_mode: bool,
                   extra: dict[str, Any]) -> None:
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

        emit_json({"status": "done", "seconds": round(seconds, 2), "steps": summary, "results": results, **extra})
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
    if "retrain" in extra:
        r = extra["retrain"]
        c.print(f"retrain from {r['previous']}: items kept {r.get('items_kept', '-')}, added "
                f"{r.get('items_added', '-')}, removed {r.get('items_removed', '-')}, SID changed "
                f"{r.get('sid_changed', '-')}; embedded {r.get('embed.items_encoded', '-')} (reused "
                f"{r.get('embed.items_reused', '-')}); init-vocab warm start from {r.get('init-vocab.warm_start_from')}")
    if extra.get("promotion"):
        p = extra["promotion"]
        verdict = "[green]promoted[/green]" if p["promoted"] else "[yellow]not promoted[/yellow] (exit 4)"
        c.print(f"{verdict}: {p['reason']}; bundle {p['bundle']}")
