"""``dsdprof toy-models``: random-init toy target/draft pairs with realistic acceptance, built locally."""

from __future__ import annotations

from pathlib import Path

import typer

from dsdprof.cli.common import guarded, make_console
from dsdprof.errors import InputError


def _number(option: str, value: str | None, kind: type[int] | type[float] = int) -> int | float | None:
    """A numeric option parsed here, not by click: a non-numeric value is one line naming the
    option and the value (exit 2, through ``guarded``), as the range errors are."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise InputError(option, value, f"must be {what}") from None


def _toy_models(
    out_dir: Path = typer.Argument(..., metavar="OUT",
                                   help="Directory to write <kind>/target and <kind>/draft into."),
    kind: str = typer.Option("both", "--kind", help="dense, moe or both."),
    residual_scale: str | None = typer.Option(None, "--residual-scale", metavar="X",
                                                help="Scale of later layers' output projections (default "
                                                     "0.016): 0 = draft equals target; larger = lower "
                                                     "acceptance."),
    seed: str = typer.Option("0", "--seed", metavar="N",
                             help="Seed of the weights and the tokenizer's corpus."),
    hidden: str | None = typer.Option(None, "--hidden", metavar="N",
                                      help="Hidden size, 8..8192 (default 1024; MoE 512). Alone, it "
                                           "scales the rest: FFN 2N, N/64 heads (at least 2), half as "
                                           "many KV heads. 64 with --layers 2 is the tiny pair of "
                                           "benchmarks/bench_synthetic_truth.py."),
    layers: str | None = typer.Option(None, "--layers", metavar="N",
                                      help="Target decoder layers, 2..64 (default 12; MoE 8)."),
    ffn: str | None = typer.Option(None, "--ffn", metavar="N",
                                   help="FFN size of a dense layer (default 4096; MoE 1536)."),
    heads: str | None = typer.Option(None, "--heads", metavar="N",
                                     help="Attention heads, dividing the hidden size (default 16; MoE 8)."),
    kv_heads: str | None = typer.Option(None, "--kv-heads", metavar="N",
                                        help="KV heads, dividing the heads (default 4)."),
    experts: str | None = typer.Option(None, "--experts", metavar="N",
                                       help="MoE: experts per layer, 2..512."),
    top_k: str | None = typer.Option(None, "--top-k", metavar="N", help="MoE: experts per token, 1..64."),
    expert_ffn: str | None = typer.Option(None, "--expert-ffn", metavar="N",
                                          help="MoE: each expert's FFN size."),
    dense_first: bool | None = typer.Option(None, "--dense-first",
                                            help="MoE: first layer dense, so the one-layer draft loads no "
                                                 "expert."),
) -> None:
    """Build random-init toy target/draft pairs locally (no download) with realistic acceptance.

    Bad values: one line naming the option and the value, exit code 2."""
    from dsdprof.measure.toy_models import build_toy_models

    ints = {opt: _number(opt, value) for opt, value in (
        ("--seed", seed), ("--hidden", hidden), ("--layers", layers), ("--ffn", ffn), ("--heads", heads),
        ("--kv-heads", kv_heads), ("--experts", experts), ("--top-k", top_k), ("--expert-ffn", expert_ffn))}
    pairs = build_toy_models(out_dir, kind, residual_scale=_number("--residual-scale", residual_scale, float),
                             seed=ints["--seed"], hidden=ints["--hidden"], num_layers=ints["--layers"],
                             intermediate=ints["--ffn"], num_heads=ints["--heads"],
                             num_kv_heads=ints["--kv-heads"], num_experts=ints["--experts"],
                             experts_per_token=ints["--top-k"], moe_intermediate=ints["--expert-ffn"],
                             dense_first=dense_first)
    for pair in pairs:
        make_console().print(f"{pair.config.kind}: target {pair.target}  draft {pair.draft}")


def register(app: typer.Typer) -> None:
    """Add ``toy-models`` to ``app``."""
    app.command("toy-models")(guarded(_toy_models))
