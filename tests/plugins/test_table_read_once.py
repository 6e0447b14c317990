"""The adaptive scheduler reads its table file once at start (issue 32: it read it twice):
one read serves the selector and the context slices. On vLLM's real scheduler classes with the
fake config of tests/vllm_fakes.py, no engine."""

from __future__ import annotations

import builtins
import copy
import json
from collections import Counter
from pathlib import Path

from dsdprof.serve.settings import adaptive_additional_config
from tests.plugins.test_adaptive_plugin import HAS_VLLM, MAX_BS, needs_vllm, shifted_table

if HAS_VLLM:
    from dsdprof.plugins import vllm_adaptive as va


def _count_opens(monkeypatch, target: Path) -> Counter:
    opens: Counter = Counter()
    real_open, real_read_text, real_read_bytes = builtins.open, Path.read_text, Path.read_bytes

    def counted(real):
        def inner(file, *args, **kwargs):
            if isinstance(file, (str, Path)) and Path(file) == target:
                opens[target.name] += 1
            return real(file, *args, **kwargs)
        return inner
    monkeypatch.setattr(builtins, "open", counted(real_open))
    monkeypatch.setattr(Path, "read_text", counted(real_read_text))
    monkeypatch.setattr(Path, "read_bytes", counted(real_read_bytes))
    return opens


@needs_vllm
def test_the_adaptive_scheduler_reads_its_table_file_once(tmp_path, monkeypatch):
    from tests.vllm_fakes import make_scheduler, vllm_config

    path = tmp_path / "table.json"
    path.write_text(json.dumps(shifted_table()))
    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
    config.additional_config = adaptive_additional_config(str(path))
    opens = _count_opens(monkeypatch, path)
    path.read_text()  # the counter can disagree: this read counts
    assert opens == {"table.json": 1}
    make_scheduler(va.AdaptiveScheduler, config)
    assert opens == {"table.json": 2}  # the scheduler's start: one read
