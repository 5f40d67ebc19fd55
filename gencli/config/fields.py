"""A step's options as its config declares them, without click: names, TOML keys, and the command line of a config.

The click options (:mod:`gencli.cli.options`), ``gencli run``'s TOML tables (:mod:`gencli.flow.plan`) and the
command line each ``step.json`` records all read a field's declaration from here, so an option is spelled once.
A nested config's fields are options of their own (``stamp.sap`` is ``--sap``, or eval's ``--prune``).
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from typing import Any

from gencli.config.base import declared, json_ready


@dataclasses.dataclass(frozen=True)
class Field:
    """One option of one step."""

    name: str
    """The dataclass field (in a nested config: its own name, e.g. ``sap``)."""
    path: tuple[str, ...]
    """Where it sits in the step's config: ``("stamp", "sap")``."""
    annotation: Any
    field: dataclasses.Field
    decl: str
    """The click declaration: ``--epochs``, ``--dedupe/--no-dedupe``, ``--from``."""

    @property
    def default(self) -> Any:
        f = self.field
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]

    @property
    def names(self) -> tuple[str, str | None]:
        """(on name, off name or None), without dashes: ``("dedupe", "no-dedupe")``, ``("from", None)``."""
        on, _, off = self.decl.partition("/")
        return on[2:], (off[2:] if off else None)

    @property
    def meta(self) -> Any:
        return self.field.metadata


def step_fields(cls: type, step: str | None = None, renames: dict[str, str] | None = None,
                _path: tuple[str, ...] = ()) -> list[Field]:
    """Every option of ``step`` in ``cls``, in field order (nested configs flattened)."""
    hints = typing.get_type_hints(cls)
    out: list[Field] = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if meta.get("cli") is False or (step is not None and meta.get("steps") and step not in meta["steps"]):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            out += step_fields(hints[f.name], step, renames, (*_path, f.name))
            continue
        decl = (renames or {}).get(f.name) or declared(f)
        if hints[f.name] is bool and "/" not in decl:
            decl = f"{decl}/--no-{decl[2:]}"
        out.append(Field(f.name, (*_path, f.name), hints[f.name], f, decl))
    return out


def build(cls: type, values: dict[tuple[str, ...], Any]) -> Any:
    """``cls`` from option values keyed by field path (nested configs built from theirs); may raise ConfigError.

    A path option that names a previous run or an input file (default empty) is made absolute, so ``step.json``
    records where it was, whatever the working directory of a rerun."""
    from pathlib import Path

    def make(kind: type, prefix: tuple[str, ...]) -> Any:
        hints = typing.get_type_hints(kind)
        kwargs = {}
        for f in dataclasses.fields(kind):
            key = (*prefix, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                kwargs[f.name] = make(hints[f.name], key)
            elif key in values:
                value = values[key]
                if f.metadata.get("path") and f.default == "" and isinstance(value, str) and value:
                    value = str(Path(value).resolve())
                kwargs[f.name] = value
        return kind(**kwargs)

    return make(cls, ())


def config_class(entry: Any) -> type:
    """A registry row's config class: the class itself, ``module:Class``, or a class name in :mod:`gencli.config`."""
    if isinstance(entry.config, type):
        return entry.config
    module, _, name = entry.config.rpartition(":")
    return getattr(importlib.import_module(module or "gencli.config"), name)


def build_step(step: str, values: dict[str, Any]) -> Any:
    """A step's config from option values keyed by field name (a nested field by its own name, as click names
    them) and alias flags (``stamp``: true turns its fields on)."""
    from gencli.steps import STEPS

    entry = STEPS[step]
    named = dict(values)
    for alias, fields in entry.aliases.items():
        if named.pop(alias, False):
            named.update(dict.fromkeys(fields, True))
    cls = config_class(entry)
    by_path = {f.path: named[f.name] for f in step_fields(cls, step, entry.renames) if f.name in named}
    return build(cls, by_path)


def command_line(step: str, cfg: Any, workdir: str | None = None) -> list[str]:
    """The ``gencli STEP ...`` command that runs this config by hand: every option that differs from its default."""
    from gencli.steps import STEPS

    entry = STEPS[step]
    argv = ["gencli", step]
    for f in step_fields(type(cfg), step, entry.renames):
        value = cfg
        for part in f.path:
            value = getattr(value, part)
        if json_ready(value) == json_ready(f.default):
            continue
        on, off = f.names
        if f.annotation is bool:
            argv.append(f"--{on}" if value else f"--{off}")
        elif isinstance(value, tuple):
            argv += [f"--{on}", ",".join(str(v) for v in value)]
        else:
            argv += [f"--{on}", str(value)]
    if workdir:
        argv += ["--workdir", str(workdir)]
    return argv
