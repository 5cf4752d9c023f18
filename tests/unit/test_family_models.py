"""Tiny random models of each family's architecture, with the family's tokenizer and template: the continuous
engine serves every architecture it can (the same greedy tokens as `generate`, across two turns that reuse the KV
cache), says in one line naming the architecture where it cannot (gpt-oss's sliding-window layers), and the batch
engine serves that one."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.chat.codec import load_codec
from agentrl.engine.base import SamplingParams
from agentrl.engine.continuous import ContinuousTorchEngine
from agentrl.engine.torch_engine import TorchEngine
from agentrl.errors import UserError
from agentrl.models.families import FIXTURES, build_family_model
from tests.unit.chat_fixtures import CORPUS, TOOLS

# One family per architecture (deepseek_r1 shares DeepSeek-V3's).
ARCHITECTURES = {fixture.architecture: family for family, fixture in FIXTURES.items() if family != "deepseek_r1"}
CONTINUOUS = [family for arch, family in ARCHITECTURES.items() if arch != "gpt_oss"]
GREEDY = SamplingParams(max_new_tokens=5, temperature=0.0)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("family_models")
    return {family: build_family_model(family, root / family, CORPUS) for family in ARCHITECTURES.values()}


def reference(model, prompt: list[int], n: int = 5) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def conversations():
    first = [{"role": "user", "content": "What is 2 + 3?"}]
    second = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "And 40 + 2, then 1 + 1?"}]
    return first, second


async def two_turns(engine, chat, model):
    """Two conversations at once, then the first one's second turn (its KV cache reused) after the tool results
    or, where the random model's turn called nothing, a user message."""
    first, second = conversations()
    prompts = [chat.prompt_ids(first, TOOLS), chat.prompt_ids(second, TOOLS)]
    outputs = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    turn = chat.parse_ids(outputs[0].output_ids, prompt_ids=prompts[0], tools=TOOLS)  # random text: parses anyway
    reply = chat.assistant_message(turn)
    history = [*first, reply]
    if turn.calls:
        new = [chat.family.tool_message(c["id"], c["function"]["name"], "5") for c in reply["tool_calls"]]
    else:
        new = [{"role": "user", "content": "And 1 + 1?"}]
    closing = [] if outputs[0].finish_reason == "stop" else chat.closing_ids(history, TOOLS)
    follow = [*prompts[0], *outputs[0].output_ids.tolist(), *closing]
    follow += chat.continuation_ids(history, new, TOOLS, keep_rewritten=True)
    again = await engine.generate(follow, GREEDY)
    return [(prompts[0], outputs[0]), (prompts[1], outputs[1]), (follow, again)]


@pytest.mark.parametrize("family", CONTINUOUS)
def test_the_continuous_engine_serves_the_architecture(model_dirs, family):
    model = AutoModelForCausalLM.from_pretrained(model_dirs[family]).eval()
    chat = load_codec(model_dirs[family])
    assert chat.family.name == family
    engine = ContinuousTorchEngine(model, pad_token_id=chat.tokenizer.pad_token_id, seed=0)
    try:
        turns = asyncio.run(two_turns(engine, chat, model))
    finally:
        engine.shutdown()
    for prompt, output in turns:
        assert output.output_ids.tolist() == reference(model, prompt)
    assert engine.stats["reused_tokens"] > 0  # the second turn took the first turn's cache


def test_gpt_oss_is_refused_by_the_continuous_engine_in_one_line_and_served_by_the_batch_engine(model_dirs):
    family = ARCHITECTURES["gpt_oss"]
    model = AutoModelForCausalLM.from_pretrained(model_dirs[family]).eval()
    chat = load_codec(model_dirs[family])
    with pytest.raises(UserError) as refused:
        ContinuousTorchEngine(model, pad_token_id=chat.tokenizer.pad_token_id, seed=0)
    message = str(refused.value)
    assert "\n" not in message and "gpt_oss" in message and "rollout.engine.scheduler=batch" in message
    engine = TorchEngine(model, pad_token_id=chat.tokenizer.pad_token_id, seed=0)
    try:
        turns = asyncio.run(two_turns(engine, chat, model))
    finally:
        engine.shutdown()
    for prompt, output in turns:
        assert output.output_ids.tolist() == reference(model, prompt)


@pytest.mark.parametrize("family", list(ARCHITECTURES.values()))
def test_the_batch_engine_serves_every_architecture_with_prompts_of_different_lengths(model_dirs, family):
    """Padded rows need a mask: Llama, Mistral, DeepSeek-V3 and GLM-4.5 build theirs from a 2D tensor only (a
    ready-made mask mapping failed with AttributeError before the engines asked the model)."""
    model = AutoModelForCausalLM.from_pretrained(model_dirs[family]).eval()
    chat = load_codec(model_dirs[family])
    engine = TorchEngine(model, pad_token_id=chat.tokenizer.pad_token_id, seed=0)
    prompts = [chat.prompt_ids(messages, TOOLS) for messages in conversations()]
    assert len(prompts[0]) != len(prompts[1])

    async def both():
        return await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))

    try:
        outputs = asyncio.run(both())
    finally:
        engine.shutdown()
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.output_ids.tolist() == reference(model, prompt)
