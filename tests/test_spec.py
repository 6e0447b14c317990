import pytest

from dsdprof.errors import InputError
from dsdprof.config.spec import load_spec, parse_spec

GOOD = """
[engine]
name = "vllm"
model = "m"
draft_model = "d"
method = "draft_model"

[sweep]
batch_sizes = [4, 1, 2]
num_spec_tokens = [0, 3, 1]

[workload]
dataset = "synthetic"
"""


def test_good_spec_defaults_and_sorting(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(GOOD)
    s = load_spec(p)
    assert s.sweep.batch_sizes == [1, 2, 4]
    assert s.sweep.num_spec_tokens == [0, 1, 3]
    assert s.sweep.waves == 20
    assert s.max_k == 3


@pytest.mark.parametrize("data, field", [
    ({"engine": {"model": "m", "draft_model": "d", "colour": 1}}, "engine.colour"),
    ({"engine": {"model": "m", "draft_model": "d"}, "sweeep": {}}, "sweeep"),
    ({"engine": {"model": "m", "draft_model": "d"}, "sweep": {"batch_sizes": [0, 1]}}, "sweep.batch_sizes"),
    ({"engine": {"model": "m", "draft_model": "d"}, "sweep": {"num_spec_tokens": [-1]}}, "sweep.num_spec_tokens"),
    ({"engine": {"model": "m", "draft_model": "d"}, "sweep": {"waves": 0}}, "sweep.waves"),
    ({"engine": {"model": "m", "draft_model": "d"}, "workload": {"temperature": -1}}, "workload.temperature"),
    ({"engine": {"model": "m", "method": "eagle3"}}, "engine"),
    ({"engine": {"name": "sglang", "model": "m"}}, "engine.name"),
    ({}, "engine"),
])
def test_bad_spec_names_the_field(data, field):
    with pytest.raises(InputError) as e:
        parse_spec(data)
    assert e.value.field == field
    assert str(e.value).startswith(field + "=")


def test_unknown_key_is_named():
    with pytest.raises(InputError) as e:
        parse_spec({"engine": {"model": "m", "draft_model": "d", "colour": 1}})
    assert "unknown key" in str(e.value)


def test_draftless_methods_need_no_draft():
    s = parse_spec({"engine": {"model": "m", "method": "ngram"}})
    assert s.engine.draft_model is None


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_spec(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine\nmodel=")
    with pytest.raises(InputError, match="not valid TOML"):
        load_spec(bad)
