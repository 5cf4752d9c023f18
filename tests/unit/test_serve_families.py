"""agentrl serve and the training gateway with a model of each chat format family (agentrl/chat), over real HTTP
with the openai SDK: prompts rendered through the family's template, replies parsed into content,
reasoning_content and tool_calls (whole, and streamed token by token), the family's call ids and stop ids, a
multi-turn tool conversation sent back the family's way, the gateway's stitching per family, and a real
generation by each family's tiny model."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest

from agentrl.chat.errors import NotAppendOnly
from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.gateway.trace import samples_from_calls
from agentrl.models.families import build_family_model
from agentrl.serve.protocol import APIError
from tests.unit.chat_fixtures import CORPUS, FAMILIES, TOOLS, WRITTEN
from tests.unit.serve_server import ThreadServer

openai = pytest.importorskip("openai")
MODEL = "family-model"
QUESTION = [{"role": "user", "content": "What is 2 + 3? And the weather in Paris?"}]
# docs/chat-formats.md's table: the templates that render the history differently once a user message follows
REWRITTEN_AFTER_USER = {"qwen3", "mistral", "harmony", "glm45"}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("family_serve")
    return {family: build_family_model(family, root / family, CORPUS) for family in FAMILIES}


def load_tokenizer(folder):
    from agentrl.models.loading import load_tokenizer as load

    return load(str(folder))


def scripted_turns(family: str):
    """(call turn, answer turn) as the family's models write them (chat_fixtures.WRITTEN), each (text, ParsedTurn):
    with reasoning where the family has written one, and content where it has."""
    written = WRITTEN[family]
    calls = [entry for entry in written if entry[1].calls]
    answers = [entry for entry in written if entry[1].content and not entry[1].calls]
    richest = lambda entry: (bool(entry[1].reasoning), bool(entry[1].content))  # noqa: E731
    return max(calls, key=richest), max(answers, key=richest)


def generated_ids(renderer, text: str, prompt_ids, next_role: str) -> list[int]:
    """The ids a model of the family generates for `text`, its stop token included: the reasoning the prompt opened
    not opened again (R1), the family's own stop (GLM's next role, harmony's <|call|> or <|return|> in the text)."""
    codec, family = renderer.codec, renderer.family
    if codec.opens_reasoning(prompt_ids):  # the turn goes on inside the reasoning, and closes it before the rest
        text = text.lstrip().removeprefix(family.reasoning_open)
        text = text if family.reasoning_close in text else family.reasoning_close + text
    ids = codec.encode(text)
    if ids and ids[-1] in codec.stop_ids:
        return ids
    stop = family.turn_stop(next_role)
    return [*ids, codec.tokenizer.convert_tokens_to_ids(stop) if stop else codec.stop_ids[0]]


class ScriptedEngine(Engine):
    """The HTTP and parsing layer's stand-in engine: answers each call with the next scripted ids, reporting them
    token by token as the continuous engine does; keeps each call's prompt and sampling."""

    streams_tokens = True
    weight_version = 4

    def __init__(self, replies=()):
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.samplings: list[SamplingParams] = []

    def allow_grammars(self, tokenizer) -> bool:
        return False

    async def generate(self, input_ids, sampling, progress=None):
        self.prompts.append(list(input_ids))
        self.samplings.append(sampling)
        reply = self.replies.pop(0)
        ids = reply(list(input_ids)) if callable(reply) else reply
        logprobs = np.full(len(ids), -0.25, dtype=np.float32)
        for token in ids if progress is not None else ():
            progress([token], [-0.25])
            await asyncio.sleep(0)
        reason = "stop" if ids and ids[-1] in sampling.stop_token_ids else "length"
        return GenerateOutput(np.asarray(ids, dtype=np.int64), logprobs, reason, self.weight_version)

    def load_weights(self, named_tensors, version):
        raise NotImplementedError


def served_app(folder, engine, records, chat_format=None):
    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend

    tokenizer = load_tokenizer(folder)
    backend = LocalBackend(engine, tokenizer)
    completions = Completions(backend, tokenizer, MODEL, 2048, on_call=records.append, chat_format=chat_format)
    return completions, build_app(completions)


