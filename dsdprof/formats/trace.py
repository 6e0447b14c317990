"""The step trace record: one JSON object per engine step, written by the profiling scheduler
inside vLLM's engine core (:mod:`dsdprof.plugins.vllm_profiling`) and read back by
:mod:`dsdprof.measure.vllm.trace` and :mod:`dsdprof.measure.vllm.arrivals`.

A trace file holds JSON lines, each a list of the records of one flush (one wave's steps). What
the fields mean is :mod:`dsdprof.measure.vllm.trace`'s docstring; :class:`TraceRecord` names the
keys and their types, :func:`step_record` writes one, :meth:`Step.from_record` reads one. Keys
added later (``others``, ``finished``, ``accepted``, ``stale``, ``ids``, ``k_next``, ``arm``,
``t_own``) have defaults, so older traces still read. Stdlib only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TypedDict


class _RequiredKeys(TypedDict):
    wave: int
    t_end: float
    scheduled: int
    decoding: int
    prefill_tokens: int
    drafted: list[int]
    generated: list[int]
    delivered: dict[str, int]


class TraceRecord(_RequiredKeys, total=False):
    """One engine step as written to the trace file (the on-disk keys)."""

    t_own: float
    others: int
    stale: int
    ids: list[str]
    accepted: list[int]
    finished: list[bool]
    k_next: int
    arm: int


def step_record(*, wave: int, t_end: float, t_own: float, scheduled: int, decoding: int,
                prefill_tokens: int, others: int, stale: int, ids: list[str], drafted: list[int],
                accepted: list[int], generated: list[int], delivered: dict[str, int],
                finished: list[bool], k_next: int, arm: int | None) -> TraceRecord:
    """The record of one step, keys in the order the trace has always had them (``arm`` only
    when the step ran under an arm or a K sequence)."""
    rec: TraceRecord = {
        "wave": wave, "t_end": t_end, "t_own": t_own, "scheduled": scheduled, "decoding": decoding,
        "prefill_tokens": prefill_tokens, "others": others, "stale": stale, "ids": ids,
        "drafted": drafted, "accepted": accepted, "generated": generated, "delivered": delivered,
        "finished": finished, "k_next": k_next,
    }
    if arm is not None:
        rec["arm"] = arm
    return rec


def encode_flush(records: list[TraceRecord]) -> str:
    """One line of a trace file: the records of one flush."""
    return json.dumps(records) + "\n"


@dataclass(frozen=True)
class Step:
    """One engine step of a traced wave, parsed (:mod:`dsdprof.measure.vllm.trace` says what each
    field means)."""

    wave: int
    t_end: float  # engine core perf_counter() when the update finished (sync: minus dsdprof's own time)
    scheduled: int  # requests of this wave scheduled in the step
    decoding: int  # of which decoding (no prefill tokens) with an output vLLM used
    prefill_tokens: int  # prompt tokens of any request in the step
    others: int  # requests scheduled in the step that do not belong to this wave
    drafted: tuple[int, ...]  # per decoding request: draft tokens verified
    generated: tuple[int, ...]  # per decoding request: tokens sampled (accepted + bonus), untrimmed
    delivered: dict[str, int] = field(default_factory=dict)  # request id -> tokens delivered
    finished: tuple[bool, ...] = ()  # per decoding request: it finished in this step
    accepted: tuple[int, ...] | None = None  # per decoding request: drafts accepted (None: generated - 1)
    stale: int = 0  # requests of this wave whose output vLLM discarded
    ids: tuple[str, ...] = ()  # per decoding request: its id
    k_next: int = -1  # K the step scheduled (drafts proposed for the next step); -1: not recorded
    arm: int | None = None  # the K-sequence value the step was scheduled under (< 0: an arm; None: none)
    t_own: float = 0.0  # dsdprof's own time in the engine core so far (cumulative)

    @classmethod
    def from_record(cls, d: TraceRecord) -> Step:
        acc = d.get("accepted")
        arm = d.get("arm")
        return cls(int(d["wave"]), float(d["t_end"]), int(d["scheduled"]), int(d["decoding"]),
                   int(d["prefill_tokens"]), int(d.get("others", 0)), tuple(d["drafted"]),
                   tuple(d["generated"]), {str(k): int(v) for k, v in d["delivered"].items()},
                   tuple(bool(x) for x in d.get("finished", ())),
                   tuple(int(a) for a in acc) if acc is not None else None, int(d.get("stale", 0)),
                   tuple(str(i) for i in d.get("ids", ())), int(d.get("k_next", -1)),
                   int(arm) if arm is not None else None, float(d.get("t_own", 0.0)))

    from_json = from_record  # the name callers used before

    def accepted_counts(self) -> tuple[int, ...]:
        if self.accepted is not None:
            return self.accepted
        return tuple(max(0, min(d, g - 1)) if d > 0 else 0 for d, g in zip(self.drafted, self.generated))


def decode_line(line: str) -> list[Step]:
    """The steps of one trace line ([] for a blank one)."""
    return [Step.from_record(d) for d in json.loads(line)] if line.strip() else []
