"""Token-level policy losses (PPO clip with optional dual clip, GSPO, CISPO) and the loss aggregation modes.

Conventions (the trainer relies on them): tensors are (B, T), one row per episode; `logp` is the current
policy's log-prob of each target token (with grad), `old_logp` the log-prob under the policy before this
step's updates, `advantages` (B, T) or (B, 1) broadcastable, `mask` (B, T) float 0/1 of the trained
tokens. A loss returns `(loss_tok, clipped_tok)`: the per-token loss, NOT yet masked or reduced, and a 0/1
float tensor of the tokens where clipping was active (for a clip-fraction metric). `aggregate_loss` then
masks and reduces it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

AGGREGATION_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = exp(logp - old).

    Schulman et al. 2017 (PPO); asymmetric ranges as DAPO's clip-higher (Yu et al. 2025); verl
    `compute_policy_loss_vanilla` (`verl/trainer/ppo/core_algos.py`). Without `dual_clip` the terms are
    `clipped_ratio_terms`. clipped_tok marks tokens whose clipped term is the smaller (their gradient is zero).

    dual_clip = c > 1 (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"; verl's
    `clip_ratio_c`, 3 by default there): for A < 0 the loss is further capped at -c A, so a token whose
    ratio ran far above 1 with a negative advantage cannot push an unbounded update; such tokens also count
    as clipped. Tokens with A >= 0 are untouched. No clamp on the log-ratio.
    """
    loss, was_clipped = clipped_ratio_terms(logp, old_logp, advantages, clip_low, clip_high)
    if dual_clip is None:
        return loss, was_clipped
    if not dual_clip > 1.0:
        raise ValueError(f"dual_clip is {dual_clip}: the dual-clip bound c must be > 1 (3.0 is common), or None")
    cap = -dual_clip * advantages
    negative = advantages < 0
    capped = negative & (loss > cap)
    loss = torch.where(negative, torch.minimum(loss, cap), loss)
    return loss, torch.maximum(was_clipped, capped.float())


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071): one ratio per sequence.

    s_i = exp(mean over i's masked tokens of (logp - old_logp)) = (pi(y_i) / pi_old(y_i))^(1/|y_i|), the
    length-normalised (geometric-mean) sequence ratio. In the paper's token form (GSPO-token)
    s_i,t = sg[s_i] * exp(logp_t - sg[logp_t]): its value is s_i at every token, its gradient d s_i,t /
    d logp_t = s_i, so every token of a sequence shares one ratio and one clipping decision while the
    gradient flows through each token's own log-prob. The per-token loss is -min(s_i,t A, clip(s_i,t,
    1 - clip_low, 1 + clip_high) A); clip ranges are the caller's (the paper uses small ones, 3e-4 and
    4e-4). With one advantage per sequence and the "seq-mean-token-mean" aggregation this is exactly the
    paper's sequence-level objective and gradient, s_i A_i (1/|y_i|) sum_t grad logp_t, averaged over
    sequences (verl `compute_policy_loss_gspo` forces that mode); per-token advantages give GSPO-token.

    A row without masked tokens gets s_i = 1. clipped_tok marks every token of a clipped sequence. No
    clamp on the log-ratio (verl clamps its log at 10).
    """
    diff = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp))
    lengths = mask.sum(-1, keepdim=True).clamp(min=1.0)
    log_seq_ratio = (diff.sum(-1, keepdim=True) / lengths).detach()
    ratio = torch.exp(log_seq_ratio + logp - logp.detach())
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float | None,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logp per token.

    The clipped IS weight is a detached coefficient on REINFORCE's log-prob term, so no token's gradient
    is switched off, only its weight is bounded: d loss_t / d logp_t = -w_t A_t. MiniMax imposes no lower
    bound on the weight (they set eps_low large and tune only eps_high): `clip_low=None` does that. verl's
    `compute_policy_loss_cispo` clamps both sides with the PPO ranges; TRL caps from above only, with
    epsilon_high as the absolute cap. clipped_tok marks tokens whose weight was truncated.
    """
    ratio = torch.exp(logp - old_logp).detach()
    low = None if clip_low is None else 1.0 - clip_low
    weight = torch.clamp(ratio, min=low, max=1.0 + clip_high)
    return -weight * advantages * logp, (weight != ratio).float()


