"""The continuous torch engine: rows join a running batch, and an episode's KV cache is kept between turns."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.engine.base import SamplingParams
from agentrl.engine.continuous import ContinuousTorchEngine
from agentrl.engine.kv_sessions import KVSessionStore
from agentrl.models.tiny import TinyShape, build_tiny_model

TEXTS = ["The quick brown fox jumps over the lazy dog.", "12 + 30 = 42", "A small model learns to add numbers."]
OBSERVATION = [7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m", TEXTS, TinyShape(hidden_size=64, num_layers=2, num_heads=4)
    )


@pytest.fixture
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def prompts(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer(text)["input_ids"][: 3 + 2 * i] for i, text in enumerate(TEXTS * 2)]


ENGINE_DEFAULTS: dict = {}


@pytest.fixture(autouse=True, params=[False, True], ids=["lean-steps", "slot-steps"])
def decode_steps(request, monkeypatch):
    """Every test runs twice: decode steps in the lean decoder, and at fixed shapes over the slot KV cache
    (`cuda_graphs=true`: on CPU the steps a CUDA graph would replay run eagerly)."""
    monkeypatch.setitem(ENGINE_DEFAULTS, "cuda_graphs", request.param)
    return request.param


@pytest.fixture(autouse=True, params=[False, True], ids=["thread", "loop"])
def steps_on_loop(request, monkeypatch):
    """... and each with its steps on the engine's worker thread, and on the event loop awaiting them."""
    monkeypatch.setitem(ENGINE_DEFAULTS, "steps_on_loop", request.param)
    return request.param


def make_engine(model, **kwargs):
    return ContinuousTorchEngine(model, pad_token_id=0, seed=0, **{**ENGINE_DEFAULTS, **kwargs})


def full_forward_logprobs(model, prompt, output_ids, temperature=1.0):
    ids = torch.tensor([list(prompt) + output_ids.tolist()], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0].float().cpu()
    logprobs = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)  # greedy: T = 1
    return logprobs[len(prompt) - 1 : -1].gather(1, torch.from_numpy(output_ids)[:, None]).squeeze(1).numpy()


