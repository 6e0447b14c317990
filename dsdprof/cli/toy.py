"""``dsdprof toy-models``: random-init toy target/draft pairs with realistic acceptance, built locally."""

from __future__ import annotations

from pathlib import Path

import typer

from dsdprof.cli.common import guarded, make_console


def _toy_models(
    out_dir: Path = typer.Argument(..., help="Directory to write <kind>/target and <kind>/draft into."),
    kind: str = typer.Option("both", "--kind", help="dense, moe or both."),
    residual_scale: float | None = typer.Option(None, "--residual-scale",
                                                help="Scale of later layers' output projections (default "
                                                     "0.016): 0 = draft equals target; larger = lower "
                                                     "acceptance."),
    seed: int = typer.Option(0, "--seed"),
    layers: int | None = typer.Option(None, "--layers", min=2, max=64, help="Target decoder layers."),
    experts: int | None = typer.Option(None, "--experts", min=2, max=512, help="MoE: experts per layer."),
    top_k: int | None = typer.Option(None, "--top-k", min=1, max=64, help="MoE: experts per token."),
    expert_ffn: int | None = typer.Option(None, "--expert-ffn", min=8, max=65536,
                                          help="MoE: each expert's FFN size."),
    dense_first: bool | None = typer.Option(None, "--dense-first",
                                            help="MoE: first layer dense, so the one-layer draft loads no "
                                                 "expert."),
) -> None:
    """Build random-init toy target/draft pairs locally (no download) with realistic acceptance."""
    from dsdprof.errors import InputError
    from dsdprof.measure.toy_models import build_toy_pair, toy_config

    kinds = {"both": ["dense", "moe"], "dense": ["dense"], "moe": ["moe"]}.get(kind)
    if kinds is None:
        raise InputError("--kind", kind, "must be dense, moe or both")
    for k in kinds:
        pair = build_toy_pair(out_dir / k, toy_config(
            k, residual_scale=residual_scale, seed=seed, num_layers=layers, num_experts=experts,
            experts_per_token=top_k, moe_intermediate_size=expert_ffn, dense_first=dense_first))
        make_console().print(f"{k}: target {pair.target}  draft {pair.draft}")


def register(app: typer.Typer) -> None:
    """Add ``toy-models`` to ``app``."""
    app.command("toy-models")(guarded(_toy_models))