def script(renderer, family):
    """The scripted engine's two replies (the call turn after the question, the answer after the tool results),
    each made from the prompt it gets, and the two turns' parses."""
    (call_text, call_turn), (answer_text, answer_turn) = scripted_turns(family)
    replies = [
        lambda prompt: generated_ids(renderer, call_text, prompt, "tool"),
        lambda prompt: generated_ids(renderer, answer_text, prompt, "user"),
    ]
    return replies, call_turn, answer_turn


def tool_results(family_obj, calls) -> list[dict]:
    """The client's tool messages for the reply's calls (each result names its call's id)."""
    return [family_obj.tool_message(call.id, call.function.name, f"result {i}") for i, call in enumerate(calls)]


def expected_prompt(renderer, messages: list[dict]) -> list[int]:
    """The family's template on `messages` (tools the template's way, or listed in the system message)."""
    placed, tools = renderer.tools_placed(messages, TOOLS)
    return renderer.codec.prompt_ids(placed, tools)


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tool_conversation_through_serve_is_written_and_read_the_familys_way(model_dirs, family):
    engine, records = ScriptedEngine(), []
    completions, app = served_app(model_dirs[family], engine, records)
    renderer, family_obj = completions.renderer, completions.renderer.family
    assert family_obj.name == family  # detected from the folder
    engine.replies, call_turn, answer_turn = script(renderer, family)
    with ThreadServer(app) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        first = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS).choices[0]
        assert first.finish_reason == "tool_calls"
        calls = first.message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            (c.name, c.arguments) for c in call_turn.calls
        ]
        assert (first.message.content or "") == call_turn.content
        assert reasoning_of(first.message) == (call_turn.reasoning or None)
        if family == "mistral":  # the model's own 9-character ids
            assert [c.id for c in calls] == [c.id for c in call_turn.calls]
        else:
            assert all(c.id.startswith("call_") for c in calls) and len({c.id for c in calls}) == len(calls)
        assert engine.samplings[0].stop_token_ids == renderer.codec.stop_ids  # the family's end-of-turn tokens

        sent_back = first.message.model_dump(exclude_none=True)
        history = [*QUESTION, sent_back, *tool_results(family_obj, calls)]
        second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS).choices[0]
    assert second.finish_reason == "stop" and second.message.content == answer_turn.content
    assert reasoning_of(second.message) == (answer_turn.reasoning or None)
    assert records[0].prompt_ids == expected_prompt(renderer, QUESTION)
    call_ids = [c.id for c in calls]
    written = [
        *QUESTION,
        family_obj.assistant_message(call_turn, call_ids),
        *tool_results(family_obj, calls),
    ]
    assert records[1].prompt_ids == expected_prompt(renderer, written)
    prompt = renderer.codec.decode(records[1].prompt_ids)
    assert "result 0" in prompt and "Paris" in prompt
    if family == "mistral":
        assert call_ids[0] in prompt  # the tool result names its call's id
    if not renderer.renders_tools:  # DeepSeek: the tools listed in the system message, with the family's markup
        assert "get_weather" in prompt and "<｜tool▁calls▁begin｜>" in renderer.tools_text(TOOLS)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stream_splits_reasoning_and_content_across_chunks_and_sends_the_calls_whole(model_dirs, family):
    engine, records = ScriptedEngine(), []
    completions, app = served_app(model_dirs[family], engine, records)
    renderer = completions.renderer
    replies, call_turn, answer_turn = script(renderer, family)
    engine.replies = [replies[0], replies[0], replies[1], replies[1]]  # each turn streamed, then whole
    with ThreadServer(app) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        content, reasoning, calls, finish = stream_reply(client, {"model": MODEL, "messages": QUESTION, "tools": TOOLS})
        whole = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS).choices[0]
        assert finish == "tool_calls" and [c.index for c in calls] == list(range(len(call_turn.calls)))
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls
        ]
        assert "".join(content) == call_turn.content == (whole.message.content or "")
        assert "".join(reasoning) == call_turn.reasoning
        if call_turn.reasoning:
            assert len(reasoning) > 1  # token by token, not the whole reasoning at the end
        history = [*QUESTION, whole.message.model_dump(exclude_none=True)]
        history += tool_results(renderer.family, whole.message.tool_calls)
        content, reasoning, calls, finish = stream_reply(client, {"model": MODEL, "messages": history, "tools": TOOLS})
        whole = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS).choices[0]
    assert finish == "stop" and calls == []
    assert "".join(content) == answer_turn.content == whole.message.content
    assert "".join(reasoning) == answer_turn.reasoning == (reasoning_of(whole.message) or "")
    assert len(content) > 1  # the answer streams as it comes
    if answer_turn.reasoning:
        assert len(reasoning) > 1
    assert records[2].prompt_ids == records[3].prompt_ids  # streamed or not, the same prompt