def aggregation_counts(mask: torch.Tensor) -> tuple[float, float]:
    """(masked tokens, rows with at least one masked token) of a batch: sum these over micro-batches and
    trainer ranks to get `global_tokens` and `global_sequences` for `aggregate_loss`."""
    return float(mask.sum()), float((mask.sum(-1) > 0).sum())


def aggregate_loss(
    loss_tok: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    global_tokens: float,
    global_sequences: float | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """This micro-batch's share of the global batch's loss: summed over micro-batches and trainer ranks it
    gives the loss of the whole global batch (rows are whole episodes, so per-row quantities are local).

    With l_it the per-token loss, m_it the mask, n_i = sum_t m_it, and sums over the GLOBAL batch:

    - "token-mean": sum_it m l / global_tokens (every trained token weighs the same; DAPO). Exactly
      `(loss_tok * mask).sum() / global_tokens`, today's GRPO trainer loss.
    - "seq-mean-token-sum": sum_i (sum_t m l) / global_sequences.
    - "seq-mean-token-mean": sum_i (sum_t m l / n_i) / global_sequences (GRPO's original 1/|o_i|; GSPO).
    - "seq-mean-token-sum-norm": sum_i (sum_t m l) / (global_sequences * norm_length): Dr. GRPO's
      constant normaliser (Liu et al. 2025): mean over sequences of the token sum divided by a constant
      `norm_length`, e.g. the generation budget in tokens, as TRL's dr_grpo divides by batch size x
      max_completion_length. verl's `agg_loss` divides the micro-batch's token sum by `loss_scale_factor`
      (default: the padded response length) and leaves the division by the batch size to its gradient
      accumulation and data-parallel averaging; here both are explicit.

    global_sequences counts the rows with at least one masked token (verl's convention); rows without
    any contribute nothing. Denominators below 1 are taken as 1, so a batch without trained tokens gives
    0 instead of nan; `aggregation_counts` gives the local counts to all-reduce.
    """
    if mode == "token-mean":
        return (loss_tok * mask).sum() / max(global_tokens, 1.0)
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"loss aggregation mode {mode!r} is unknown: pick one of {', '.join(AGGREGATION_MODES)}")
    if global_sequences is None:
        raise ValueError(f"aggregation {mode!r} needs global_sequences (rows with a masked token, all ranks)")
    sequences = max(global_sequences, 1.0)
    row_sums = (loss_tok * mask).sum(-1)
    if mode == "seq-mean-token-sum":
        return row_sums.sum() / sequences
    if mode == "seq-mean-token-mean":
        return (row_sums / mask.sum(-1).clamp(min=1.0)).sum() / sequences
    if norm_length is None or not norm_length > 0:
        raise ValueError(
            f"aggregation 'seq-mean-token-sum-norm' needs norm_length > 0 (got {norm_length}): "
            "a constant such as the generation budget in tokens"
        )
    return row_sums.sum() / (sequences * norm_length)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) at `targets`; logits (..., V), targets (...)."""
    logits = logits.float() / temperature
    return torch.gather(F.log_softmax(logits, dim=-1), -1, targets.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def uniform_kl(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per position: KL(uniform || softmax(logits / temperature)) = logsumexp - mean logit - log V (of the scaled)."""
    scaled = logits.float() / temperature
    return torch.logsumexp(scaled, dim=-1) - scaled.mean(-1) - math.log(scaled.shape[-1])


def clipped_ratio_terms(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: -min(r A, clip(r, 1 - low, 1 + high) A) with r = exp(logp - old_logp), and 0/1 where the clip won.

    Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference) per token: exp(r) - r - 1 with r = ref - logp."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0
