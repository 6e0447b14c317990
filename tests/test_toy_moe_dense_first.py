"""Toy MoE with a dense first layer (``--dense-first``): the one-layer draft loads no expert."""

from types import SimpleNamespace

import pytest

from dsdprof.errors import InputError
from dsdprof.measure.toy_models import _hf_config, toy_config

TOK = SimpleNamespace(bos_token_id=0, eos_token_id=1, pad_token_id=2)


def test_dense_first_marks_layer_zero_dense_in_target_and_draft():
    cfg = toy_config("moe", num_layers=4, num_experts=8, experts_per_token=2, dense_first=True)
    target, draft = _hf_config(cfg, cfg.num_layers, TOK), _hf_config(cfg, 1, TOK)
    assert target.mlp_only_layers == [0] and draft.mlp_only_layers == [0]
    assert target.num_experts == 8 and target.num_hidden_layers == 4


def test_default_moe_keeps_every_layer_moe():
    cfg = toy_config("moe")
    assert cfg.dense_first is False
    assert _hf_config(cfg, cfg.num_layers, TOK).mlp_only_layers == []


def test_dense_first_on_a_dense_model_is_an_input_error():
    with pytest.raises(InputError, match="dense-first"):
        toy_config("dense", dense_first=True)


def test_sim_counts_the_dense_first_layer_as_dense(tmp_path):
    """The analytic engine reads mlp_only_layers: 3 MoE layers in the target, none in the draft."""
    from dsdprof.measure.sim.hfconfig import load_hf_config

    cfg = toy_config("moe", num_layers=4, num_experts=8, experts_per_token=2, dense_first=True)
    for name, n in (("target", 4), ("draft", 1)):
        _hf_config(cfg, n, TOK).save_pretrained(str(tmp_path / name))
    assert load_hf_config(tmp_path / "target" / "config.json").moe_layers == 3
    assert load_hf_config(tmp_path / "draft" / "config.json").moe_layers == 0
