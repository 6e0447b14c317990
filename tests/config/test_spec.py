import pytest

from dsdprof.config.spec import load_spec, parse_spec
from dsdprof.errors import InputError

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
    ({"engine": {"model": "m", "draft_model": "d"}, "sweep": {"num_spec_tokens": [-1]}},
     "sweep.num_spec_tokens"),
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


SYNTH = {"engine": {"model": "m", "draft_model": "d"}, "sweep": {"num_spec_tokens": [0, 1, 2, 3]}}


@pytest.mark.parametrize("rates, words", [
    ([0.8, 0.9, 0.4], "non-increasing: rate 2 = 0.9 > rate 1 = 0.8"),
    ([1.2, 0.9, 0.4], "rate 1.2 must be a number in [0, 1]"),
    ([True, 0.9, 0.4], "rate True must be a number in [0, 1]"),
    ([float("nan"), 0.5, 0.4], "rate nan must be a number in [0, 1]"),
    ([], "must hold 1..32 rates"),
    ("0.8", "valid list"),
    ([0.8, 0.6], "2 rates; one per draft position up to the largest K (3)"),
])
def test_synthetic_acceptance_rates_bad_values_name_the_field(rates, words):
    with pytest.raises(InputError) as e:
        parse_spec({**SYNTH, "engine": {**SYNTH["engine"], "synthetic_acceptance_rates": rates}})
    assert e.value.field == "engine.synthetic_acceptance_rates" and words in str(e.value)
    assert "\n" not in str(e.value)


def test_synthetic_acceptance_rates_good_and_guarded():
    spec = parse_spec({**SYNTH,
                       "engine": {**SYNTH["engine"], "synthetic_acceptance_rates": [1, 0.6, 0.6, 0.1]}})
    assert spec.engine.synthetic_acceptance_rates == [1.0, 0.6, 0.6, 0.1]  # more than max K: cut per engine
    assert spec.engine.synthetic_rates(2) == [1.0, 0.6]
    assert spec.model_dump()["engine"]["synthetic_acceptance_rates"] == [1.0, 0.6, 0.6, 0.1]
    plain = parse_spec(SYNTH)
    assert "synthetic_acceptance_rates" not in plain.model_dump()["engine"]  # unset: dumps (hashes) as before
    # vLLM's own keys would run synthetic acceptance unlabelled: only the [engine] key sets it
    for extra in ({"rejection_sample_method": "synthetic"}, {"synthetic_acceptance_rates": [0.5] * 3},
                  {"synthetic_acceptance_length": 2.0}):
        with pytest.raises(InputError, match="use engine.synthetic_acceptance_rates") as e:
            parse_spec({**SYNTH, "engine": {**SYNTH["engine"], "speculative_extra": extra}})
        assert e.value.field == "engine.speculative_extra"
    extra = {"rejection_sample_method": "block"}
    assert parse_spec({**SYNTH, "engine": {**SYNTH["engine"], "speculative_extra": extra}}
                      ).engine.speculative_extra == extra
    with pytest.raises(InputError, match="only with engine.name = 'vllm'"):
        parse_spec({**SYNTH,
                    "engine": {"name": "sim", "model": "m", "synthetic_acceptance_rates": [1, 1, 1]}})
    with pytest.raises(InputError) as e:
        parse_spec({**SYNTH, "engine": {**SYNTH["engine"], "synthetic_acceptance_rates": [1, 1, 1],
                                        "extra": {"worker_extension_cls": "a.B"}}})
    assert e.value.field == "engine.extra.worker_extension_cls"
