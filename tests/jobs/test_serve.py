"""``dsdprof serve``: the server command line built from a table, and (marked vllm) vLLM's OpenAI
server started by it on CPU answering over HTTP on loopback."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.errors import InputError
from dsdprof.export.table import vllm_speculative_config
from dsdprof.formats.ktable import TableError
from dsdprof.jobs.serve import PLAIN_CHAT_TEMPLATE, SERVER_MODULE, serve_argv

REPO = Path(__file__).resolve().parents[2]
TOY_TABLE = REPO / "tables" / "toy-dense-cpu.json"


def _pair(root: Path, template: str | None = None) -> None:
    for name in ("target", "draft"):
        d = root / "toy" / name
        d.mkdir(parents=True)
        cfg = {"bos_token": "<s>"} if template is None else {"chat_template": template}
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))


def _table(tmp_path: Path, model: str, draft: str) -> Path:
    table = json.loads(TOY_TABLE.read_text())
    table["provenance"] = {**table["provenance"], "model": model, "draft_model": draft}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    return path


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_argv_is_vllms_server_with_absolute_paths_from_any_directory(tmp_path, monkeypatch):
    _pair(tmp_path)
    table = _table(tmp_path, "toy/target", "toy/draft")  # relative to tmp_path, as a sweep run there records
    monkeypatch.chdir(tmp_path)
    argv = serve_argv("table.json", extra=["--port", "8123"])
    assert argv[:3] == [sys.executable, "-m", SERVER_MODULE] and argv[-2:] == ["--port", "8123"]
    assert _flag(argv, "--model") == str(tmp_path / "toy" / "target")
    cfg = json.loads(_flag(argv, "--speculative-config"))
    assert cfg["model"] == str(tmp_path / "toy" / "draft") and cfg["method"] == "draft_model"
    assert cfg["num_speculative_tokens_per_batch_size"] == json.loads(table.read_text())["ranges"]
    assert _flag(argv, "--chat-template") == PLAIN_CHAT_TEMPLATE  # the tokenizer has none
    assert _flag(argv, "--scheduler-cls") == "dsdprof.engines.vllm_static.make_scheduler"  # metrics
    assert "--scheduler-cls" not in serve_argv("table.json", metrics=False)  # vLLM's own scheduler
    adaptive = serve_argv("table.json", adaptive=True, adaptive_options={"margin": 0.05, "probe_every": 0})
    assert _flag(adaptive, "--scheduler-cls") == "dsdprof.engines.vllm_adaptive.make_scheduler"
    assert json.loads(_flag(adaptive, "--additional-config")) == {
        "dsdprof_adaptive": {"table": str(table), "margin": 0.05, "probe_every": 0}}


def test_a_tokenizer_with_a_template_a_hub_id_and_the_users_template_are_left_alone(tmp_path, monkeypatch):
    _pair(tmp_path, template="{{ messages }}")
    monkeypatch.chdir(tmp_path)
    _table(tmp_path, "toy/target", "toy/draft")
    assert "--chat-template" not in serve_argv("table.json")
    _table(tmp_path, "org/model", "org/draft")  # not here: a Hugging Face id, passed as given
    argv = serve_argv("table.json")
    assert _flag(argv, "--model") == "org/model"
    assert json.loads(_flag(argv, "--speculative-config"))["model"] == "org/draft"
    _table(tmp_path, "toy/target", "toy/draft")
    assert _flag(serve_argv("table.json", model="other/m"), "--model") == "other/m"
    mine = serve_argv("table.json", extra=["--chat-template", "x"])
    assert mine.count("--chat-template") == 1 and mine[-1] == "x"


def test_export_writes_a_local_draft_absolute_and_an_id_as_recorded(tmp_path, monkeypatch):
    _pair(tmp_path)
    table = json.loads(TOY_TABLE.read_text())
    monkeypatch.chdir(tmp_path)
    table["provenance"]["draft_model"] = "toy/draft"
    assert vllm_speculative_config(table)["model"] == str(tmp_path / "toy" / "draft")
    table["provenance"]["draft_model"] = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert vllm_speculative_config(table)["model"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch):
    _pair(tmp_path)
    _table(tmp_path, "toy/target", "toy/draft")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="--speculative-config"):
        serve_argv("table.json", extra=["--speculative-config={}"])
    with pytest.raises(InputError, match="--adaptive"):
        serve_argv("table.json", adaptive_options={"margin": 0.1})
    with pytest.raises(TableError, match="margin=5"):
        serve_argv("table.json", adaptive=True, adaptive_options={"margin": 5})
    runner = CliRunner()
    for args, field in ((["serve", "nope.json"], "nope.json"),
                        (["serve", "table.json", "--adaptive", "--option", "margin"], "--option"),
                        (["serve", "table.json", "--adaptive", "--option", "colour=1"], "colour"),
                        (["serve", "table.json", "--", "--model", "x"], "--model")):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and field in lines[0] and "Traceback" not in res.output, res.output
    res = runner.invoke(app, ["serve", "table.json", "--adaptive", "--dry-run", "--", "--port", "9"])
    assert res.exit_code == 0, res.output
    argv = shlex.split(res.output)
    assert argv[1:3] == ["-m", SERVER_MODULE] and argv[-2:] == ["--port", "9"]


# ---------------------------------------------------------------- the real server (vLLM CPU)

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def start_server(table: Path, log: Path, *args: str, adaptive: bool = True, cwd: Path | None = None,
                 timeout: float = 300.0):
    """``dsdprof serve TABLE [--adaptive] -- --host 127.0.0.1 --port P ...`` on CPU; (process, port)
    once /health answers. Raises (after stopping it) if the server exits or never answers."""
    port = _free_port()
    cmd = [sys.executable, "-m", "dsdprof.cli", "serve",
           str(table)] + (["--adaptive"] if adaptive else []) + [
        *args, "--", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "256", "--enforce-eager", "--max-num-seqs", "16"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=cwd,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, port
        except OSError:
            time.sleep(1.0)
    stop_server(proc)
    raise RuntimeError(f"server did not answer in {timeout:.0f} s: {log.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> int:
    """SIGINT to the server's process group (its engine core included), then SIGKILL after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=30)
    except ProcessLookupError:
        return proc.wait()


