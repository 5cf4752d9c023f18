"""Output grammars in the torch engines: a random tiny model writes schema-valid JSON only if the mask works."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from agentrl.engine.base import SamplingParams
from agentrl.engine.grammar import Grammar
from agentrl.serve.constraints import json_styled
from tests.unit.serve_server import build_serve_model

pytest.importorskip("llguidance")

VERDICT = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["higher", "lower", "correct"]},
        "guess": {"type": "integer", "minimum": 1, "maximum": 10},
        "sure": {"type": "boolean"},
    },
    "required": ["verdict", "guess", "sure"],
    "additionalProperties": False,
}
GRAMMAR = Grammar(json_schema=json.dumps(json_styled(VERDICT)))  # as agentrl serve writes JSON: no free whitespace


def follows_verdict(value) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"verdict", "guess", "sure"}
        and value["verdict"] in ("higher", "lower", "correct")
        and type(value["guess"]) is int
        and 1 <= value["guess"] <= 10
        and type(value["sure"]) is bool
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_serve_model(tmp_path_factory.mktemp("grammar") / "tiny")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from agentrl.models.loading import load_tokenizer

    return load_tokenizer(str(model_dir))


ENGINES = ["batch", "continuous", "continuous-slots"]


def make_engine(kind: str, model_dir, tokenizer):
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.engine.torch_engine import TorchEngine
    from agentrl.models.loading import load_causal_lm

    model = load_causal_lm(str(model_dir))
    if kind == "batch":
        engine = TorchEngine(model, pad_token_id=tokenizer.pad_token_id, seed=0)
    else:
        engine = ContinuousTorchEngine(
            model, pad_token_id=tokenizer.pad_token_id, seed=0, cuda_graphs=kind == "continuous-slots"
        )
    assert engine.allow_grammars(tokenizer)
    return engine


def generate_all(engine, prompt, samplings):
    async def run():
        return await asyncio.gather(*(engine.generate(prompt, sampling) for sampling in samplings))

    return asyncio.run(run())


# Sampled, seeded, greedy, top-k and top-p rows: each draws only what the grammar allows.
SETTINGS = [
    {"temperature": 1.0},
    {"temperature": 0.7},
    {"temperature": 0.0},
    {"temperature": 1.0, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.9},
]


@pytest.mark.parametrize("kind", ENGINES)
def test_constrained_rows_write_json_that_follows_the_schema_and_free_rows_are_unchanged(kind, model_dir, tokenizer):
    eos = tokenizer.eos_token_id
    prompt = tokenizer("Guess the number between 1 and 10.", add_special_tokens=False)["input_ids"]
    constrained = [
        SamplingParams(80, stop_token_ids=(eos,), seed=seed, grammar=GRAMMAR, **SETTINGS[seed % len(SETTINGS)])
        for seed in range(15)
    ]
    free = [SamplingParams(24, temperature=1.0, stop_token_ids=(eos,), seed=100 + seed) for seed in range(3)]
    engine = make_engine(kind, model_dir, tokenizer)
    try:
        mixed = generate_all(engine, prompt, constrained + free)
        alone = generate_all(engine, prompt, free)
    finally:
        engine.shutdown()
    for output in mixed[: len(constrained)]:
        text = tokenizer.decode(output.output_ids, skip_special_tokens=True)
        assert output.finish_reason == "stop" and output.output_ids[-1] == eos, text
        assert follows_verdict(json.loads(text)), text
        assert "grammar_error" not in output.meta
    texts = {tokenizer.decode(output.output_ids) for output in mixed[: len(constrained)]}
    assert len(texts) > 3  # sampled rows differ: the grammar leaves the model its choices
    for together, by_itself in zip(mixed[len(constrained) :], alone, strict=True):
        assert together.output_ids.tolist() == by_itself.output_ids.tolist()
        np.testing.assert_allclose(together.logprobs, by_itself.logprobs, atol=1e-5)
    unconstrained = tokenizer.decode(alone[0].output_ids, skip_special_tokens=True)
    with pytest.raises(json.JSONDecodeError):  # the same model, unconstrained: not JSON
        json.loads(unconstrained)


@pytest.mark.parametrize("kind", ["batch", "continuous"])
def test_constrained_logprobs_are_the_unconstrained_distributions(kind, model_dir, tokenizer):
    """The trainer recomputes logprobs without the grammar: the engine reports those, not the masked ones."""
    eos = tokenizer.eos_token_id
    prompt = tokenizer("hi", add_special_tokens=False)["input_ids"]
    engine = make_engine(kind, model_dir, tokenizer)
    try:
        sampling = SamplingParams(80, temperature=0.7, stop_token_ids=(eos,), seed=3, grammar=GRAMMAR)
        (output,) = generate_all(engine, prompt, [sampling])
        model = engine.model
        ids = torch.tensor([prompt + output.output_ids.tolist()])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
    finally:
        engine.shutdown()
    logprobs = torch.log_softmax(logits / 0.7, dim=-1)[len(prompt) - 1 : -1]
    expected = logprobs.gather(1, torch.from_numpy(output.output_ids)[:, None]).squeeze(1).numpy()
    np.testing.assert_allclose(output.logprobs, expected, atol=1e-4)
    assert output.finish_reason == "stop"
    # the grammar forced tokens the model alone finds unlikely: masked logprobs would be near 0 there
    assert float(np.min(output.logprobs)) < -3.0


def test_a_constrained_request_needs_stop_ids_and_an_engine_given_the_tokenizer(model_dir, tokenizer):
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.loading import load_causal_lm

    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id)
    try:
        with pytest.raises(ValueError, match="allow_grammars"):
            generate_all(engine, [5, 6], [SamplingParams(8, stop_token_ids=(2,), grammar=GRAMMAR)])
        engine.allow_grammars(tokenizer)
        with pytest.raises(ValueError, match="stop_token_ids"):
            generate_all(engine, [5, 6], [SamplingParams(8, grammar=GRAMMAR)])
        with pytest.raises(ValueError, match="invalid"):
            bad = Grammar(json_schema=json.dumps({"type": "strang"}))
            generate_all(engine, [5, 6], [SamplingParams(8, stop_token_ids=(2,), grammar=bad)])
    finally:
        engine.shutdown()


def test_a_grammar_is_a_lark_grammar_or_a_json_schema_and_travels_pickled():
    import pickle

    from agentrl.engine.sglang import sampling_params_for_sglang

    with pytest.raises(ValueError, match="exactly one"):
        Grammar()
    sampling = SamplingParams(8, stop_token_ids=(2,), grammar=Grammar(lark='start: "yes" | "no"'))
    assert pickle.loads(pickle.dumps(sampling)) == sampling
    assert Grammar(lark="start: x").sglang_fields() == {"ebnf": "start: x"}
    assert sampling_params_for_sglang(SamplingParams(8, grammar=GRAMMAR))["json_schema"] == GRAMMAR.json_schema


def test_masks_end_on_the_rows_stop_ids_and_a_failed_matcher_leaves_only_them(tokenizer):
    from agentrl.engine.grammar import GrammarVocab, grammar_error

    vocab = GrammarVocab(tokenizer, len(tokenizer) + 40)  # a model with more rows than the tokenizer has tokens
    yes_no = Grammar(lark='start: "yes" | "no"')
    eos, other_stop = tokenizer.eos_token_id, tokenizer.pad_token_id
    fresh, done, failed = (vocab.matcher(yes_no) for _ in range(3))
    assert done.consume_tokens(tokenizer("yes", add_special_tokens=False)["input_ids"])
    assert not failed.consume_token(tokenizer("x", add_special_tokens=False)["input_ids"][0])
    allowed = vocab.allowed([fresh, done, failed], [(eos,), (other_stop, eos), (other_stop,)], vocab.vocab_size, "cpu")
    assert allowed.shape == (3, len(tokenizer) + 40)
    starts = {tokenizer.decode([token]) for token in allowed[0].nonzero().squeeze(1).tolist()}
    assert starts and all("yes".startswith(s) or "no".startswith(s) for s in starts) and not allowed[0, eos]
    assert allowed[1].nonzero().squeeze(1).tolist() == sorted((other_stop, eos))  # complete: its stop ids only
    assert allowed[2].nonzero().squeeze(1).tolist() == [other_stop]
    assert not allowed[:, len(tokenizer) :].any()
    assert grammar_error(failed) and grammar_error(fresh) is None and grammar_error(None) is None
