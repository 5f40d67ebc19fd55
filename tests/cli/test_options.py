"""Options generated from the config dataclasses: a command with no options builds exactly the default config."""

from __future__ import annotations

import dataclasses

import click
import pytest

from gencli.cli import cli
from gencli.cli.options import CommaList, values_for
from gencli.config import (
    DEVICES,
    EmbedConfig,
    EvalConfig,
    IngestConfig,
    InitVocabConfig,
    ProfileConfig,
    QuantizeConfig,
    TrainConfig,
    to_dict,
)

ROOT = click.Context(cli, info_name="gencli")


def _parse(name: str, *args: str) -> dict:
    command = cli.get_command(ROOT, name)
    return command.make_context(name, list(args), parent=ROOT).params


@pytest.mark.parametrize("name, cls, fixed", [
    ("ingest", IngestConfig, {}),
    ("embed", EmbedConfig, {}),
    ("init-vocab", InitVocabConfig, {}),
    ("eval", EvalConfig, {}),
    ("cold-eval", EvalConfig, {}),
    ("cpt", TrainConfig, {"task": "cpt"}),
    ("sft", TrainConfig, {"task": "sft"}),
    ("profile", ProfileConfig, {}),
])
def test_no_options_give_the_config_defaults(name, cls, fixed):
    args = ["--items", "x.csv"] if name == "ingest" else []
    built = cls(**{**values_for(cls, _parse(name, *args)), **fixed})
    assert to_dict(built) == to_dict(cls(**fixed))


def test_quantize_defaults_and_levels():
    params = _parse("quantize")
    assert params["levels"] * params["codes"] == QuantizeConfig().codes
    assert {k: v for k, v in params.items() if k in {f.name for f in dataclasses.fields(QuantizeConfig)}} == {
        "codes": (256,), "max_iter": 50, "seed": 0, "batch_size": 65536, "kmeans": "auto", "minibatch_size": 4096,
        "minibatch_steps": 300, "device": "auto", "codebooks_from": None, "collab": QuantizeConfig().collab,
        "collab_dim": 64, "cold_collab": "text"}


def test_types_choices_and_flags_come_from_the_fields():
    sft = {p.name: p for p in cli.get_command(ROOT, "sft").params}
    assert tuple(sft["device"].type.choices) == DEVICES
    assert sft["lr"].type is click.FLOAT and sft["max_steps"].type is click.INT
    assert sft["sid_softmax"].opts == ["--sid-softmax"] and sft["sid_softmax"].secondary_opts == ["--full-softmax"]
    assert sft["start_from"].opts == ["--from"]
    assert sft["layer"].opts == ["--stamp-layer"] and sft["score"].opts == ["--sap-score"]
    assert sft["lr"].help == TrainConfig.__dataclass_fields__["lr"].metadata["help"]
    assert "text_to_sid" not in sft and "text_to_sid" in {p.name for p in cli.get_command(ROOT, "cpt").params}
    ev = {p.name: p for p in cli.get_command(ROOT, "eval").params}
    assert ev["sap"].opts == ["--prune"] and "map" not in ev and "cold_max_train_count" not in ev
    assert isinstance(ev["k"].type, CommaList)


def test_values_reach_the_nested_config():
    params = _parse("sft", "--sap", "--stamp-layer", "3", "--keep-ratio", "0.25", "--lr", "0.01")
    cfg = TrainConfig(**values_for(TrainConfig, params))
    assert (cfg.stamp.sap, cfg.stamp.map, cfg.stamp.layer, cfg.stamp.keep_ratio, cfg.lr) == (True, False, 3, 0.25, 0.01)
    ev = EvalConfig(**values_for(EvalConfig, _parse("eval", "--prune", "--k", "1, 5", "--beams", "5")))
    assert ev.stamp.sap and ev.k == (1, 5)


def test_every_field_that_is_an_option_has_help():
    for cls in (IngestConfig, EmbedConfig, QuantizeConfig, InitVocabConfig, EvalConfig, TrainConfig, ProfileConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
