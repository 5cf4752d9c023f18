"""The env agent loop in each family's chat format: a ToolEnv episode whose turns are the family's own markup (a
scripted engine writes what the template writes) builds, token for token, what `apply_chat_template` gives for the
whole conversation; malformed and cut calls reach the model as errors and count in tool_errors; and a real tiny model
of each family plays an episode through the batch engine."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoModelForCausalLM

from agentrl.chat.errors import NotAppendOnly
from agentrl.chat.turn import ParsedTurn, ToolCall
from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.engine.torch_engine import TorchEngine
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.env.tools import ToolEnv, tool
from agentrl.models.chat_format import ChatFormat
from agentrl.models.families import build_family_model
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.trajectory import Episode
from tests.unit.chat_fixtures import CORPUS, MALFORMED, WRITTEN, tokenizer

VARIANTS = [
    ("hermes", {}),
    ("qwen3", {}),
    ("qwen3", {"enable_thinking": False}),
    ("llama3", {}),
    ("mistral", {}),
    ("harmony", {}),
    ("deepseek_v3", {}),
    ("glm45", {}),
]
IDS = [f"{family}{'-thinking-off' if kwargs else ''}" for family, kwargs in VARIANTS]
QUESTION = "What is 2 + 3?"


class Adder(ToolEnv):
    @tool
    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first addend
            b: the second addend
        """
        return str(a + b)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return QUESTION, {}

    def answer(self, text):
        if "5" in text:
            return "correct", 1.0, True, False, {"success": True}
        return "Not yet: answer with the sum.", 0.0, False, False, {}


class ScriptedEngine(Engine):
    """Returns the scripted turns in order, cut to the turn's token budget (finish "length"), else "stop"."""

    def __init__(self, turns: list[list[int]], stop_ids):
        self.turns, self.stop_ids, self.prompts = list(turns), set(stop_ids), []

    async def generate(self, prompt_ids, sampling: SamplingParams) -> GenerateOutput:
        import numpy as np

        self.prompts.append(list(prompt_ids))
        ids = self.turns.pop(0)
        cut = ids[: sampling.max_new_tokens]
        finish = "stop" if cut and cut[-1] in self.stop_ids and len(cut) == len(ids) else "length"
        return GenerateOutput(np.array(cut), np.zeros(len(cut), dtype=np.float32), finish)

    def load_weights(self, state_dict, version: int) -> None:
        raise NotImplementedError


def chat_for(family, kwargs, rewritten="keep") -> ChatFormat:
    return ChatFormat(tokenizer(family), chat_format=family, template_kwargs=kwargs, rewritten=rewritten)


def play(chat, engine, max_new_tokens=400, max_turns=4, train_reasoning=True) -> Episode:
    host = EnvHost("adder", factory=lambda _id, **kw: Adder(max_steps=max_turns), chat_format=chat.family.name)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=chat.stop_ids)
    rules = EpisodeRules(sampling, EpisodeLimits(max_turns, max_new_tokens, 4000), train_reasoning=train_reasoning)
    episode = Episode(group=0, task_seed=0)
    return asyncio.run(run_episode(engine, LocalEnvClient(host), chat, rules, episode, key=0))


def written(chat, messages: list[dict], turn: ParsedTurn, tools, next_role: str) -> tuple[list[int], dict]:
    """The ids a model that keeps to its format generates for `turn` after `messages`, and the message."""
    message = chat.codec.assistant_message(turn)
    placed, placed_tools = chat.tools_placed([*messages, message], tools)
    ids = chat.codec.encode(chat.codec.written_turn(placed, len(placed) - 1, placed_tools))
    stop = chat.family.turn_stop(next_role)
    if stop is not None:
        ids.append(chat.tokenizer.convert_tokens_to_ids(stop))
    return ids, message


def whole_ids(chat, messages, tools) -> list[int]:
    placed, placed_tools = chat.tools_placed(messages, tools)
    return chat.tokenizer.apply_chat_template(
        placed,
        tools=placed_tools,
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
        **chat.codec.template_kwargs,
    )


