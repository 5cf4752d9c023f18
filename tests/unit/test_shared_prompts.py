"""Rows with the same prompt are prefilled once (engine/shared_prompts.py), in both torch schedulers: every row gets
what prefilling it alone gives, up to float rounding, and still samples its own tokens.

Each check runs the same requests through an engine with sharing and one without (same weights, same seed) and
compares them token for token; logprobs also against one unpadded forward pass per row. Tolerance: float32 sums in
another order (1e-5 between the engines, 1e-4 against the forward, as tests/unit/test_torch_engine.py).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.engine.base import SamplingParams
from agentrl.engine.continuous import ContinuousTorchEngine
from agentrl.engine.shared_prompts import SharedPrompts
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.tiny import TinyShape, build_tiny_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Guess a number between 1 and 7; the host answers higher or lower.",
    "12 + 30 = 42, 7 * 8 = 56",
]
KINDS = ["batch", "batch-eager", "continuous", "continuous-slots", "continuous-eager"]
OBSERVATION = [7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m", TEXTS, TinyShape(hidden_size=64, num_layers=2, num_heads=4)
    )


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def distinct(tokenizer):
    """Three prompts of different lengths (so the batch is padded)."""
    prompts = [tokenizer(text)["input_ids"][: 4 + 5 * i] for i, text in enumerate(TEXTS)]
    assert len({len(p) for p in prompts}) == 3
    return prompts


def make_engine(kind: str, model_dir, share: bool):
    """`kind`: scheduler (and its decode steps: lean, slots, or the model's own forward with eager attention)."""
    attention = "eager" if kind.endswith("eager") else "sdpa"
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attention).eval()
    if kind.startswith("batch"):
        return TorchEngine(model, pad_token_id=0, seed=0, share_prompts=share)
    engine = ContinuousTorchEngine(
        model, pad_token_id=0, seed=0, cuda_graphs=kind == "continuous-slots", share_prompts=share
    )
    assert (engine.decoder is None) == (attention == "eager")
    return engine


def generate_all(engine, prompts, samplings):
    async def run():
        return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, samplings, strict=True)))

    return asyncio.run(run())


