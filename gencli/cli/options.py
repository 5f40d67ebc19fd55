"""Click options generated from a step's config dataclass, so each default, type, choice list and help text exists once.

A field becomes its declared option (:mod:`gencli.config.fields`) with the field's default and help. Types: int,
float, str; bool -> ``--x/--no-x``; ``tuple[int, ...]`` -> a comma list (``5,10,20``). The registry adds a step's
renames (eval's ``--prune``) and aliases (``--stamp``); :func:`config_from` builds the config back from the values.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
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


def make_option(f) -> Callable:
    """One click option for one :class:`gencli.config.fields.Field`."""
    kwargs: dict[str, Any] = {"help": f.meta.get("help"), "show_default": True}
    default = f.default
    if f.annotation is bool:
        kwargs.update(default=default)
    elif typing.get_origin(f.annotation) is tuple:
        kwargs.update(type=CommaList(typing.get_args(f.annotation)[0]), default=",".join(str(v) for v in default))
    elif f.meta.get("choices"):
        kwargs.update(type=click.Choice(list(f.meta["choices"])), default=default)
    elif f.meta.get("path"):
        kwargs.update(type=click.Path(), default=default, show_default=default != "")
    else:
        kwargs.update(type=f.annotation, default=default, show_default=default != "")
    if f.meta.get("envvar"):  # a secret (serve's --api-key) is better given in the environment than on argv
        kwargs.update(envvar=f.meta["envvar"], show_envvar=True)
    return click.option(f.decl, f.name, **kwargs)


def config_options(target: str | type) -> Callable:
    """Decorator: one option per field of a step's config (``target`` a step name; in field order), then its
    aliases (``--stamp``); or of a plain command's config class (``run``, ``serve``)."""
    from gencli.config.fields import config_class, step_fields
    from gencli.steps import STEPS

    if isinstance(target, str):
        entry = STEPS[target]
        chosen = step_fields(config_class(entry), target, entry.renames)
        aliases = entry.aliases
    else:
        chosen, aliases = step_fields(target), {}
    names = [f.name for f in chosen]
    assert len(names) == len(set(names)), f"{target}: a nested config repeats an option name"
    options = [make_option(f) for f in chosen]
    options += [click.option(f"--{alias}", alias, is_flag=True, help=f"{' and '.join('--' + n for n in fields)} "
                             "together.") for alias, fields in aliases.items()]

    def decorate(command: Callable) -> Callable:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def config_from(target: str | type, values: dict[str, Any]) -> Any:
    """A step's config (``target`` its name) or a plain command's (its class) from the command's option values;
    may raise ConfigError."""
    from gencli.config.fields import build, build_step, step_fields

    if isinstance(target, str):
        return build_step(target, values)
    return build(target, {f.path: values[f.name] for f in step_fields(target) if f.name in values})
