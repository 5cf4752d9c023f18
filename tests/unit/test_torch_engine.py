"""The torch rollout engines (batch and continuous scheduler) against plain forward passes and HF `generate`."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.engine.base import SamplingParams
from agentrl.engine.continuous import ContinuousTorchEngine
from agentrl.engine.sampling import RowSampling, sample_tokens
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.tiny import TinyShape, build_tiny_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A small model learns to add numbers.",
    "Write the answer after the word answer.",
    "12 + 30 = 42",
    "7 * 8 = 56",
    "0 1 2 3 4 5 6 7 8 9",
]
PROMPTS = ["The quick", "12 + 30 =", "A small model learns to", "7"]
ENGINE_CLASSES = pytest.mark.parametrize(
    "engine_class", [TorchEngine, ContinuousTorchEngine], ids=["batch", "continuous"]
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m", TEXTS, TinyShape(hidden_size=64, num_layers=2, num_heads=4)
    )


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(
    params=[(TorchEngine, False), (ContinuousTorchEngine, False), (TorchEngine, True), (ContinuousTorchEngine, True)],
    ids=["batch", "continuous", "batch-on-loop", "continuous-on-loop"],
)
def engine(request, model, tokenizer):
    """Each scheduler with its steps on its worker thread, and on the event loop awaiting them."""
    engine_class, steps_on_loop = request.param
    engine = engine_class(model, pad_token_id=tokenizer.pad_token_id, seed=0, steps_on_loop=steps_on_loop)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    ids = [tokenizer(text)["input_ids"] for text in PROMPTS]
    assert len({len(p) for p in ids}) > 2, "the prompts should differ in length"
    return ids


def generate_all(engine, prompts, sampling):
    """Await one generate per prompt concurrently, as agents do."""

    async def run():
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))

    return asyncio.run(run())


def full_forward_logprobs(model, prompt, output_ids, temperature):
    """log_softmax(logits / T) of each output token, from one unpadded forward pass."""
    ids = torch.tensor([list(prompt) + output_ids.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(1, torch.from_numpy(output_ids)[:, None]).squeeze(1).numpy()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_full_forward_pass(engine, model, prompts, temperature):
    outputs = generate_all(engine, prompts, SamplingParams(max_new_tokens=12, temperature=temperature))
    assert engine.stats["batches"] == 1
    assert engine._takes_ready_masks  # SDPA: decode steps use the engine's ready-made masks
    worst = 0.0
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.output_ids.dtype == np.int64 and out.logprobs.dtype == np.float32
        assert len(out.output_ids) == 12 and out.finish_reason == "length"
        expected = full_forward_logprobs(model, prompt, out.output_ids, temperature)
        worst = max(worst, float(np.abs(out.logprobs - expected).max()))
    print(f"max |engine logprob - full forward logprob| at T={temperature}: {worst:.2e}")
    assert worst < 1e-4


@ENGINE_CLASSES
def test_eager_attention_gets_plain_2d_masks(engine_class, model_dir, tokenizer, prompts):
    eager = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    engine = engine_class(eager, pad_token_id=tokenizer.pad_token_id)
    assert not engine._takes_ready_masks
    outputs = generate_all(engine, prompts, SamplingParams(max_new_tokens=8, temperature=0.7))
    engine.shutdown()
    for prompt, out in zip(prompts, outputs, strict=True):
        expected = full_forward_logprobs(eager, prompt, out.output_ids, 0.7)
        np.testing.assert_allclose(out.logprobs, expected, atol=1e-4)


def test_greedy_matches_hf_generate(engine, model, tokenizer, prompts):
    eos = tokenizer.eos_token_id
    outputs = generate_all(engine, prompts, SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(eos,)))
    for prompt, out in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            reference = model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=10, eos_token_id=eos, pad_token_id=eos
            )
        np.testing.assert_array_equal(out.output_ids, reference[0, len(prompt) :].numpy())
        expected = full_forward_logprobs(model, prompt, out.output_ids, 1.0)
        np.testing.assert_allclose(out.logprobs, expected, atol=1e-4)


def test_stop_id_ends_the_output_and_is_included(engine, prompts):
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    free_run = generate_all(engine, prompts[:1], greedy)[0].output_ids
    stop_id = int(free_run[3])
    first_stop = int(np.flatnonzero(free_run == stop_id)[0])

    stopped = generate_all(engine, prompts[:1], SamplingParams(10, temperature=0.0, stop_token_ids=(stop_id,)))[0]
    assert stopped.finish_reason == "stop"
    np.testing.assert_array_equal(stopped.output_ids, free_run[: first_stop + 1])
    assert stopped.output_ids[-1] == stop_id and len(stopped.logprobs) == first_stop + 1


def test_max_new_tokens_gives_length(engine, prompts):
    for out in generate_all(engine, prompts, SamplingParams(max_new_tokens=5)):
        assert out.finish_reason == "length" and len(out.output_ids) == 5 and len(out.logprobs) == 5
    empty = generate_all(engine, prompts[:1], SamplingParams(max_new_tokens=0))[0]
    assert empty.finish_reason == "length" and len(empty.output_ids) == 0


def test_rows_finishing_early_leave_the_others_unchanged(engine, prompts):
    """A batch whose rows finish at different steps gives each row what it gets alone."""
    free_run = generate_all(engine, prompts[:1], SamplingParams(8, temperature=0.0))[0].output_ids
    params = [
        SamplingParams(8, temperature=0.0, stop_token_ids=(int(free_run[2]),)),
        SamplingParams(3, temperature=0.0),
        SamplingParams(12, temperature=0.0),
        SamplingParams(1, temperature=0.0),
    ]
    together = generate_all(engine, prompts, params)
    for prompt, sampling, out in zip(prompts, params, together, strict=True):
        alone = generate_all(engine, [prompt], sampling)[0]
        np.testing.assert_array_equal(out.output_ids, alone.output_ids)
        np.testing.assert_allclose(out.logprobs, alone.logprobs, atol=1e-5)
        assert out.finish_reason == alone.finish_reason
    assert together[0].finish_reason == "stop" and together[2].finish_reason == "length"


def test_concurrent_requests_share_one_batch(engine, prompts):
    outputs = generate_all(engine, [prompts[i % len(prompts)] for i in range(16)], SamplingParams(max_new_tokens=4))
    assert len(outputs) == 16
    assert engine.stats["batches"] == 1 and engine.stats["largest_batch"] == 16


def test_multi_turn_agents_batch_every_turn(engine, prompts):
    """Agents that call generate again as soon as their turn returns are gathered turn by turn."""

    async def agent(prompt):
        history = list(prompt)
        for _ in range(3):
            out = await engine.generate(history, SamplingParams(max_new_tokens=3))
            history += out.output_ids.tolist()
        return history

    async def run():
        return await asyncio.gather(*(agent(prompts[i % len(prompts)]) for i in range(8)))

    asyncio.run(run())
    assert engine.stats["batches"] == 3 and engine.stats["requests"] == 24


def test_top_k_one_is_greedy(engine, prompts):
    greedy = generate_all(engine, prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    top1 = generate_all(engine, prompts, SamplingParams(max_new_tokens=8, temperature=1.0, top_k=1))
    for g, t in zip(greedy, top1, strict=True):
        np.testing.assert_array_equal(g.output_ids, t.output_ids)
        np.testing.assert_allclose(g.logprobs, t.logprobs, atol=1e-5)


def test_top_p_keeps_only_the_nucleus(engine, model, prompts):
    """With a tiny top_p only the most likely token survives the filter; logprobs stay unfiltered."""
    outputs = generate_all(engine, prompts, SamplingParams(max_new_tokens=6, temperature=0.8, top_p=1e-6))
    greedy = generate_all(engine, prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    for prompt, out, g in zip(prompts, outputs, greedy, strict=True):
        np.testing.assert_array_equal(out.output_ids, g.output_ids)
        expected = full_forward_logprobs(model, prompt, out.output_ids, 0.8)
        np.testing.assert_allclose(out.logprobs, expected, atol=1e-4)


def test_sampled_tokens_follow_the_filtered_distribution():
    """Many rows with the same logits: token frequencies match softmax(logits / T) cut to the top k."""
    rows, temperature, top_k = 40_000, 0.8, 3
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0]).repeat(rows, 1)
    settings = RowSampling([SamplingParams(1, temperature=temperature, top_k=top_k)] * rows, 6, torch.device("cpu"))
    tokens, logprobs = sample_tokens(logits, settings, torch.Generator().manual_seed(0))
    full = torch.softmax(logits[0] / temperature, dim=-1)
    expected = torch.zeros(6)
    expected[:top_k] = full[:top_k] / full[:top_k].sum()
    observed = torch.bincount(tokens, minlength=6).float() / rows
    assert (observed - expected).abs().max() < 0.01, (observed, expected)
    torch.testing.assert_close(logprobs, full.log()[tokens])


@ENGINE_CLASSES
def test_sampling_is_reproducible(engine_class, model, tokenizer, prompts):
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=20, top_p=0.9)
    runs = []
    for _ in range(2):
        engine = engine_class(model, pad_token_id=tokenizer.pad_token_id, seed=123)
        runs.append([o.output_ids for o in generate_all(engine, prompts, sampling)])
        engine.shutdown()
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_request_seed_is_independent_of_the_batch(engine, prompts):
    seeded = SamplingParams(max_new_tokens=8, seed=7)
    alone = generate_all(engine, prompts[:1], seeded)[0]
    crowded = generate_all(engine, prompts, [seeded] + [SamplingParams(max_new_tokens=5)] * 3)[0]
    np.testing.assert_array_equal(alone.output_ids, crowded.output_ids)


def test_load_weights_changes_outputs_and_version(engine, model, prompts):
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = generate_all(engine, prompts, greedy)
    assert all(out.weight_version == -1 for out in before)

    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    perturbed = {name: t + 0.5 * torch.randn(t.shape, generator=generator) for name, t in original.items()}
    engine.load_weights(perturbed, version=3)
    assert engine.weight_version == 3
    after = generate_all(engine, prompts, greedy)
    assert all(out.weight_version == 3 for out in after)
    assert any(not np.allclose(a.logprobs, b.logprobs) for a, b in zip(before, after, strict=True))

    engine.load_weights(original.items(), version=4)
    restored = generate_all(engine, prompts, greedy)
    for a, b in zip(before, restored, strict=True):
        np.testing.assert_array_equal(a.output_ids, b.output_ids)


def test_load_weights_rejects_bad_updates(engine, model):
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    name = "model.layers.0.mlp.up_proj.weight"

    with pytest.raises(ValueError, match=r"unknown names: model\.not_a_weight"):
        engine.load_weights({**state, "model.not_a_weight": torch.zeros(1)}, version=1)
    with pytest.raises(ValueError, match=r"missing names: model\.layers\.0\.mlp\.up_proj\.weight"):
        engine.load_weights({k: v for k, v in state.items() if k != name}, version=1)
    with pytest.raises(ValueError, match=r"shape mismatch: model\.layers\.0\.mlp\.up_proj\.weight"):
        engine.load_weights({**state, name: torch.zeros(3, 3)}, version=1)

    assert engine.weight_version == -1
    torch.testing.assert_close(dict(model.named_parameters())[name].detach(), state[name])

    # a good update's names and shapes are checked once; the next updates unlike it are checked again
    engine.load_weights(state, version=2)
    engine.load_weights({k: v + 1.0 for k, v in state.items()}, version=3)
    torch.testing.assert_close(dict(model.named_parameters())[name].detach(), state[name] + 1.0)
    with pytest.raises(ValueError, match=r"shape mismatch: model\.layers\.0\.mlp\.up_proj\.weight"):
        engine.load_weights({**state, name: torch.zeros(3, 3)}, version=4)
    with pytest.raises(ValueError, match=r"missing names: model\.layers\.0\.mlp\.up_proj\.weight"):
        engine.load_weights({k: v for k, v in state.items() if k != name}, version=4)
    assert engine.weight_version == 3


def test_abort_all_finishes_pending_requests(engine, prompts):
    async def run():
        tasks = [asyncio.create_task(engine.generate(p, SamplingParams(max_new_tokens=4))) for p in prompts]
        await asyncio.sleep(0)  # every task has queued its request; no batch has started
        engine.abort_all()
        return await asyncio.gather(*tasks)

    for out in asyncio.run(run()):
        assert out.finish_reason == "abort" and len(out.output_ids) == 0 and len(out.logprobs) == 0
    assert engine.stats["batches"] == 0


def has_sampled(engine) -> bool:
    """The batch has sampled a token. The continuous engine counts a batch at its prefill, before any token; the batch
    engine counts its tokens when the batch ends, so there the batch having started is all that can be seen."""
    if isinstance(engine, ContinuousTorchEngine):
        return engine.stats["generated_tokens"] > 0
    return engine.stats["batches"] > 0


def test_abort_all_stops_a_running_batch(engine, prompts):
    """From another thread (a stop, a signal's handler): with its steps on the event loop, the batch engine holds the
    loop until its batch ends, and the abort reaches the batch at its next step all the same."""

    def abort_once_sampled():
        while not has_sampled(engine):
            time.sleep(0.002)
        engine.abort_all()

    async def run():
        task = asyncio.create_task(engine.generate(prompts[0], SamplingParams(max_new_tokens=800)))
        aborting = threading.Thread(target=abort_once_sampled)
        aborting.start()
        out = await task
        aborting.join()
        return out

    out = asyncio.run(run())
    assert out.finish_reason == "abort" and 0 < len(out.output_ids) < 800
    assert len(out.logprobs) == len(out.output_ids)


def test_a_failing_batch_raises_in_its_callers(engine):
    with pytest.raises(IndexError):
        generate_all(engine, [[10**6]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="non-empty"):
        generate_all(engine, [[]], SamplingParams(max_new_tokens=2))


def test_row_settings_joined_and_selected_equal_those_built_at_once():
    vocab = 50
    params = [
        SamplingParams(max_new_tokens=3, temperature=0.0),
        SamplingParams(max_new_tokens=4, top_k=5, stop_token_ids=(7,)),
        SamplingParams(max_new_tokens=5, top_p=0.5, seed=3, stop_token_ids=(1, 2)),
        SamplingParams(max_new_tokens=6, top_k=9),
    ]

    def assert_same(got: RowSampling, rows: list[SamplingParams]) -> None:
        want = RowSampling(rows, vocab, "cpu")
        for name in (*RowSampling.TENSORS, "stop_ids"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        facts = ("all_greedy", "any_greedy", "any_top_p", "largest_top_k")
        assert [getattr(got, fact) for fact in facts] == [getattr(want, fact) for fact in facts]
        assert [row for row, _ in got.seeded_rows] == [row for row, _ in want.seeded_rows]

    joined = RowSampling(params[:2], vocab, "cpu")
    joined.extend(RowSampling(params[2:], vocab, "cpu"))  # stop ids of another width, a seeded row
    assert_same(joined, params)
    assert (joined.any_greedy, joined.any_top_p, joined.largest_top_k) == (True, True, 9)
    joined.select(torch.tensor([3, 2]), [3, 2])
    assert_same(joined, [params[3], params[2]])
    joined.extend(RowSampling(params[:1], vocab, "cpu"))  # a row with no stop ids after rows with some
    assert_same(joined, [params[3], params[2], params[0]])
    first = RowSampling(params[:1], vocab, "cpu")  # no stop ids, then rows with some
    first.extend(RowSampling(params[1:3], vocab, "cpu"))
    assert_same(first, params[:3])


def openmp_threads() -> int:
    """The calling thread's OpenMP thread count (what MKL's matrix products use), from the libgomp torch loaded."""
    import ctypes

    try:
        return ctypes.CDLL(None).omp_get_max_threads()
    except AttributeError:
        pytest.skip("this torch build does not use libgomp")


@ENGINE_CLASSES
def test_the_worker_thread_runs_with_the_torch_threads_of_the_rank(engine_class, model, tokenizer, prompts):
    """A fresh thread gets OpenMP's default count, not torch.set_num_threads': the engine's worker sets its own."""
    import threading

    fresh = []
    probe = threading.Thread(target=lambda: fresh.append(openmp_threads()))
    probe.start()
    probe.join()
    before = torch.get_num_threads()
    wanted = 2 if fresh[0] == 1 else 1  # a count a new thread would not get by itself
    torch.set_num_threads(wanted)
    try:
        engine = engine_class(model, pad_token_id=tokenizer.pad_token_id, seed=0)
        seen = []
        pass_name = "_step" if engine_class is ContinuousTorchEngine else "_run_batch"
        model_pass = getattr(engine, pass_name)

        def recording(*args, **kwargs):
            seen.append((threading.current_thread().name, openmp_threads()))
            return model_pass(*args, **kwargs)

        setattr(engine, pass_name, recording)
        sampling = SamplingParams(max_new_tokens=3, temperature=1.0)
        asyncio.run(engine.generate(prompts[0], sampling))
        engine.shutdown()
    finally:
        torch.set_num_threads(before)
    assert seen and all(name.startswith("torch-engine") for name, _ in seen), seen
    assert {threads for _, threads in seen} == {wanted}, (fresh, seen)