def run_episodes(engine, prompts, turns, sampling_for, model=None, between=None):
    """One coroutine per episode: generate, append the output and an observation, repeat.

    Returns per episode the list of (conversation sent, output) of every turn; with `model`,
    checks every turn's logprobs against one unpadded forward pass of the whole conversation.
    """

    async def episode(index, prompt):
        history, turns_seen = list(prompt), []
        for turn in range(turns):
            out = await engine.generate(history, sampling_for(index, turn))
            turns_seen.append((list(history), out))
            if model is not None:
                expected = full_forward_logprobs(model, history, out.output_ids, sampling_for(index, turn).temperature)
                np.testing.assert_allclose(out.logprobs, expected, atol=1e-4)
            history += out.output_ids.tolist() + OBSERVATION[: 1 + (index + turn) % len(OBSERVATION)]
            if between is not None:
                await between(index, turn)
        return turns_seen

    async def run():
        return await asyncio.gather(*(episode(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(run())


def ragged(index, turn):
    return SamplingParams(max_new_tokens=2 + (3 * index + 5 * turn) % 7, temperature=0.8)


def test_later_turns_prefill_only_the_new_tokens_and_keep_logprobs_exact(model, prompts):
    engine = make_engine(model)
    episodes = run_episodes(engine, prompts, 4, ragged, model=model)
    engine.shutdown()
    for turns in episodes:
        assert turns[0][1].meta["cached_tokens"] == 0
        for (previous_history, previous), (_, out) in itertools.pairwise(turns):
            # Every token the previous turn computed is reused: its prompt and its output but the last token.
            assert out.meta["cached_tokens"] == len(previous_history) + len(previous.output_ids) - 1
    stats = engine.stats
    sent = sum(len(history) for turns in episodes for history, _ in turns)
    assert stats["reused_tokens"] + stats["prefill_tokens"] == sent
    assert stats["reused_tokens"] > 2 * stats["prefill_tokens"]


def test_kept_kv_gives_the_same_greedy_tokens_as_prefilling_everything(model, prompts):
    greedy = lambda index, turn: SamplingParams(max_new_tokens=3 + (index + turn) % 5, temperature=0.0)  # noqa: E731
    runs = []
    for budget in (256 << 20, 0):
        engine = make_engine(model, kv_cache_bytes=budget)
        runs.append(run_episodes(engine, prompts, 4, greedy))
        engine.shutdown()
        assert (engine.stats["reused_tokens"] > 0) == (budget > 0)
    for kept, fresh in zip(*runs, strict=True):
        for (_, a), (_, b) in zip(kept, fresh, strict=True):
            np.testing.assert_array_equal(a.output_ids, b.output_ids)
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_a_request_joins_the_running_batch_and_leaves_before_it(model, prompts):
    engine = make_engine(model)

    async def run():
        long = asyncio.create_task(engine.generate(prompts[0], SamplingParams(max_new_tokens=400)))
        while engine.stats["steps"] < 5:  # the long row is decoding
            await asyncio.sleep(0.002)
        short = await engine.generate(prompts[1], SamplingParams(max_new_tokens=3))
        assert not long.done(), "the short request should not wait for the long one"
        return short, await long

    short, long = asyncio.run(run())
    engine.shutdown()
    assert len(short.output_ids) == 3 and len(long.output_ids) == 400
    assert engine.stats["prefills"] == 2 and engine.stats["largest_batch"] == 2
    for prompt, out in ((prompts[1], short), (prompts[0], long)):
        np.testing.assert_allclose(out.logprobs, full_forward_logprobs(model, prompt, out.output_ids), atol=1e-4)


def test_a_small_budget_evicts_and_evicted_episodes_are_prefilled_again(model, prompts):
    probe = make_engine(model)
    run_episodes(probe, prompts[:1], 1, lambda i, t: SamplingParams(max_new_tokens=4))
    probe.shutdown()
    one_entry = probe.sessions.nbytes
    engine = make_engine(model, kv_cache_bytes=3 * one_entry)  # room for about two of six episodes
    run_episodes(engine, prompts, 3, ragged, model=model)
    engine.shutdown()
    assert engine.stats["evictions"] > 0
    assert engine.sessions.nbytes <= 3 * one_entry
    assert engine.stats["reused_tokens"] > 0


def test_new_weights_drop_kept_kv(model, prompts):
    engine = make_engine(model)
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    perturbed = {name: t + 0.3 * torch.randn(t.shape, generator=generator) for name, t in original.items()}

    async def between(index, turn):
        if turn == 0 and index == 0:
            engine.load_weights(perturbed, version=5)

    episodes = run_episodes(engine, prompts[:1], 2, ragged, between=between)
    engine.shutdown()
    (history, out) = episodes[0][1]
    assert out.weight_version == 5 and out.meta["cached_tokens"] == 0 and len(engine.sessions) == 1
    np.testing.assert_allclose(out.logprobs, full_forward_logprobs(model, history, out.output_ids, 0.8), atol=1e-4)


def test_rows_running_during_a_weight_update_are_prefilled_again(model, prompts):
    engine = make_engine(model)
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    perturbed = {name: t * 1.5 for name, t in original.items()}

    async def run():
        task = asyncio.create_task(engine.generate(prompts[2], SamplingParams(max_new_tokens=900)))
        while engine.stats["steps"] < 3:
            await asyncio.sleep(0.002)
        prefills = engine.stats["prefills"]
        await asyncio.get_running_loop().run_in_executor(None, engine.load_weights, perturbed, 2)
        return await task, prefills

    out, prefills_before_update = asyncio.run(run())
    engine.shutdown()
    assert len(out.output_ids) == 900 and out.weight_version == -1  # the oldest version that shaped it
    assert engine.stats["prefills"] == prefills_before_update + 1  # the running row was prefilled again
    # The last tokens were decoded under the new weights from a cache computed under them.
    tail = full_forward_logprobs(model, prompts[2], out.output_ids)[-20:]
    np.testing.assert_allclose(out.logprobs[-20:], tail, atol=1e-4)


def test_session_store_takes_the_longest_prefix_and_evicts_the_oldest():
    def entry(n):
        return [(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))]

    store = KVSessionStore(budget_bytes=2 * 16 * 10)  # 16 bytes per token: two ten-token entries
    store.put(list(range(10)), entry(10), version=0)
    store.put(list(range(5)), entry(5), version=0)
    assert store.take(list(range(10)), version=0).tokens == list(range(5))  # proper prefix only
    store.put(list(range(5)), entry(5), version=0)
    assert store.take(list(range(12)), version=0).tokens == list(range(10))
    assert store.take([0, 1, 2, 3, 9, 9], version=0) is None
    store.put([1] * 10, entry(10), version=0)
    store.put([2] * 10, entry(10), version=0)  # over budget: the oldest goes
    assert store.evictions == 1 and len(store) == 2
    assert store.take([*range(5), 1], version=0) is None
    assert store.take([1] * 11, version=1) is None  # computed under older weights


def test_config_picks_the_scheduler(model):
    from agentrl.config import TorchEngineConfig
    from agentrl.engine import build_torch_engine
    from agentrl.engine.torch_engine import TorchEngine

    continuous = build_torch_engine(
        model, TorchEngineConfig(scheduler="continuous", kv_cache_mb=2), pad_token_id=0, seed=0
    )
    default = build_torch_engine(model, TorchEngineConfig(), pad_token_id=0, seed=0)
    assert isinstance(continuous, ContinuousTorchEngine) and continuous.sessions.budget_bytes == 2 << 20
    assert type(default) is TorchEngine
    continuous.shutdown()
    default.shutdown()


def test_steps_on_a_loop_start_no_thread_and_serve_one_loop_at_a_time(model, prompts):
    engine = make_engine(model, steps_on_loop=True)
    threads = threading.active_count()
    outputs = []

    def on_another_loop():
        outputs.append(asyncio.run(engine.generate(prompts[0], SamplingParams(max_new_tokens=300))))

    other = threading.Thread(target=on_another_loop)
    other.start()
    while engine.stats["steps"] < 3:  # that loop is stepping its row
        time.sleep(0.002)
    assert threading.active_count() == threads + 1  # that loop's thread alone: the engine started none
    with pytest.raises(RuntimeError, match="steps_on_loop=False"):
        asyncio.run(engine.generate(prompts[1], SamplingParams(max_new_tokens=3)))
    other.join()
    assert len(outputs[0].output_ids) == 300
    assert len(asyncio.run(engine.generate(prompts[1], SamplingParams(max_new_tokens=3))).output_ids) == 3
    engine.shutdown()


@pytest.mark.parametrize(
    ("steps_on", "device", "keep_loop_free", "on_loop"),
    [
        ("auto", "cpu", False, True),
        ("auto", "cpu", True, False),  # agent programs' HTTP requests are served on the rollout's event loop
        ("auto", "cuda:0", False, False),
        ("loop", "cuda:0", True, True),
        ("thread", "cpu", False, False),
    ],
)
def test_steps_on_picks_where_the_steps_run(steps_on, device, keep_loop_free, on_loop):
    from agentrl.config import TorchEngineConfig
    from agentrl.engine import steps_on_loop

    assert steps_on_loop(TorchEngineConfig(steps_on=steps_on), device, keep_loop_free) is on_loop


@pytest.mark.parametrize(
    ("staleness", "scheduler", "dispatch", "ranks", "agent_programs", "has_work"),
    [
        (0, "batch", "static", 2, False, False),
        (1, "batch", "static", 1, False, True),  # a look for weights while a batch runs
        (1, "continuous", "static", 1, False, False),  # it looks between steps
        (0, "batch", "dynamic", 2, False, True),  # the other rank's task claims
        (0, "batch", "dynamic", 1, False, False),
        (0, "continuous", "dynamic", 2, False, False),
        (0, "batch", "static", 1, True, True),  # HTTP requests
    ],
)
def test_a_rollout_loop_has_work_while_the_model_runs(staleness, scheduler, dispatch, ranks, agent_programs, has_work):
    from agentrl.config import RolloutConfig
    from agentrl.engine import loop_has_work

    rollout = RolloutConfig(max_staleness=staleness, dispatch=dispatch, engine={"scheduler": scheduler})
    assert loop_has_work(rollout, agent_programs, ranks) is has_work


def test_sliding_window_models_are_refused_with_the_fix(model):
    from agentrl.errors import UserError

    model.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(UserError, match="scheduler=batch"):
        make_engine(model)


def test_slot_steps_grow_their_buffers_and_give_the_lean_steps_tokens(model, prompts, monkeypatch, decode_steps):
    if not decode_steps:
        pytest.skip("compares the slot steps with the lean ones")
    from agentrl.engine import slot_batch

    monkeypatch.setattr(slot_batch, "MIN_COLUMNS", 8)  # the slots grow while rows decode
    monkeypatch.setattr(slot_batch, "MIN_SLOTS", 1)

    def greedy(index, turn):
        return SamplingParams(max_new_tokens=2 + (index + 3 * turn) % 6, temperature=0)

    slots, lean = make_engine(model), make_engine(model, cuda_graphs=False)
    with_slots = run_episodes(slots, prompts, 6, greedy)
    without = run_episodes(lean, prompts, 6, greedy)
    for episode_slots, episode_lean in zip(with_slots, without, strict=True):
        for (history, out), (lean_history, lean_out) in zip(episode_slots, episode_lean, strict=True):
            assert history == lean_history
            assert out.output_ids.tolist() == lean_out.output_ids.tolist()
    batch = slots._batch
    assert batch.generation >= 2 and batch.columns >= 64 and batch.slots >= len(prompts)  # grown while decoding
    assert slots.stats["reused_tokens"] > 0  # later turns joined the slots from kept KV
    slots.shutdown()
    lean.shutdown()


def test_step_buckets():
    from agentrl.engine.slot_batch import column_bucket, row_bucket

    assert [row_bucket(n) for n in (1, 2, 3, 5, 32, 33, 64, 65, 250)] == [1, 2, 4, 8, 32, 64, 64, 96, 256]
    assert [column_bucket(n) for n in (1, 64, 65, 200, 1025)] == [64, 64, 128, 256, 2048]


def test_cuda_graphs_true_on_a_model_without_the_lean_decoder_names_the_fix(model, monkeypatch):
    from agentrl.engine import continuous as continuous_engine
    from agentrl.errors import UserError

    monkeypatch.setattr(continuous_engine.LeanDecoder, "for_model", classmethod(lambda cls, model: None))
    with pytest.raises(UserError, match="cuda_graphs=auto or false"):
        make_engine(model, cuda_graphs=True)
    assert make_engine(model, cuda_graphs="auto").graphs is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU; this machine has none")
def test_cuda_graph_steps_give_the_lean_steps_tokens_and_the_forwards_logprobs(model, prompts, decode_steps):
    if not decode_steps:
        pytest.skip("runs once")
    model = model.cuda()

    def greedy(index, turn):
        return SamplingParams(max_new_tokens=3 + (index + 2 * turn) % 9, temperature=0)

    graphs, lean = make_engine(model, cuda_graphs="auto"), make_engine(model, cuda_graphs=False)
    assert graphs.graphs is not None and graphs.graphs.capture
    with_graphs, without = run_episodes(graphs, prompts, 3, greedy), run_episodes(lean, prompts, 3, greedy)
    for episode_graphs, episode_lean in zip(with_graphs, without, strict=True):
        for (history, out), (_, lean_out) in zip(episode_graphs, episode_lean, strict=True):
            assert out.output_ids.tolist() == lean_out.output_ids.tolist()
            np.testing.assert_allclose(out.logprobs, full_forward_logprobs(model, history, out.output_ids), atol=1e-4)
    assert graphs.graphs.captures > 0 and graphs.stats["steps"] > 0
    run_episodes(graphs, prompts, 2, ragged, model=model)  # sampled rows (logprobs checked against the forward)
    graphs.shutdown()
    lean.shutdown()


def test_a_last_turn_is_not_kept_and_rows_finishing_together_share_one_copy(model, prompts):
    engine = make_engine(model)

    async def turn(last_turn):
        sampling = SamplingParams(max_new_tokens=3, temperature=0.0, last_turn=last_turn)
        return await asyncio.gather(*(engine.generate(prompt, sampling) for prompt in prompts))

    asyncio.run(turn(last_turn=True))
    assert len(engine.sessions) == 0 and engine.sessions.nbytes == 0
    outputs = asyncio.run(turn(last_turn=False))  # greedy, one length: every row finishes at the same step
    engine.shutdown()
    kept = [len(prompt) + len(out.output_ids) - 1 for prompt, out in zip(prompts, outputs, strict=True)]
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    token_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4  # keys and values, float32
    # one copy: the slots' tokens one after another; the running batch's rows, each as wide as the longest
    stored = (sum(kept) if engine.graphs is not None else len(prompts) * max(kept)) * token_bytes
    assert len(engine.sessions) == len(prompts) and engine.sessions.nbytes == stored
    blocks = set()
    for prompt, out in zip(prompts, outputs, strict=True):  # the next turn takes each row's own cache back
        entry = engine.sessions.take([*prompt, *out.output_ids.tolist(), 5], version=engine.weight_version)
        assert entry.tokens == [*prompt, *out.output_ids.tolist()[:-1]]
        assert engine.sessions.nbytes == (stored if len(engine.sessions) else 0)
        blocks.add(id(entry.block))
    assert (
        len(blocks) == 1 and len(engine.sessions) == 0 and engine.sessions.nbytes == 0
    )  # the shared copy is released with its last entry


def test_a_budget_its_rows_tokens_fit_but_not_their_padding_keeps_the_last_rows_that_fit(model, prompts):
    greedy = SamplingParams(max_new_tokens=3, temperature=0.0)
    probe = make_engine(model)
    outputs = asyncio.run(_all(probe, prompts, greedy))  # every row finishes at the same step
    probe.shutdown()
    kept = [len(prompt) + len(out.output_ids) - 1 for prompt, out in zip(prompts, outputs, strict=True)]
    token_bytes = probe.sessions.nbytes // (sum(kept) if probe.graphs is not None else len(kept) * max(kept))
    # the rows' tokens fit; in the running batch's layout (each row as wide as the longest) they do not
    budget = sum(kept) * token_bytes
    engine = make_engine(model, kv_cache_bytes=budget)
    asyncio.run(_all(engine, prompts, greedy))
    engine.shutdown()
    assert 0 < engine.sessions.nbytes <= budget
    if engine.graphs is not None:  # the slots' tokens one after another: all fit
        assert len(engine.sessions) == len(prompts)
    else:  # as many of the last rows as fit at the widest one's width (the rows' widths grow with their index)
        assert len(engine.sessions) == budget // (max(kept) * token_bytes)


def test_rows_finishing_together_keep_the_kv_a_full_prefill_computes(model, prompts):
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    engine = make_engine(model)
    outputs = asyncio.run(_all(engine, prompts, greedy))
    entries = [
        engine.sessions.take([*p, *o.output_ids.tolist(), 5], engine.weight_version)
        for p, o in zip(prompts, outputs, strict=True)
    ]
    engine.shutdown()
    for entry in entries:
        with torch.no_grad():
            cache = model(torch.tensor([entry.tokens]), use_cache=True).past_key_values
        kv = entry.kv
        for layer, cache_layer in enumerate(cache.layers):
            keys = kv[0, layer] if isinstance(kv, torch.Tensor) else kv[layer][0][0]
            values = kv[1, layer] if isinstance(kv, torch.Tensor) else kv[layer][1][0]
            torch.testing.assert_close(keys, cache_layer.keys[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(values, cache_layer.values[0], atol=1e-4, rtol=1e-4)


async def _all(engine, prompts, sampling):
    return await asyncio.gather(*(engine.generate(prompt, sampling) for prompt in prompts))


@pytest.mark.parametrize("max_turns", [1, 3])
def test_the_agent_loop_keeps_kv_for_every_turn_but_an_episodes_last(tiny_model_dir, max_turns):
    from agentrl.config import from_dict
    from agentrl.env.client import LocalEnvClient
    from agentrl.env.host import EnvHost
    from agentrl.roles.rollout_parts import rollout_worker

    config = from_dict(
        {
            "model": {"path": str(tiny_model_dir)},
            "rollout": {
                "tasks_per_step": 2,
                "group_size": 4,
                "max_new_tokens": 3,
                "max_turns": max_turns,
                "engine": {"scheduler": "continuous", "cuda_graphs": ENGINE_DEFAULTS["cuda_graphs"]},
            },
        }
    )
    client = LocalEnvClient(EnvHost("guess_number", {}))
    worker = rollout_worker(config, client, 0, 1)
    try:
        episodes, _ = worker.collect(step=0)
    finally:
        worker.engine.shutdown()
        client.shutdown()
    engine = worker.engine
    assert isinstance(engine, ContinuousTorchEngine) and not any(e.error for e in episodes)
    # Left in the store: the last turn of each episode the env ended early; an episode's turn at max_turns never is.
    assert len(engine.sessions) == sum(e.finish != "max_turns" for e in episodes)
    if max_turns == 1:
        assert engine.sessions.nbytes == 0 and engine.stats["reused_tokens"] == 0
    else:
        assert engine.stats["reused_tokens"] > 0 and any(e.turns == max_turns for e in episodes)
