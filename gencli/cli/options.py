"""Click options generated from a config dataclass, so each default, type, choice list and help text exists once.

A field becomes ``--field-name`` with the field's default and the help in its metadata (see
:func:`gencli.config.option`). Types: int, float, str; bool -> ``--x/--no-x``; ``tuple[int, ...]`` -> a comma
list (``5,10,20``). Metadata may rename the option (``--from``), restrict it to some steps of a shared config
(``steps=("sft",)``), or keep a field off the command line (``cli=False``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable
from typing import Any

import click


class CommaList(click.ParamType):
    """'5,10,20' -> (5, 10, 20); a bad item is a usage error (exit 2) naming the option."""

    def __init__(self, item: type = int):
        self.item = item
        self.name = "INTS" if item is int else "LIST"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple:
        if isinstance(value, (tuple, list)):
            return tuple(value)
        parts = [x.strip() for x in str(value).split(",") if x.strip()]
        try:
            return tuple(self.item(x) for x in parts)
        except ValueError:
            kind = "integers" if self.item is int else "values"
            self.fail(f"{value!r} is not a comma-separated list of {kind}, e.g. 5,10,20", param, ctx)


def fields_for(cls: type, step: str | None = None, exclude: Iterable[str] = ()) -> list[tuple[dataclasses.Field, Any]]:
    """(field, type) of each option of ``step`` in ``cls``; a nested config's fields are options of their own."""
    skip = set(exclude)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if f.name in skip or meta.get("cli") is False:
            continue
        if step is not None and meta.get("steps") and step not in meta["steps"]:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            out += fields_for(hints[f.name], step, exclude)
        else:
            out.append((f, hints[f.name]))
    return out


def field_help(cls: type, name: str) -> str:
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("help", "")


def values_for(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``cls`` among a command's option values (nested configs built from theirs)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out[f.name] = hints[f.name](**values_for(hints[f.name], values))
        elif f.name in values:
            out[f.name] = values[f.name]
    return out


def make_option(f: dataclasses.Field, annotation: Any, decl: str | None = None) -> Callable:
    """One click option for one dataclass field."""
    meta = f.metadata
    decl = decl or meta.get("option") or "--" + f.name.replace("_", "-")
    kwargs: dict[str, Any] = {"help": meta.get("help"), "show_default": True}
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    origin = typing.get_origin(annotation)
    if annotation is bool:
        if "/" not in decl:
            decl = f"{decl}/--no-{decl[2:]}"
        kwargs.update(default=default)
    elif origin is tuple:
        item = typing.get_args(annotation)[0]
        kwargs.update(type=CommaList(item), default=",".join(str(v) for v in default))
    elif meta.get("choices"):
        kwargs.update(type=click.Choice(list(meta["choices"])), default=default)
    else:
        kwargs.update(type=annotation, default=default)
        kwargs.update(show_default=default != "")
    return click.option(decl, f.name, **kwargs)


def config_options(cls: type, step: str | None = None, exclude: Iterable[str] = (),
                   rename: dict[str, str] | None = None) -> Callable:
    """Decorator: one option per field of ``cls`` (in field order) for the command of ``step``; ``rename`` gives
    one command its own declaration for a field (eval's ``--prune`` for ``stamp.sap``).

    The command receives each field under its own name; :func:`values_for` turns them back into ``cls``'s arguments.
    """
    chosen = fields_for(cls, step, exclude)
    names = [f.name for f, _ in chosen]
    assert len(names) == len(set(names)), f"{cls.__name__}: a nested config repeats an option name"
    options = [make_option(f, annotation, (rename or {}).get(f.name)) for f, annotation in chosen]

    def decorate(command: Callable) -> Callable:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate
