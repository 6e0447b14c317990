"""Toy MoE with a dense first layer (``--dense-first``): the one-layer draft loads no expert."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from dsdprof.errors import InputError
from dsdprof.measure.toy_models import _draft_hf_config, _hf_config, toy_config

TOK = SimpleNamespace(bos_token_id=0, eos_token_id=1, pad_token_id=2)


def test_dense_first_marks_layer_zero_dense_and_the_draft_is_dense_qwen3():
    cfg = toy_config("moe", num_layers=4, num_experts=8, experts_per_token=2, dense_first=True)
    target, draft = _hf_config(cfg, cfg.arch.num_layers, TOK), _draft_hf_config(cfg, TOK)
    assert target.mlp_only_layers == [0] and target.num_experts == 8 and target.num_hidden_layers == 4
    # vLLM's Qwen3-MoE class refuses a model with no MoE layer: the draft is a dense Qwen3
    assert draft.model_type == "qwen3" and draft.num_hidden_layers == 1
    assert draft.intermediate_size == cfg.arch.intermediate and draft.head_dim == target.head_dim
    assert draft.rope_parameters == target.rope_parameters if hasattr(draft, "rope_parameters") else True


def test_dense_first_draft_shares_the_targets_first_layer(tmp_path):
    from safetensors.torch import load_file

    from dsdprof.measure.toy_models import build_toy_pair

    cfg = toy_config("moe", hidden=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate=128,
                     vocab=300, num_experts=4, experts_per_token=2, moe_intermediate=32,
                     dense_first=True)
    pair = build_toy_pair(tmp_path, cfg)
    t, d = load_file(str(pair.target / "model.safetensors")), load_file(str(pair.draft / "model.safetensors"))
    assert d and all(k in t and (t[k] == v).all() for k, v in d.items())
    assert not any("experts" in k for k in d)


def test_default_moe_keeps_every_layer_moe():
    cfg = toy_config("moe")
    assert cfg.dense_first is False
    assert _hf_config(cfg, cfg.arch.num_layers, TOK).mlp_only_layers == []


def test_dense_first_on_a_dense_model_is_an_input_error():
    with pytest.raises(InputError, match="dense-first"):
        toy_config("dense", dense_first=True)


def test_sim_counts_the_dense_first_layer_as_dense(tmp_path):
    """The analytic engine reads mlp_only_layers: 3 MoE layers in the target, none in the draft."""
    from dsdprof.measure.sim.hfconfig import load_hf_config

    cfg = toy_config("moe", num_layers=4, num_experts=8, experts_per_token=2, dense_first=True)
    for name, n in (("target", 4), ("draft", 1)):
        (_hf_config(cfg, n, TOK) if name == "target" else _draft_hf_config(cfg, TOK)).save_pretrained(
            str(tmp_path / name))
    assert load_hf_config(tmp_path / "target" / "config.json").moe_layers == 3
    assert load_hf_config(tmp_path / "draft" / "config.json").moe_layers == 0


@pytest.mark.parametrize("kind, shape", [
    ("dense", {}), ("moe", {}), ("dense", {"hidden": 64, "num_layers": 2}),
    ("moe", {"num_layers": 4, "dense_first": True})])
def test_the_config_states_the_architecture_its_config_json_describes(tmp_path, kind, shape):
    """``ToyModelConfig.arch`` is the target as the analytic engine reads it back from the written
    config.json (but the name, which is the path there)."""
    from dsdprof.measure.sim.hfconfig import load_hf_config

    cfg = toy_config(kind, **shape)
    _hf_config(cfg, cfg.arch.num_layers, TOK).save_pretrained(str(tmp_path))
    assert replace(load_hf_config(tmp_path / "config.json"), name=cfg.arch.name) == cfg.arch