def as_written(renderer, text: str) -> str:
    """A turn's text as the reply's content when its calls are not read: past its reasoning, stripped."""
    close = renderer.family.reasoning_close
    if close and close in text:
        text = text.split(close, 1)[1]
    return text.strip()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_that_was_not_offered_or_does_not_parse_stays_in_the_content_as_written(model_dirs, family):
    from tests.unit.chat_fixtures import MALFORMED

    engine, records = ScriptedEngine(), []
    completions, app = served_app(model_dirs[family], engine, records)
    renderer = completions.renderer
    (call_text, _), _ = scripted_turns(family)
    malformed, _ = MALFORMED[family]
    cases = [("none", call_text, "Paris"), ("auto", malformed, '"b"' if family == "harmony" else "")]
    with ThreadServer(app) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        for tool_choice, text, shown in cases:
            engine.replies = [lambda prompt, text=text: generated_ids(renderer, text, prompt, "tool")] * 2
            options = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "tool_choice": tool_choice}
            whole = client.chat.completions.create(**options).choices[0]
            pieces, _, calls, finish = stream_reply(client, options)
            assert whole.finish_reason == finish == "stop" and not whole.message.tool_calls and calls == []
            assert "".join(pieces) == whole.message.content and shown in whole.message.content
            if family != "harmony":  # harmony's call header is markup; its arguments stay
                assert whole.message.content == as_written(renderer, text)


def stream_reply(client, options):
    """(content pieces, reasoning pieces, tool calls, finish reason) of one streamed chat call."""
    chunks = list(client.chat.completions.create(**options, stream=True))
    content, reasoning, calls, finish = [], [], [], None
    for chunk in chunks:
        (choice,) = chunk.choices
        delta = choice.delta
        assert not (delta.tool_calls and choice.finish_reason is None)  # calls come whole, in the last chunk
        if delta.content:
            content.append(delta.content)
        if (delta.model_extra or {}).get("reasoning_content"):
            reasoning.append(delta.model_extra["reasoning_content"])
        calls += delta.tool_calls or []
        finish = choice.finish_reason or finish
    return content, reasoning, calls, finish


def gateway_calls(folder, engine, conversation, rewritten="keep"):
    """Run `conversation(client, family)` in a training gateway session over `engine` (chat.rewritten
    `rewritten`); the session's calls and the gateway's renderer and stitcher."""
    from agentrl.gateway.server import Gateway

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    gateway = Gateway(engine, load_tokenizer(folder), 4096, rewritten=rewritten)
    loop.call_soon_threadsafe(gateway.start, loop)
    deadline = time.monotonic() + 30
    while gateway.server is None or not gateway.server.started:
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    session = gateway.table.open({})
    session.sampling = SamplingParams(max_new_tokens=256)

    async def run():
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.key, max_retries=0)
        await conversation(client, gateway.completions.renderer.family)

    try:
        asyncio.run_coroutine_threadsafe(run(), loop).result(60)
    finally:
        gateway.server.should_exit = True
        time.sleep(0.2)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    return session.calls, gateway.completions.renderer, session.stitcher


