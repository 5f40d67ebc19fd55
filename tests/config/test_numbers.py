"""One rule for every number of every config (gencli.config.base.number_problems): floats finite, ints in int64,
both in their declared bounds; a bad value is exit 2 naming the option, whichever way it arrives (an option,
a TOML table, --set), before any work."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest
from click.testing import CliRunner

from gencli.cli import cli
from gencli.config import RunConfig, ServeConfig, StampConfig, config_class
from gencli.config.base import SEED_BOUNDS
from gencli.errors import ConfigError
from gencli.steps import REGISTRY


def _configs() -> list[tuple[str, type, dict]]:
    """Every config class a command builds: each step's, run's and serve's."""
    out = [(s.name, config_class(s), {}) for s in REGISTRY if s.config]
    return [*out, ("run", RunConfig, {}), ("serve", ServeConfig, {})]


def _numbers(cls: type, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], type, dataclasses.Field]]:
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            found += _numbers(hints[f.name], (*path, f.name))
        elif hints[f.name] in (int, float) or typing.get_args(hints[f.name])[:1] in ((int,), (float,)):
            found.append(((*path, f.name), hints[f.name], f))
    return found


def _with(cls: type, fixed: dict, path: tuple[str, ...], value):
    if len(path) == 1:
        return cls(**{**fixed, path[0]: value})
    nested = dataclasses.replace(getattr(cls(**fixed), path[0]), **{path[1]: value})
    return cls(**{**fixed, path[0]: nested})


CASES = [(name, cls, fixed, path, kind, f) for name, cls, fixed in _configs() for path, kind, f in _numbers(cls)]


@pytest.mark.parametrize("name, cls, fixed, path, kind, f", CASES,
                         ids=[f"{c[0]}.{'.'.join(c[3])}" for c in CASES])
def test_every_number_of_every_config_is_checked(name, cls, fixed, path, kind, f):
    """inf and nan for a float, 2**64 for an int: refused, naming the option (new configs get this by passing
    ``self`` to Checks)."""
    option = (f.metadata.get("option") or "--" + f.name.replace("_", "-")).partition("/")[0]
    bad = [math.inf, -math.inf, math.nan] if kind is float else [2**64, -(2**64)]
    if typing.get_origin(kind) is tuple:  # a list option (eval --k 5,10): each value
        bad = [(5, 2**64)] if typing.get_args(kind)[0] is int else [(1.0, math.inf)]
    for value in bad:
        with pytest.raises(ConfigError) as caught:
            _with(cls, fixed, path, value)
        assert any(p.startswith(f"{option} must be") for p in caught.value.problems), (value, caught.value.problems)
        assert len([p for p in caught.value.problems if p.startswith(option + " ")]) == 1  # said once


def test_seeds_are_numpy_seeds_and_float_bounds_are_declared():
    from gencli.config import SftConfig

    assert SftConfig(seed=SEED_BOUNDS[1]).seed == 2**32 - 1
    with pytest.raises(ConfigError, match=r"--seed must be an integer in \[0, 4294967295\] \(got -1\)"):
        SftConfig(seed=-1)
    with pytest.raises(ConfigError, match=r"--watch must be a number in \[0, 86400\] \(got 1e\+300\)"):
        ServeConfig(watch=1e300)
    with pytest.raises(ConfigError, match="--keep-ratio must be a finite number"):
        SftConfig(stamp=StampConfig(keep_ratio=math.nan))


@pytest.mark.parametrize("args, named", [
    (["sft", "--lr", "inf"], "--lr must be a finite number (got inf)"),
    (["sft", "--lr", "1e400"], "--lr must be a finite number (got inf)"),
    (["sft", "--max-grad-norm", "nan"], "--max-grad-norm must be a finite number (got nan)"),
    (["sft", "--seed", "99999999999999999999999"], "--seed must be an integer in [0, 4294967295]"),
    (["eval", "--seed", "-5"], "--seed must be an integer in [0, 4294967295] (got -5)"),
])
def test_options_refuse_non_finite_and_out_of_range_numbers(tmp_path, args, named):
    result = CliRunner().invoke(cli, [*args, "--workdir", str(tmp_path / "w"), "--json"])
    assert result.exit_code == 2, result.output
    assert named in json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("setting, named", [
    ("sft.seed=99999999999999999999999", "[sft] --seed must be an integer in [0, 4294967295]"),
    ("sft.lr=1e400", "[sft] --lr must be a finite number (got inf)"),
    ("sft.lr=" + "9" * 400, "[sft] --lr: must be a number"),
    ("quantize.seed=-1", "[quantize] --seed must be an integer in [0, 4294967295] (got -1)"),
])
def test_pipeline_sets_refuse_them_before_any_step(tmp_path, sample_dir, setting, named):
    result = CliRunner().invoke(cli, ["run", str(sample_dir / "pipeline.toml"), "--set", setting, "--workdir",
                                      str(tmp_path / "w"), "--json"])
    assert result.exit_code == 2, result.output
    assert named in json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert "Traceback" not in result.output and not (tmp_path / "w").exists()
