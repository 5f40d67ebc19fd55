"""What every step config shares: documented fields (:func:`option`), their JSON form, the collected checks."""

from __future__ import annotations

import dataclasses
from typing import Any

from gencli.errors import ConfigError
from gencli.steps import model_steps

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MODEL_STEP_CHOICES = ("auto", *reversed(model_steps()))  # --model-step: auto, rl, sft, cpt, init-vocab
RANKINGS = ("auto", "model")  # the fitted blend of model and content, or the generative model alone


def option(default: Any, help: str, **cli: Any) -> Any:
    """A documented field: its default and the help ``--help`` shows. ``cli`` may hold ``choices``, ``option``
    (the declaration, e.g. ``--from`` or ``--dedupe/--no-dedupe``), ``steps`` (the commands of a shared config
    that have it), ``cli=False`` (not an option), ``path=True`` (a file or folder: a ``gencli run`` TOML gives it
    relative to the TOML), ``record=False`` (not a param of ``step.json``: an input file, hashed as an input) or
    ``bounds=(low, high)`` (the range of a number, checked with every config: :func:`number_problems`) or, for a
    nested config, ``flat=True`` (its fields sit beside its parent's in ``step.json`` and the fingerprint: the
    training loop's part of cpt, sft and rl). A value outside ``choices`` is a problem :meth:`Checks.done` names,
    unless ``check=False`` (the config checks it)."""
    return dataclasses.field(default=default, metadata={"help": help, **cli})


def declared(f: dataclasses.Field) -> str:
    """A field's option declaration: its ``option`` (``--from``, ``--dedupe/--no-dedupe``) or ``--field-name``."""
    return f.metadata.get("option") or "--" + f.name.replace("_", "-")


INT_BOUNDS = (-(2**63), 2**63 - 1)  # every int option: torch, numpy and Parquet hold int64
SEED_BOUNDS = (0, 2**32 - 1)  # numpy's seeds


def seed_option(help: str) -> Any:
    return option(0, help, bounds=SEED_BOUNDS)


def number_problems(cfg: Any) -> dict[str, str]:
    """The one rule every config's numbers follow, whatever the option: a float is finite (``inf`` and ``nan`` parse
    as floats on a command line and in TOML, and pass a ``> 0`` check), an int fits in int64, and either lies in
    its declared ``bounds``. Nested configs are checked too. Returns option name -> problem."""
    import math
    import typing

    found: dict[str, str] = {}
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        kind, value = hints.get(f.name), getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            found.update(number_problems(value))
            continue
        if typing.get_origin(kind) is tuple and isinstance(value, tuple):  # a list option: each of its values
            kind, values = typing.get_args(kind)[0], value
        else:
            values = (value,)
        if kind not in (int, float):
            continue
        name = declared(f).partition("/")[0]
        low, high = f.metadata.get("bounds", INT_BOUNDS if kind is int else (-math.inf, math.inf))
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue  # a wrong type is Checks.types' (or click's) to report
            if isinstance(v, float) and not math.isfinite(v):
                found[name] = f"{name} must be a finite number (got {v!r})"
            elif not low <= v <= high:
                what, show = ("an integer", str) if kind is int else ("a number", "{:g}".format)
                found[name] = f"{name} must be {what} in [{show(low)}, {show(high)}] (got {v!r})"
            else:
                continue
            break
    return found