async def tool_round_then_follow_up(client, family):
    """A tool call, its results, the answer, then the user's next question: the history sent back each time."""
    ask = lambda messages: client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)  # noqa: E731
    first = (await ask(QUESTION)).choices[0].message
    history = [*QUESTION, first.model_dump(exclude_none=True), *tool_results(family, first.tool_calls)]
    answer = (await ask(history)).choices[0].message
    history += [answer.model_dump(exclude_none=True), {"role": "user", "content": "Thanks. And 1 + 1?"}]
    await ask(history)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_gateway_session_stitches_the_models_own_tokens_where_the_familys_template_is_append_only(model_dirs, family):
    """The tool results follow the call turn's own generated ids, as the family's template writes them (every
    family's template is append-only there); after the user's follow-up, a template that rewrites the history
    (docs/chat-formats.md: Qwen3 and GLM drop earlier reasoning, Mistral moves the tools, harmony rewrites the
    answer's end) starts a new sample rendered from scratch with chat.rewritten=new_sample, the others go on in one
    sample."""
    from agentrl.serve.protocol import ChatMessage

    tokenizer = load_tokenizer(model_dirs[family])
    from agentrl.serve.render import ChatRenderer

    replies, _, _ = script(ChatRenderer(tokenizer), family)
    engine = ScriptedEngine([replies[0], replies[1], replies[1]])
    calls, renderer, stitcher = gateway_calls(model_dirs[family], engine, tool_round_then_follow_up, "new_sample")
    first, second, third = calls
    assert first.tool_calls > 0 and first.reply["tool_calls"]
    before = first.prompt_ids + first.output_ids
    assert second.prompt_ids[: len(before)] == before  # the call turn's own ids, stitched
    history = [renderer.plain_message(ChatMessage.model_validate(m)) for m in second.request.messages]
    placed, tools = renderer.tools_placed(history, TOOLS)
    at = len(placed) - len(history) + 2  # the question and the call turn (past a listing's system message)
    between = renderer.codec.continuation_ids(placed[:at], placed[at:], tools, ended_with=first.output_ids[-1])
    assert second.prompt_ids[len(before) :] == between
    assert "result 0" in renderer.codec.decode(between)

    rewritten = family in REWRITTEN_AFTER_USER
    assert renderer.codec.probe().append_only_after_user is not rewritten  # the probe agrees with the docs' table
    samples = samples_from_calls(calls)
    if rewritten:
        assert third.prompt_ids == renderer.prompt_ids(third.request.messages, TOOLS)  # rendered from scratch
        assert [sample.calls for sample in samples] == [2, 1] and stitcher.rewritten == 1
    else:
        assert third.prompt_ids[: len(second.prompt_ids + second.output_ids)] == second.prompt_ids + second.output_ids
        assert [sample.calls for sample in samples] == [3] and stitcher.rewritten == 0
    assert stitcher.stitched == (1 if rewritten else 2)


@pytest.mark.parametrize("family", sorted(REWRITTEN_AFTER_USER))
def test_chat_rewritten_keep_stitches_the_models_own_tokens_where_the_template_rewrites_the_history(model_dirs, family):
    """chat.rewritten=keep in the gateway, as in the env loop: after the user's follow-up, the prompt is the answer
    turn's sample (its reasoning as the model generated it, where the template drops it) and the template's ids for
    the new message; the session trains as one sample. The rendering from scratch differs (it is rewritten)."""
    from agentrl.serve.protocol import ChatMessage
    from agentrl.serve.render import ChatRenderer

    replies, _, answer_turn = script(ChatRenderer(load_tokenizer(model_dirs[family])), family)
    engine = ScriptedEngine([replies[0], replies[1], replies[1]])
    calls, renderer, stitcher = gateway_calls(model_dirs[family], engine, tool_round_then_follow_up, "keep")
    _, second, third = calls
    before = second.prompt_ids + second.output_ids
    assert third.prompt_ids[: len(before)] == before  # the answer turn's own ids, kept
    history = [renderer.plain_message(ChatMessage.model_validate(m)) for m in third.request.messages]
    placed, tools = renderer.tools_placed(history, TOOLS)
    ended = second.output_ids[-1]
    between = renderer.codec.continuation_ids(placed[:-1], placed[-1:], tools, ended_with=ended, keep_rewritten=True)
    assert third.prompt_ids[len(before) :] == between and "1 + 1" in renderer.codec.decode(between)
    with pytest.raises(NotAppendOnly):  # the template does rewrite it: new_sample would start a sample here
        renderer.codec.continuation_ids(placed[:-1], placed[-1:], tools, ended_with=ended)
    assert third.prompt_ids != renderer.prompt_ids(third.request.messages, TOOLS)
    if family == "qwen3":  # the thinking fixture: the answer's reasoning stays in the prompt as generated
        assert answer_turn.reasoning and answer_turn.reasoning in renderer.codec.decode(third.prompt_ids)
        assert answer_turn.reasoning not in renderer.codec.decode(renderer.prompt_ids(third.request.messages, TOOLS))
    (sample,) = samples_from_calls(calls)
    assert sample.calls == 3 and (stitcher.stitched, stitcher.rewritten) == (2, 1)