def forward_logprobs(model, prompt, output_ids, temperature):
    ids = torch.tensor([list(prompt) + output_ids.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(1, torch.from_numpy(output_ids)[:, None]).squeeze(1).numpy()


def assert_same_outputs(shared, alone):
    for a, b in zip(shared, alone, strict=True):
        assert a.output_ids.tolist() == b.output_ids.tolist() and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_shared_prompts_pick_one_leader_per_prompt():
    sharing = SharedPrompts.of(["a", "b", "a", "c", "b", "a"])
    assert sharing.leaders == [0, 1, 3] and sharing.copies == [0, 1, 0, 2, 1, 0]
    assert sharing.followers() == [(2, 0), (4, 1), (5, 0)]
    ranked = SharedPrompts.of(["a", "b", "a", "c", "b", "a"], rank=[0, 0, 5, 0, 0, 5])
    assert ranked.leaders == [1, 2, 3] and ranked.copies == [1, 0, 1, 2, 0, 1]  # a's first row of the most kept KV
    assert SharedPrompts.of(["a", "b", "c"]) is None


@pytest.mark.parametrize("kind", KINDS)
def test_rows_sharing_a_prompt_get_what_prefilling_each_alone_gives(kind, model_dir, distinct):
    # Three groups of four copies, interleaved, and one lone prompt; sampled, greedy and seeded rows, ragged budgets.
    prompts = [distinct[i % 3] for i in range(12)] + [distinct[2][:-1]]
    samplings = [
        SamplingParams(max_new_tokens=3 + i % 5, temperature=0.0 if i % 4 == 3 else 0.9, seed=i if i == 5 else None)
        for i in range(len(prompts))
    ]
    runs, stats = [], []
    for share in (True, False):
        engine = make_engine(kind, model_dir, share)
        try:
            runs.append(generate_all(engine, prompts, samplings))
        finally:
            engine.shutdown()
        stats.append(engine.stats)
    assert_same_outputs(*runs)
    sent = sum(map(len, prompts))
    once = sum(map(len, distinct)) + len(prompts[-1])
    assert stats[0]["prefill_tokens"] == once and stats[0]["shared_tokens"] == sent - once
    assert stats[1]["prefill_tokens"] == sent and stats[1]["shared_tokens"] == 0
    assert stats[0]["batches"] == stats[1]["batches"] == 1  # one prefill of all the rows
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for prompt, sampling, out in zip(prompts, samplings, runs[0], strict=True):
        assert len(out.output_ids) == sampling.max_new_tokens
        expected = forward_logprobs(model, prompt, out.output_ids, sampling.temperature)
        np.testing.assert_allclose(out.logprobs, expected, atol=1e-4)
    sampled = [out.output_ids.tolist() for i, out in enumerate(runs[0][:12]) if i % 3 == 0 and i % 4 != 3]
    assert len({tuple(ids) for ids in sampled}) > 1  # copies of one prompt draw their own tokens


@pytest.mark.parametrize("kind", ["continuous", "continuous-slots", "continuous-eager"])
def test_multi_turn_groups_share_each_turns_prefill_after_their_kept_kv(kind, model_dir, distinct):
    """Episodes of a group send the same conversation while their greedy replies agree; members of other budgets
    part ways. Sharing leaves every turn's tokens and logprobs as they were, and kept KV still serves later turns."""
    group = 4

    def budget(index: int, turn: int) -> int:
        return 2 + (index % group) // 2 + turn % 2  # members 0-1 and 2-3 of a group agree

    def play(engine):
        async def episode(index):
            history, turns = list(distinct[index // group]), []
            for turn in range(3):
                out = await engine.generate(history, SamplingParams(max_new_tokens=budget(index, turn), temperature=0))
                turns.append((list(history), out))
                history += out.output_ids.tolist() + OBSERVATION[: 1 + (index // group + turn) % len(OBSERVATION)]
            return turns

        async def run():
            return await asyncio.gather(*(episode(i) for i in range(len(distinct) * group)))

        return asyncio.run(run())

    runs, stats = [], []
    for share in (True, False):
        engine = make_engine(kind, model_dir, share)
        try:
            runs.append(play(engine))
        finally:
            engine.shutdown()
        stats.append(engine.stats)
    for shared, alone in zip(*runs, strict=True):
        assert_same_outputs([out for _, out in shared], [out for _, out in alone])
        for (_, out), (_, reference) in zip(shared, alone, strict=True):
            assert out.meta["cached_tokens"] == reference.meta["cached_tokens"]
    sent = sum(len(history) for turns in runs[0] for history, _ in turns)
    for run_stats in stats:
        assert run_stats["reused_tokens"] + run_stats["prefill_tokens"] + run_stats["shared_tokens"] == sent
    assert stats[0]["shared_tokens"] > stats[0]["prefill_tokens"] and stats[1]["shared_tokens"] == 0
    assert stats[0]["reused_tokens"] > 0  # later turns still start from kept KV


@pytest.mark.parametrize("kind", ["batch", "continuous", "continuous-slots"])
def test_a_cancelled_copy_leaves_and_the_other_copies_finish_exactly(kind, model_dir, distinct):
    engine = make_engine(kind, model_dir, share=True)
    prompt, sampling = distinct[1], SamplingParams(max_new_tokens=400, temperature=0.9)

    async def run():
        tasks = [asyncio.create_task(engine.generate(prompt, sampling)) for _ in range(4)]
        while engine.stats["shared_tokens"] == 0:  # the shared prefill ran: the copies are decoding
            await asyncio.sleep(0.002)
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        outputs = asyncio.run(run())
    finally:
        engine.shutdown()
    assert isinstance(outputs[1], asyncio.CancelledError)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for out in outputs[:1] + outputs[2:]:
        assert out.finish_reason == "length" and len(out.output_ids) == 400
        np.testing.assert_allclose(out.logprobs, forward_logprobs(model, prompt, out.output_ids, 0.9), atol=1e-4)


@pytest.mark.parametrize("kind", ["continuous", "continuous-slots"])
def test_an_admission_of_copies_past_the_first_slots_gets_what_prefilling_each_alone_gives(kind, model_dir, distinct):
    """80 rows of 2 prompts: the copies' slots lie past the 64 the leaders' prefill alone would reserve."""
    prompts = [distinct[0], distinct[1]] * 40
    samplings = [SamplingParams(max_new_tokens=3, temperature=0.0)] * len(prompts)
    shared = generate_all(make_engine(kind, model_dir, share=True), prompts, samplings)
    alone = generate_all(make_engine(kind, model_dir, share=False), prompts, samplings)
    assert_same_outputs(shared, alone)