def to_dict(cfg: Any) -> dict[str, Any]:
    """JSON-ready dict of a config (tuples become lists, nested configs dicts; a ``flat`` part's fields beside its
    parent's)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and f.metadata.get("flat"):
            out.update(to_dict(value))
        else:
            out[f.name] = to_dict(value) if dataclasses.is_dataclass(value) else json_ready(value)
    return out


def params(cfg: Any) -> dict[str, Any]:
    """What ``step.json`` records under ``params`` (and the fingerprint hashes): every field but input files, or
    what the config's own ``record()`` says (cpt, sft, rl: :func:`gencli.config.train.train_record`; init-vocab:
    :meth:`gencli.config.vocab.InitVocabConfig.record`)."""
    if hasattr(cfg, "record"):
        return cfg.record()
    skip = {f.name for f in dataclasses.fields(cfg) if f.metadata.get("record") is False}
    return {k: v for k, v in to_dict(cfg).items() if k not in skip}


def from_dict(cls: type, params: dict[str, Any]) -> Any:
    """The config a ``step.json`` recorded (``to_dict``'s inverse): lists become tuples, nested configs are
    rebuilt (a ``flat`` part from the same keys), keys the dataclass does not know are ignored."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default) and f.metadata.get("flat"):
            kwargs[f.name] = from_dict(type(f.default), params)
            continue
        if f.name not in params:
            continue
        value = params[f.name]
        if dataclasses.is_dataclass(f.default) and isinstance(value, dict):
            value = from_dict(type(f.default), value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


MAX_BEAMS = 4096  # one search's beams: past this, one prompt's beams alone outgrow memory on a large vocabulary


class Checks:
    """Collects problems; raises once at the end. Given the config (``Checks(step, self)``), :meth:`done` also
    applies :func:`number_problems` to every number of it, and drops the other problems of an option that rule
    already names (``nan`` is not "> 0" either)."""

    def __init__(self, step: str, cfg: Any = None):
        self.step = step
        self.cfg = cfg
        self.problems: list[str] = []

    def require(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def choice(self, name: str, value: Any, allowed: tuple) -> None:
        self.require(value in allowed, f"--{name} must be one of {', '.join(map(str, allowed))} (got {value!r})")

    def positive(self, name: str, value: float, allow_zero: bool = False) -> None:
        ok = value >= 0 if allow_zero else value > 0
        self.require(ok, f"--{name} must be {'>= 0' if allow_zero else '> 0'} (got {value!r})")

    def done(self) -> None:
        numbers = number_problems(self.cfg) if self.cfg is not None else {}
        if self.cfg is not None:  # every field declared with choices holds one of them (listed first, in field order)
            checks, self.problems = self.problems, []
            self._choices(self.cfg)
            self.problems += checks
        rest = [p for p in self.problems if p.split(" ", 1)[0] not in numbers]
        if numbers or rest:
            raise ConfigError(self.step, [*numbers.values(), *rest])

    def _choices(self, cfg: Any) -> None:
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            if dataclasses.is_dataclass(value):  # a nested config's fields are options too
                self._choices(value)
            elif "choices" in f.metadata and f.metadata.get("check", True):
                self.choice(declared(f).partition("/")[0][2:], value, tuple(f.metadata["choices"]))

    def types(self, cfg: Any) -> None:
        """Raise at once, listing every field whose value is not of its declared plain type (int, float, bool,
        str): values that reach a config without click (TOML top-level keys) get the checks options get."""
        import dataclasses
        import typing

        hints = typing.get_type_hints(type(cfg))
        wrong = []
        for f in dataclasses.fields(cfg):
            kind, value = hints.get(f.name), getattr(cfg, f.name)
            if kind is bool:
                ok = isinstance(value, bool)
            elif kind is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif kind is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            elif kind is str:
                ok = isinstance(value, str)
            else:
                continue
            if not ok:
                wrong.append(f"--{f.name.replace('_', '-')} must be {'a' if kind is not int else 'an'} "
                             f"{kind.__name__} (got {value!r})")
        if wrong:
            raise ConfigError(self.step, wrong)


def device_option(help: str = "Where to run: auto picks cuda when available.") -> Any:
    return option("auto", help, choices=DEVICES)


def dtype_option() -> Any:
    return option("auto", "Weights' dtype: auto = bfloat16 on a GPU that supports it, else float32.", choices=DTYPES)


def model_step_option(help: str) -> Any:
    return option("auto", help, choices=MODEL_STEP_CHOICES)
