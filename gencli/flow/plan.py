"""A ``gencli run`` TOML file -> a plan: each listed step with its config object, every problem found before any work.

Each step's table holds its options, spelled as the command's long options (``max-history`` or ``max_history``;
an on/off option by either name, ``full-softmax = true``); lists or comma strings give list options; paths are
relative to the TOML file. The tables become the same config dataclasses the command-line options build
(:mod:`gencli.config.fields`), so a key means exactly what its option means.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gencli.errors import GencliError, InputError


def run_keys() -> tuple[str, ...]:
    """Top-level keys of a pipeline TOML besides ``steps``: :class:`~gencli.config.RunConfig`, spelled as options."""
    from gencli.config import RunConfig
    from gencli.config.fields import step_fields

    return tuple(f.names[0] for f in step_fields(RunConfig))




@dataclass(frozen=True)
class Plan:
    path: Path
    steps: tuple[tuple[str, Any], ...]
    """(step name, its config) in run order."""
    run: Any
    """The :class:`~gencli.config.RunConfig` (--previous, --promote, ...)."""
    previous: Path | None = None
    """The previous run's workdir (--previous resolved, or the one this workdir was first built from)."""


def load_toml(path: Path) -> dict[str, Any]:
    """The TOML file with ``steps`` checked against the registry (exit 2 naming every problem)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from gencli.steps import pipeline_steps

    try:
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"pipeline config {path} does not exist; see sample_data/pipeline.toml for an example") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"pipeline config {path} is not valid TOML: {e}") from None
    steps = config.get("steps")
    problems = []
    if not isinstance(steps, list) or not steps:
        problems.append("`steps` must be a non-empty list, e.g. steps = [\"ingest\", \"embed\", \"quantize\"]")
        steps = []
    known = pipeline_steps()
    problems += [f"unknown step {s!r} in `steps`; choose from {', '.join(known)}" for s in steps if s not in known]
    problems += [f"table [{t}] is not a step listed in `steps` (typo?)" for t in config
                 if t != "steps" and t not in steps and t not in run_keys()]
    if problems:
        raise InputError(f"pipeline config {path}:\n" + "\n".join(f"  - {p}" for p in problems))
    return config


def parse_value(text: str) -> Any:
    """``--set`` values: JSON when they parse (3, true, [5, 10]), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def step_tables(toml: dict[str, Any], path: Path, overrides: dict[str, Any], sets: list[str]) -> dict[str, dict]:
    """Each listed step's table, with --init/--model/--seed and --set STEP.OPTION=VALUE applied."""
    from gencli.steps import overridden_by

    tables = {s: dict(toml.get(s, {})) for s in toml["steps"]}
    for name, value in overrides.items():
        if value is not None:
            for s in overridden_by(name):
                if s in tables:
                    tables[s][name] = value
    for item in sets:
        target, eq, value = item.partition("=")
        s, dot, key = target.partition(".")
        if s not in tables or not key or not dot or not eq:
            raise InputError(f"--set {item!r}: use STEP.OPTION=VALUE with a step listed in {path}")
        tables[s][key] = parse_value(value)
    return tables


def step_config(step: str, table: dict[str, Any], base: Path) -> tuple[Any, list[str]]:
    """(the step's config or None, problems) from its table; keys and values checked like options."""
    from gencli.config.fields import build_step, config_class, step_fields
    from gencli.steps import STEPS

    entry = STEPS[step]
    by_key: dict[str, tuple[Any, bool]] = {}  # TOML key -> (option, whether the key is its on name)
    for f in step_fields(config_class(entry), step, entry.renames):
        on, off = f.names
        for key in {on, on.replace("-", "_"), f.name}:
            by_key[key] = (f, True)
        if off:
            by_key[off] = by_key[off.replace("-", "_")] = (f, False)
    named: dict[str, Any] = {}
    problems = []
    for key, value in table.items():
        if key in entry.aliases:
            if isinstance(value, bool):
                named[key] = value
            else:
                problems.append(f"[{step}] --{key} must be true or false (got {value!r})")
            continue
        if key not in by_key:
            options = sorted({f.names[0] for f, _ in by_key.values()} | set(entry.aliases))
            problems.append(f"[{step}] no such option --{key}; {step}'s options are: {', '.join(options)}")
            continue
        f, on = by_key[key]
        converted, problem = _convert(f, value, base)
        if problem:
            problems.append(f"[{step}] --{key}: {problem}")
        else:
            named[f.name] = converted if on or not isinstance(converted, bool) else not converted
    if problems:
        return None, problems
    try:
        cfg = build_step(step, named)
    except GencliError as e:
        return None, [f"[{step}] {p}" for p in getattr(e, "problems", [str(e)])]
    return cfg, [f"[{step}] {p}" for p in (cfg.required() if hasattr(cfg, "required") else [])]