def tool_loop(chat):
    """Scripted turns: a call, then two calls at once (one where the template writes only one call a turn), then
    the answer; and the conversation they make."""
    tools = Adder().tools
    thinking = chat.probe.thinking
    reasoning = "Add them." if thinking else ""
    messages = chat.prompt_messages(QUESTION)
    turns = []
    parallel = chat.probe.renders_parallel_calls
    for calls in ([ToolCall("add", {"a": 2, "b": 3})], [ToolCall("add", {"a": 1, "b": 1})] * (2 if parallel else 1)):
        if chat.family.name == "mistral":  # Mistral writes its call ids into the turn
            calls = [ToolCall(c.name, c.arguments, f"abcdefgh{i}") for i, c in enumerate(calls)]
        ids, message = written(chat, messages, ParsedTurn(calls=calls, reasoning=reasoning), tools, "tool")
        results = [str(c.arguments["a"] + c.arguments["b"]) for c in calls]
        messages = [*messages, message]
        pairs = zip(message["tool_calls"], results, strict=True)
        messages += [chat.family.tool_message(c["id"], "add", r) for c, r in pairs]
        turns.append(ids)
    try:
        answer, _ = written(chat, messages, ParsedTurn(content="It is 5.", reasoning=reasoning), tools, "user")
    except NotAppendOnly:  # harmony's answer is not written after its generation prompt: as its models write it
        answer = chat.codec.encode(WRITTEN[chat.family.name][0][0])
    return [*turns, answer], messages, tools


@pytest.mark.parametrize(("family", "kwargs"), VARIANTS, ids=IDS)
def test_a_tool_episodes_tokens_are_the_templates_tokens_for_the_whole_conversation(family, kwargs):
    chat = chat_for(family, kwargs)
    turns, messages, tools = tool_loop(chat)
    engine = ScriptedEngine(turns, chat.stop_ids)
    episode = play(chat, engine)
    assert (episode.finish, episode.success, episode.turns) == ("terminated", True, 3), episode.error
    assert episode.metrics["tool_calls"] == len(messages) - 5 + 2 and episode.metrics.get("tool_errors", 0) == 0
    assert [m["role"] for m in episode.messages] == [m["role"] for m in messages] + ["assistant"]
    last_start = episode.turn_spans[-1][0]
    generated = [t for start, end in episode.turn_spans for t in episode.tokens[start:end]]
    assert generated == [t for turn in turns for t in turn]
    assert [i for i, m in enumerate(episode.loss_mask) if m] == [
        i for start, end in episode.turn_spans for i in range(start, end)
    ]
    if chat.probe.append_only_after_tool:
        # everything before the last turn, as built turn by turn, is the template's rendering of the conversation
        assert episode.tokens[:last_start] == whole_ids(chat, messages, tools)
    else:  # Qwen3 with thinking off: its turns are kept as generated (chat.rewritten=keep)
        assert episode.tokens[:last_start] != whole_ids(chat, messages, tools)
        assert not episode.more_samples


def test_a_rewriting_template_starts_a_new_sample_with_new_sample():
    """Qwen3 with thinking off drops the prompt's empty think block from the history: with chat.rewritten=new_sample
    each turn after a tool result starts a sample whose prompt is the template's rendering of the conversation."""
    chat = chat_for("qwen3", {"enable_thinking": False}, rewritten="new_sample")
    turns, messages, tools = tool_loop(chat)
    episode = play(chat, ScriptedEngine(turns, chat.stop_ids))
    assert episode.finish == "terminated" and episode.success
    samples = [*episode.more_samples, episode]
    assert len(samples) == 3 and [s.sample for s in episode.more_samples] == [1, 2]
    assert all(s.reward == episode.reward and s.finish == "terminated" for s in samples)
    assert episode.tokens[: episode.prompt_len] == whole_ids(chat, messages, tools)
    assert episode.tokens[episode.prompt_len :] == turns[-1]
    assert [sum(s.loss_mask) for s in samples] == [len(t) for t in turns]


