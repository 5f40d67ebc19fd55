"""Options generated from the config dataclasses: a command with no options builds exactly the default config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest

from gencli.cli import cli
from gencli.cli.options import CommaList, config_from
from gencli.config import (
    DEVICES,
    CptConfig,
    EmbedConfig,
    EvalConfig,
    IngestConfig,
    InitVocabConfig,
    LoopConfig,
    ProfileConfig,
    QuantizeConfig,
    RlConfig,
    SftConfig,
    ValidationConfig,
    to_dict,
)
from gencli.config.fields import command_line, config_class, step_fields
from gencli.steps import REGISTRY, STEPS

ROOT = click.Context(cli, info_name="gencli")
RECORDED = [s.name for s in REGISTRY if s.recorded]


def _parse(name: str, *args: str) -> dict:
    command = cli.get_command(ROOT, name)
    return command.make_context(name, list(args), parent=ROOT).params


def _build(name: str, *args: str):
    return config_from(name, dict(_parse(name, *args)))


@pytest.mark.parametrize("name", RECORDED)
def test_every_option_default_is_its_config_field_default(name):
    """Each generated option's default and choices are the dataclass field's: no default has a second home."""
    entry = STEPS[name]
    params = {p.name: p for p in cli.get_command(ROOT, name).params}
    for f in step_fields(config_class(entry), name, entry.renames):
        option = params[f.name]
        default = option.type_cast_value(ROOT, option.default) if option.default is not None else None
        assert default == f.default, (name, f.name, option.default, f.default)
        if f.meta.get("choices"):
            assert tuple(option.type.choices) == tuple(f.meta["choices"]), (name, f.name)


@pytest.mark.parametrize("name", RECORDED)
def test_no_options_give_the_config_defaults(name):
    args = ["--items", "x.csv"] if name == "ingest" else []
    cls = config_class(STEPS[name])
    fixed = {"items": str(Path("x.csv").resolve())} if name == "ingest" else {}
    assert to_dict(_build(name, *args)) == to_dict(cls(**fixed))


@pytest.mark.parametrize("name, args", [
    ("sft", ["--epochs", "3", "--stamp", "--full-softmax", "--from", "init-vocab"]),
    ("eval", ["--prune", "--k", "1,5", "--beams", "5", "--include-seen"]),
    ("cold-eval", ["--max-train-count", "0"]),
    ("quantize", ["--levels", "2", "--codes", "64"]),
    ("ingest", ["--items", "x.csv", "--no-dedupe", "--split", "temporal"]),
])
def test_the_recorded_command_line_rebuilds_the_same_config(name, args):
    """step.json's argv is the step's own command: parsed again, it gives the very config that ran."""
    cfg = _build(name, *args)
    argv = command_line(name, cfg)
    assert argv[:2] == ["gencli", name]
    assert to_dict(_build(name, *argv[2:])) == to_dict(cfg)


def test_cold_eval_and_quantize_defaults_live_in_their_configs():
    assert _build("cold-eval").cold_max_train_count == 1 and _build("eval").cold_max_train_count == -1
    q = _build("quantize")
    assert (q.levels, q.codes) == (3, (256, 256, 256)) == (QuantizeConfig().levels, QuantizeConfig().codes)
    assert _build("quantize", "--levels", "2", "--codes", "8,16").codes == (8, 16)
    assert QuantizeConfig(codes=(8, 16)).levels == 2 and QuantizeConfig(levels=2, codes=(8,)).codes == (8, 8)
    assert "levels" not in __import__("gencli.config", fromlist=["params"]).params(QuantizeConfig())


def test_types_choices_and_flags_come_from_the_fields():
    sft = {p.name: p for p in cli.get_command(ROOT, "sft").params}
    assert tuple(sft["device"].type.choices) == DEVICES
    assert sft["lr"].type is click.FLOAT and sft["max_steps"].type is click.INT
    assert sft["sid_softmax"].opts == ["--sid-softmax"] and sft["sid_softmax"].secondary_opts == ["--full-softmax"]
    assert sft["start_from"].opts == ["--from"]
    assert sft["layer"].opts == ["--stamp-layer"] and sft["score"].opts == ["--sap-score"]
    assert sft["lr"].help == LoopConfig.__dataclass_fields__["lr"].metadata["help"]
    assert "text_to_sid" not in sft and "text_to_sid" in {p.name for p in cli.get_command(ROOT, "cpt").params}
    ev = {p.name: p for p in cli.get_command(ROOT, "eval").params}
    assert ev["sap"].opts == ["--prune"] and "map" not in ev and "cold_max_train_count" not in ev
    cold = {p.name: p for p in cli.get_command(ROOT, "cold-eval").params}
    assert cold["cold_max_train_count"].opts == ["--max-train-count"]
    assert isinstance(ev["k"].type, CommaList)


def test_values_reach_the_nested_config():
    cfg = _build("sft", "--sap", "--stamp-layer", "3", "--keep-ratio", "0.25", "--lr", "0.01")
    assert (cfg.stamp.sap, cfg.stamp.map, cfg.stamp.layer, cfg.stamp.keep_ratio, cfg.loop.lr) == \
        (True, False, 3, 0.25, 0.01)
    ev = _build("eval", "--prune", "--k", "1, 5", "--beams", "5")
    assert ev.stamp.sap and ev.k == (1, 5)
    assert _build("cpt", "--stamp").stamp.map and _build("cpt").step == "cpt"


def test_every_field_that_is_an_option_has_help():
    for cls in (IngestConfig, EmbedConfig, QuantizeConfig, InitVocabConfig, EvalConfig, CptConfig, SftConfig, RlConfig,
                LoopConfig, ValidationConfig, ProfileConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