@pytest.mark.vllm
def test_dsdprof_serve_answers_a_completion_over_http(tmp_path, toy_tiny):
    pytest.importorskip("vllm")
    toy = toy_tiny  # the session's tiny toy pair (tests/conftest.py): the serving path, not its speed
    table = _table(tmp_path, os.path.relpath(toy.target, tmp_path), os.path.relpath(toy.draft, tmp_path))
    log = tmp_path / "server.log"  # the table and its paths relative to where `dsdprof serve` runs
    proc, port = start_server(Path(table.name), log, cwd=tmp_path)
    try:
        done = _post(port, "/v1/completions", {"model": str(toy.target), "prompt": "the quick brown fox",
                                               "max_tokens": 8, "temperature": 0})
        assert done["choices"][0]["text"] and done["usage"]["completion_tokens"] == 8, done
        chat = _post(port, "/v1/chat/completions", {"model": str(toy.target), "max_tokens": 4,
                                                    "messages": [{"role": "user", "content": "hi"}]})
        assert chat["usage"]["completion_tokens"] >= 1, chat  # the plain template served the chat endpoint
        from tests.support.metrics_operator import check_metrics_as_operator

        check_metrics_as_operator(port, str(toy.target))  # issue 34: /metrics as an operator reads it
    finally:
        rc = stop_server(proc)
    text = log.read_text()
    assert "dsdprof adaptive K: table" in text, text[-3000:]  # the plugin ran inside the engine core
    assert rc is not None