def test_the_gateway_refuses_an_unknown_chat_rewritten_choice(model_dirs):
    from agentrl.gateway.server import Gateway

    with pytest.raises(ValueError, match=r"chat\.rewritten must be one of keep, new_sample, got 'drop'"):
        Gateway(ScriptedEngine(), load_tokenizer(model_dirs["qwen3"]), 4096, rewritten="drop")


def boost_stop(model, prompt: list[int], stop: int, step: int = 2) -> None:
    """Make greedy decoding of `prompt` end with `stop` at `step` (or sooner): the output head's row of `stop`
    becomes the row of the token greedy picks there, nudged towards that step's hidden state."""
    import torch

    head = model.get_output_embeddings()
    seen = []
    hook = head.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0][0, -1].clone()))
    try:
        with torch.no_grad():
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=step + 1, do_sample=False)
    finally:
        hook.remove()
    chosen, hidden = int(out[0, len(prompt) + step]), seen[step]
    with torch.no_grad():
        head.weight[stop] = head.weight[chosen] + 0.5 * hidden / hidden.dot(hidden)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_tiny_model_serves_a_real_generation_ended_by_the_familys_stop_token(model_dirs, family):
    """The real engine (the batch scheduler for gpt-oss, which the continuous one refuses) behind serve: the reply
    ends at the family's own stop token (Llama's <|eom_id|>, harmony's <|call|>, GLM's <|observation|>: the one
    that is not the tokenizer's eos, where the family has one) and reads as the family's parser reads the ids,
    whole and streamed."""
    from agentrl.config.schema import TorchEngineConfig
    from agentrl.engine import build_torch_engine
    from agentrl.models.loading import load_causal_lm
    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend
    from agentrl.serve.reply import ReplyReader

    tokenizer = load_tokenizer(model_dirs[family])
    model = load_causal_lm(str(model_dirs[family])).eval()
    records = []
    scheduler = "batch" if family == "harmony" else "continuous"
    engine = build_torch_engine(
        model, TorchEngineConfig(scheduler=scheduler), pad_token_id=tokenizer.pad_token_id, seed=0
    )
    completions = Completions(LocalBackend(engine, tokenizer), tokenizer, MODEL, 2048, on_call=records.append)
    renderer = completions.renderer
    stop = next((i for i in renderer.stop_ids if i != tokenizer.eos_token_id), tokenizer.eos_token_id)
    prompt = expected_prompt(renderer, QUESTION)
    engine.shutdown()
    boost_stop(model, prompt, stop)
    engine = build_torch_engine(
        model, TorchEngineConfig(scheduler=scheduler), pad_token_id=tokenizer.pad_token_id, seed=0
    )
    completions.backend = LocalBackend(engine, tokenizer)
    options = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "temperature": 0, "max_tokens": 24}
    try:
        with ThreadServer(build_app(completions)) as server:
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
            choice = client.chat.completions.create(**options).choices[0]
            pieces, reasoning, calls, finish = stream_reply(client, options)
    finally:
        engine.shutdown()
    record = records[0]
    assert record.prompt_ids == prompt and record.output_ids[-1] == stop and record.finish_reason == "stop"
    assert records[1].output_ids == record.output_ids  # greedy: the stream generated the same
    reply = ReplyReader(renderer, prompt, TOOLS, True).read(record.output_ids)
    assert choice.message.content == reply.message["content"] and finish == choice.finish_reason
    assert choice.finish_reason == ("tool_calls" if reply.calls else "stop")
    assert reasoning_of(choice.message) == reply.message.get("reasoning_content")
    assert "".join(pieces) == (choice.message.content or "") and "".join(reasoning) == (
        reasoning_of(choice.message) or ""
    )
    assert tokenizer.convert_ids_to_tokens(stop) not in (choice.message.content or "")
    assert len(calls) == len(choice.message.tool_calls or [])