def _convert(f, value: Any, base: Path) -> tuple[Any, str | None]:
    """A TOML value as the option's type would parse it (None, problem) when it cannot be."""
    kind = f.annotation
    if kind is bool:
        return (value, None) if isinstance(value, bool) else (None, f"must be true or false (got {value!r})")
    if kind in (int, float):  # a quoted number parses as the option would ("3", "0.003")
        wrong = (None, f"must be {'an integer' if kind is int else 'a number'} (got {value!r})")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (kind is int and
                                                                                   isinstance(value, float)):
            return wrong
        try:
            return kind(value), None
        except (ValueError, OverflowError):  # float(10**400) overflows
            return wrong
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        parts = value if isinstance(value, list) else [x.strip() for x in str(value).split(",") if x.strip()]
        try:
            if item is int and any(isinstance(p, (bool, float)) for p in parts):
                raise ValueError
            return tuple(item(p) for p in parts), None
        except (TypeError, ValueError):
            return None, f"must be a list like [5, 10, 20] or \"5,10,20\" (got {value!r})"
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return None, f"must be a string (got {value!r})"
    value = str(value)
    if f.meta.get("path") and value and (base / value).exists():
        value = str(base / value)
    choices = f.meta.get("choices")
    if choices and value not in choices:
        return None, f"must be one of {', '.join(choices)} (got {value!r})"
    return value, None


def run_config(toml: dict[str, Any], given: dict[str, Any], base: Path):
    """RunConfig from the TOML's top-level keys, options given on the command line winning; paths relative to the
    TOML file."""
    from gencli.config import RunConfig

    values = {}
    for key in run_keys():
        if key in toml:
            value = toml[key]
            if key in ("previous", "promote") and isinstance(value, str) and value:
                value = str(base / value)  # an absolute path stays as it is
            values[key.replace("-", "_")] = value
    return RunConfig(**{**values, **given})


def make_plan(path: Path, workdir: Path, given: dict[str, Any], overrides: dict[str, Any] | None = None,
              sets: list[str] | tuple[str, ...] = ()) -> Plan:
    """The whole plan for ``workdir``, or one InputError listing every problem of every step."""
    from gencli.flow.retrain import apply_previous, pin_previous, resolve_previous

    toml = load_toml(path)
    base = path.resolve().parent
    run_cfg = run_config(toml, given, base)
    tables = step_tables(toml, path, overrides or {}, list(sets))
    previous = pin_previous(workdir, resolve_previous(run_cfg.previous) if run_cfg.previous else None)
    if previous is not None:
        apply_previous(tables, previous, run_cfg.requantize)
    return _checked(path, tables, base, run_cfg, previous)


def _checked(path: Path, tables: dict[str, dict], base: Path, run_cfg, previous: Path | None) -> Plan:
    steps, problems = [], []
    for step, table in tables.items():
        cfg, found = step_config(step, table, base)
        problems += found
        steps.append((step, cfg))
    if problems:
        raise InputError(f"pipeline config {path}:\n" + "\n".join(f"  - {p}" for p in problems))
    return Plan(path, tuple(steps), run_cfg, previous)