@pytest.mark.parametrize(("family", "kwargs"), VARIANTS, ids=IDS)
def test_a_malformed_call_is_an_error_the_model_reads_and_counts(family, kwargs):
    chat = chat_for(family, kwargs)
    text, words = MALFORMED[family if family != "qwen3" or not kwargs else "hermes"]
    bad = [*chat.codec.encode(text), chat.stop_ids[0]]
    answer = tool_loop(chat)[0][-1]
    engine = ScriptedEngine([bad, answer], chat.stop_ids)
    episode = play(chat, engine)
    assert episode.metrics["tool_errors"] == 1 and episode.metrics["tool_calls"] >= 1
    assert episode.messages[1] == {"role": "assistant", "content": chat.decode(bad)}
    assert episode.messages[2]["role"] == "user" and words in episode.messages[2]["content"]
    shown = chat.tokenizer.decode(engine.prompts[1][episode.turn_spans[0][1] :])
    assert words in shown  # the error reached the model


@pytest.mark.parametrize(("family", "kwargs"), VARIANTS, ids=IDS)
def test_a_call_cut_by_the_token_limit_is_closed_and_answered_with_an_error(family, kwargs):
    chat = chat_for(family, kwargs)
    turns, _, _ = tool_loop(chat)
    call = turns[0]
    cut = len(call) - 3  # inside the call's arguments or its closing markup
    engine = ScriptedEngine([call[:cut], turns[-1]], chat.stop_ids)
    episode = play(chat, engine, max_new_tokens=cut)
    start, end = episode.turn_spans[0]
    assert episode.tokens[start:end] == call[:cut]
    closing = chat.closing_ids(episode.messages[:2])
    assert episode.tokens[end : end + len(closing)] == closing and not any(episode.loss_mask[end : end + len(closing)])
    assert episode.metrics["tool_errors"] == 1  # the cut call is an error the model reads
    assert "error" in episode.messages[2]["content"]


@pytest.mark.parametrize("train_reasoning", [True, False])
def test_reasoning_trains_at_mask_one_unless_told_not_to(train_reasoning):
    chat = chat_for("qwen3", {})
    turns, _, _ = tool_loop(chat)
    episode = play(chat, ScriptedEngine(turns, chat.stop_ids), train_reasoning=train_reasoning)
    assert episode.metrics["reasoning_tokens"] > 0
    for start, end in episode.turn_spans:
        ids, mask = episode.tokens[start:end], episode.loss_mask[start:end]
        text = chat.codec.decode(ids)
        masked = chat.codec.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        if train_reasoning:
            assert all(mask)
        else:  # the think block at mask 0, the calls and the answer at mask 1
            assert masked.startswith("<think>") and masked.rstrip().endswith("</think>") and "Add them." in masked
            trained = chat.codec.decode([t for t, m in zip(ids, mask, strict=True) if m])
            assert trained.strip() == text.split("</think>")[1].strip()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop_family_models")
    families = sorted({family for family, _ in VARIANTS})
    return {family: build_family_model(family, root / family, CORPUS) for family in families}


@pytest.mark.parametrize(("family", "kwargs"), VARIANTS, ids=IDS)
def test_a_real_tiny_model_of_the_family_plays_a_tool_episode(model_dirs, family, kwargs):
    """A random tiny model writes what it writes; the loop keeps its ids at mask 1, closes what the length cut,
    parses it in the family's format, and after each turn appends exactly the template's ids for what follows."""
    folder = model_dirs[family]
    from agentrl.models.loading import load_tokenizer

    chat = ChatFormat(load_tokenizer(str(folder)), template_kwargs=kwargs)
    assert chat.family.name == family  # detected from the folder
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    engine = TorchEngine(model, pad_token_id=chat.tokenizer.pad_token_id, seed=0)
    try:
        episode = play(chat, engine, max_new_tokens=12, max_turns=3)
    finally:
        engine.shutdown()
    assert episode.finish in ("terminated", "truncated") and episode.error is None
    tools = Adder().tools
    assert episode.tokens[: episode.prompt_len] == whole_ids(chat, episode.messages[:1], tools)
    assistants = [i for i, m in enumerate(episode.messages) if m["role"] == "assistant"]
    for k, (_, end) in enumerate(episode.turn_spans[:-1]):
        history = episode.messages[: assistants[k] + 1]
        following = episode.messages[assistants[k] + 1 : assistants[k + 1]]
        closing = [] if episode.tokens[end - 1] in chat.stop_ids else chat.closing_ids(history, tools)
        _, placed = chat.tools_placed([], tools)
        full, at = chat.codec.continuation_start(history, following, placed, episode.tokens[end - 1], True)
        after = closing + chat.content.ids(full, [], at)
        assert episode.tokens[end : episode.turn_spans[k + 1][0]] == after
    assert [i for i, m in enumerate(episode.loss_mask) if m] == [
        i for start, end in episode.turn_spans for i in range(start, end)
    ]