def test_serve_detects_each_family_from_its_model_folder_and_the_option_names_one(model_dirs):
    from agentrl.commands.serve import chat_family

    assert {family: chat_family(str(model_dirs[family]), None) for family in FAMILIES} == {f: f for f in FAMILIES}
    assert chat_family(str(model_dirs["qwen3"]), "hermes") == "hermes"  # Qwen3's tokens read as Hermes


def plain_tokenizer_folder(folder, template: str | None):
    """A tokenizer no family recognises (no chat markup among its tokens), with `template`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"], show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", chat_template=template).save_pretrained(
        folder
    )
    return folder


def test_a_bad_chat_format_or_template_is_refused_before_serving_in_one_line_naming_the_fix(model_dirs, tmp_path):
    import shutil

    from agentrl.commands.serve import chat_family
    from agentrl.errors import UserError

    def refusal(path, name=None) -> str:
        with pytest.raises(UserError) as refused:
            chat_family(str(path), name)
        message = str(refused.value)
        assert "\n" not in message
        return message

    unknown = refusal(model_dirs["qwen3"], "qwen4")
    assert "did you mean 'qwen3'" in unknown and all(family in unknown for family in FAMILIES)
    assert "agentrl.chat_formats" in unknown and "--chat-format" in unknown
    assert "none of the llama3 end-of-turn tokens" in refusal(model_dirs["hermes"], "llama3")

    bare = plain_tokenizer_folder(tmp_path / "bare", None)
    assert "no chat template" in refusal(bare) and "chat_template" in refusal(bare)
    unmarked = plain_tokenizer_folder(tmp_path / "unmarked", "{% for m in messages %}{{ m.content }}{% endfor %}")
    message = refusal(unmarked)
    assert "cannot tell the chat format" in message and "register a family" in message and "--chat-format" in message
    broken = tmp_path / "broken"
    shutil.copytree(model_dirs["llama3"], broken)
    config = broken / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["chat_template"] = "{{ raise_exception('no user messages here') }}"
    config.write_text(json.dumps(settings))
    (broken / "chat_template.jinja").unlink(missing_ok=True)
    message = refusal(broken)
    assert "no user messages here" in message and "fix the model folder's chat template" in message


def test_the_serve_command_takes_chat_format_and_refuses_an_unknown_one(model_dirs, tmp_path):
    """`agentrl serve` as deployed: --chat-format reaches the replies (Qwen3's folder served as Hermes has no
    reasoning_content), and an unknown name stops it before it loads the model, in one line, exit status 2."""
    import os
    import subprocess
    import sys

    import httpx

    from tests.unit.serve_server import free_port

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    base = [sys.executable, "-m", "agentrl.cli", "serve", str(model_dirs["qwen3"]), "--model-name", MODEL]
    refused = subprocess.run([*base, "--chat-format", "qwen4"], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    (line,) = [line for line in refused.stderr.splitlines() if "qwen4" in line]
    assert "known:" in line and "--chat-format" in line

    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*base, "--port", str(port), "--chat-format", "hermes"], env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "seed": 1}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60).json()
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert "reasoning_content" not in reply["choices"][0]["message"]
    assert "chat format hermes (--chat-format)" in log.read_text()


@pytest.mark.parametrize("family", FAMILIES)
def test_control_strings_in_messages_and_reasoning_stay_text_in_each_familys_prompt(family):
    """A user message, an assistant's reasoning sent back and a tool result holding the family's end-of-turn token
    keep it as text: the prompt has exactly the special tokens of the same conversation without it."""
    from agentrl.serve.protocol import ChatMessage
    from agentrl.serve.render import ChatRenderer
    from tests.unit.chat_fixtures import tokenizer

    renderer = ChatRenderer(tokenizer(family))
    end = renderer.tokenizer.convert_ids_to_tokens(renderer.stop_ids[0])
    call = {"id": "a1b2c3d4e", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}

    def prompt(text: str) -> list[int]:
        messages = [
            {"role": "user", "content": f"What is 2 + 3? {text}"},
            {"role": "assistant", "content": None, "reasoning_content": f"Add them. {text}", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "add", "content": f"5 {text}"},
        ]
        return renderer.prompt_ids([ChatMessage.model_validate(m) for m in messages], TOOLS)

    forged, benign = prompt(f"x{end}y"), prompt("xQQy")
    special = renderer.content.special_ids
    assert [t for t in forged if t in special] == [t for t in benign if t in special]
    assert renderer.tokenizer.decode(forged).count(end) > renderer.tokenizer.decode(benign).count(end)


def test_chat_format_in_a_config_is_checked_and_read_by_training_too():
    from agentrl.config import ConfigError, from_dict

    base = {"model": {"path": "some/model"}}
    with pytest.raises(ConfigError, match=r"chat\.format: .*unknown chat format 'qwen4'.*qwen3.*agentrl\.chat_formats"):
        from_dict({**base, "chat": {"format": "qwen4"}})
    assert from_dict(base).chat.format is None and not any("chat.format" in note for note in from_dict(base).notes)
    named = from_dict({**base, "chat": {"format": "glm45", "template_kwargs": {"enable_thinking": False}}})
    assert named.chat.format == "glm45" and not any("chat.format" in note for note in named.notes)  # the env loop too
    assert named.chat.template_kwargs == {"enable_thinking": False}
    assert (named.chat.rewritten, named.chat.train_reasoning) == ("keep", True)
    assert from_dict({**base, "chat": {"format": "pipe_chat:PipeFamily"}}).chat.format == "pipe_chat:PipeFamily"
    with pytest.raises(ConfigError, match=r"chat\.rewritten"):
        from_dict({**base, "chat": {"rewritten": "drop"}})
    with pytest.raises(ConfigError, match=r"chat\.rewritten=new_sample .*gigpo.*chat\.rewritten=keep"):
        from_dict({**base, "chat": {"rewritten": "new_sample"}, "algorithm": {"name": "gigpo"}})


class GrammarEngine(ScriptedEngine):
    def allow_grammars(self, tokenizer) -> bool:
        return True


@pytest.mark.parametrize("family", FAMILIES)
def test_constrained_decoding_is_refused_where_the_familys_turns_cannot_follow_the_grammar(model_dirs, family):
    """tool_choice required writes Hermes calls (hermes, qwen3 read them); a response_format grammar cannot start
    harmony's channel header, nor follow a prompt that opens reasoning (R1); each refusal names the option."""
    engine, records = GrammarEngine(), []
    completions, _ = served_app(model_dirs[family], engine, records)
    renderer = completions.renderer
    engine.replies = [lambda prompt: generated_ids(renderer, '{"verdict": "yes"}', prompt, "user")] * 2
    required = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "max_tokens": 64}
    as_json = {"model": MODEL, "messages": QUESTION, "response_format": {"type": "json_object"}, "max_tokens": 64}
    for payload, allowed in (
        (required, family in ("hermes", "qwen3")),
        (as_json, family not in ("harmony", "deepseek_r1")),
    ):
        option = "tool_choice" if "tool_choice" in payload else "response_format"
        if allowed:
            assert asyncio.run(completions.chat(payload))["choices"]
            assert engine.samplings[-1].grammar is not None
        else:
            with pytest.raises(APIError) as refused:
                asyncio.run(completions.chat(payload))
            assert refused.value.param == option and family in refused.value.message


def test_the_gateway_takes_the_chat_format_by_name_and_refuses_an_unknown_one(model_dirs):
    from agentrl.errors import UserError
    from agentrl.gateway.server import Gateway

    tokenizer = load_tokenizer(model_dirs["qwen3"])
    detected = Gateway(ScriptedEngine(), tokenizer, 2048)
    named = Gateway(ScriptedEngine(), tokenizer, 2048, chat_format="hermes")
    for gateway in (detected, named):
        gateway.socket.close()
    assert detected.completions.renderer.family.name == "qwen3"
    assert named.completions.renderer.family.name == "hermes"
    with pytest.raises(UserError) as refused:
        Gateway(ScriptedEngine(), tokenizer, 2048, chat_format="qwen4")
    assert str(refused.value).startswith("chat.format: unknown chat format 'qwen4'") and "\n" not in str(refused.value)
