"""GPU engine settings and pre-engine checks, shown without a GPU: the vLLM kwargs a GPU spec
produces give vanilla and DSD engines the same decode graph sizes, one for every (batch size, K)
of the grid, and leave the graph mode to vLLM (tests/export/test_compilation_config.py)."""

from __future__ import annotations

import json

import pytest

from dsdprof.config.spec import check_workload_for_engine, parse_spec
from dsdprof.errors import InputError
from dsdprof.measure.vllm.engine import VllmEngine


def _spec(tmp_path, **over):
    for name in ("tgt", "drf"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text("{}")
    d = {"engine": {"name": "vllm", "model": str(tmp_path / "tgt"), "draft_model": str(tmp_path / "drf"),
                    "method": "eagle3", "max_model_len": 4096},
         "sweep": {"batch_sizes": [1, 4, 64, 128], "num_spec_tokens": [0, 1, 3, 5], "output_len": 64},
         "workload": {"input_len": 128}}
    for k, v in over.items():
        d[k] = {**d[k], **v}
    return parse_spec(d)


def test_vanilla_and_dsd_engines_share_graph_sizes_covering_every_k(tmp_path, monkeypatch):
    """Every engine captures the grid's decode sizes; the mode is left to vLLM (as when serving:
    tests/export/test_compilation_config.py resolves both with vLLM's own config path)."""
    monkeypatch.setattr("dsdprof.measure.vllm.engine._cuda_available", lambda: True)
    spec = _spec(tmp_path)
    engine = VllmEngine(spec, out_dir=None, start_worker=lambda c, t: None)
    vanilla, dsd = engine.llm_kwargs("vanilla"), engine.llm_kwargs("dsd")
    assert vanilla["compilation_config"] == dsd["compilation_config"]
    assert "cudagraph_mode" not in dsd["compilation_config"]  # vanilla full graphs, as production runs it
    sizes = dsd["compilation_config"]["cudagraph_capture_sizes"]
    for b in spec.sweep.batch_sizes:
        for k in spec.sweep.num_spec_tokens:
            assert b * (k + 1) in sizes, (b, k, sizes)
    assert max(sizes) == dsd["compilation_config"]["max_cudagraph_capture_size"] == 128 * 6  # beyond 512
    extra = engine.provenance()["extra"]
    assert extra["cudagraph_mode"] == "vLLM default"
    assert json.loads(extra["compilation_config"]) == dsd["compilation_config"]  # what the export serves


def test_no_graph_settings_on_cpu_eager_or_user_compilation_config(tmp_path, monkeypatch):
    monkeypatch.setattr("dsdprof.measure.vllm.engine._cuda_available", lambda: False)
    engine = VllmEngine(_spec(tmp_path), start_worker=lambda c, t: None)
    assert "compilation_config" not in engine.base_kwargs()
    monkeypatch.setattr("dsdprof.measure.vllm.engine._cuda_available", lambda: True)
    eager = _spec(tmp_path, engine={"extra": {"enforce_eager": True}})
    assert "compilation_config" not in VllmEngine(eager, start_worker=lambda c, t: None).base_kwargs()
    mine = _spec(tmp_path, engine={"extra": {"compilation_config": {"cudagraph_mode": "FULL"}}})
    user = VllmEngine(mine, start_worker=lambda c, t: None)
    assert user.base_kwargs()["compilation_config"] == {"cudagraph_mode": "FULL"}


def test_lengths_and_datasets_fail_before_any_engine(tmp_path):
    with pytest.raises(InputError, match=r"engine.max_model_len=197: must be >= .* = 198"):
        check_workload_for_engine(_spec(tmp_path, engine={"max_model_len": 197}))
    check_workload_for_engine(_spec(tmp_path, engine={"max_model_len": 198}))
    with pytest.raises(InputError, match="workload.dataset='nope.jsonl'"):
        check_workload_for_engine(_spec(tmp_path, workload={"dataset": "nope.jsonl"}))
    with pytest.raises(InputError, match="workload.dataset='sharegtp'"):
        check_workload_for_engine(_spec(tmp_path, workload={"dataset": "sharegtp"}))
    (tmp_path / "d.jsonl").write_text('{"prompt": "x"}\n')
    check_workload_for_engine(_spec(tmp_path, workload={"dataset": str(tmp_path / "d.jsonl")}))
    started = []
    engine = VllmEngine(_spec(tmp_path, engine={"max_model_len": 100}),
                        start_worker=lambda c, t: started.append(c))
    with pytest.raises(InputError, match="engine.max_model_len"):
        _ = engine.speculation_mode
    assert started == []  # no engine was started