def test_eval_reports_reasoning_length_where_turns_reason():
    from agentrl.evaluation.metrics import TaskResult, aggregate

    def task(reasoning):
        return TaskResult(
            0,
            "t",
            rewards=[1.0, 0.0],
            successes=[True, False],
            turns=[2, 1],
            tokens=[9, 9],
            response_tokens=[4, 4],
            reasoning_tokens=reasoning,
            finish=["terminated"] * 2,
        )

    metrics = aggregate([task([6.0, 3.0])], 2)
    assert metrics["reasoning_tokens_mean"] == 4.5 and metrics["reasoning_tokens_per_turn"] == 3.0
    assert "reasoning_tokens_mean" not in aggregate([task([0.0, 0.0])], 2)


def chat_config(path, **chat):
    from agentrl.config import load_config

    return load_config(None, [f"model.path={path}", *(f"chat.{k}={v}" for k, v in chat.items())])


def test_start_up_names_the_family_and_refuses_a_bad_chat_format_in_one_line(model_dirs, tmp_path):
    from agentrl.run.preflight import ChatFormatUnusable, check_chat_format

    said = []
    name = check_chat_format(chat_config(model_dirs["qwen3"]), say=lambda line, **_: said.append(line))
    assert name == "qwen3" and "chat format qwen3 (detected" in said[0] and "rewrites the history" in said[0]
    assert check_chat_format(chat_config(model_dirs["hermes"], format="hermes"), say=lambda *a, **k: None) == "hermes"
    bare = tmp_path / "bare"
    tokenizer = build_family_tokenizer_without_template(bare)
    cases = [
        (chat_config(model_dirs["llama3"], format="mistral"), "chat.format=mistral", "end-of-turn"),
        (chat_config(bare), f"model.path={bare}", "chat template"),
        (chat_config(model_dirs["hermes"], format="nowhere.module:Family"), "chat.format=nowhere", "nowhere"),
    ]
    for config, where, words in cases:
        with pytest.raises(ChatFormatUnusable) as refused:
            check_chat_format(config, say=lambda *a, **k: None)
        message = str(refused.value)
        assert "\n" not in message and message.startswith(where) and words in message, message
    assert tokenizer.chat_template is None


def build_family_tokenizer_without_template(folder):
    tok = tokenizer("hermes")
    saved = tok.chat_template
    tok.chat_template = None
    try:
        tok.save_pretrained(folder)
    finally:
        tok.chat_template = saved
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize(("family", "kwargs"), VARIANTS, ids=IDS)
def test_the_cached_split_gives_the_ids_rendering_gives(family, kwargs):
    """Tool results after the first of their shape take the template's text found once (where the probe says
    append-only); their ids equal rendering the conversation, whatever the content holds."""
    cached = chat_for(family, kwargs)
    calls = [ToolCall("add", {"a": 2, "b": 3}, "abcdefgh0" if family == "mistral" else None)]
    message = cached.codec.assistant_message(ParsedTurn(calls=calls, reasoning="Add." if cached.probe.thinking else ""))
    history = [*cached.prompt_messages(QUESTION), message]
    tools = Adder().tools
    stop = cached.stop_ids[0]
    contents = ["5", 'a "quoted"\nline\\', "forged <|im_end|> and <|eot_id|>", "é <a href='x'>&</a>", "5"]
    for content in contents:
        new = [cached.family.tool_message(message["tool_calls"][0]["id"], "add", content)]
        fresh = chat_for(family, kwargs)  # nothing cached: renders
        assert cached.continuation_ids(history, new, tools, stop) == fresh.continuation_ids(history, new, tools, stop)
    split = cached._splits.get(cached._shape(new, stop))
    assert (split is not None) == (cached.probe.append_only_after_tool and family != "mistral")  # Mistral writes ids
