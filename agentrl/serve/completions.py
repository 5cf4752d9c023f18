"""One OpenAI call: check it, render the prompt ids, generate, build the response (or its SSE stream), and hand
the call's exact tokens to an `on_call` hook.

`Completions.chat(payload, on_call)` and `Completions.complete(payload, on_call)` take the decoded JSON body and
return the response dict, or, for `stream: true`, an async iterator of SSE lines. For every choice that finishes,
`on_call(CallRecord)` (sync or async) runs before the client sees that choice's end: the training gateway keeps
the prompt ids the server rendered, the generated ids, their logprobs and the weight version from it.

Long prompts cost little before they are refused with the context-length error: one with more characters than any
tokens of the context could spell is refused untokenized; of a longer one than SAMPLE_CHARS_PER_TOKEN characters per
context token, only that many leading characters are tokenized to see whether they already overflow it. Prompts
of OFF_LOOP_CHARS or more are tokenized in a thread, off the event loop. A call asks for at most MAX_CHOICES
completions (n x prompts).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from agentrl.engine.base import GenerateOutput, SamplingParams
from agentrl.serve.constraints import grammar_in_reasoning, output_grammar
from agentrl.serve.generation import Generation
from agentrl.serve.protocol import MAX_CHOICES, APIError, ChatCompletionRequest, CompletionRequest, parse, usage
from agentrl.serve.render import ChatRenderer, cut_at_stop, streamable_prefix
from agentrl.serve.reply import Reply, ReplyReader


@dataclass(frozen=True)
class CallRecord:
    """One generated choice, exactly as the engine saw and made it."""

    endpoint: str  # "chat.completions" or "completions"
    request_id: str
    index: int  # the choice's index in the response
    prompt_ids: list[int]
    output_ids: list[int]  # every generated token, the end-of-turn token included
    logprobs: list[float]  # one per output id, of softmax(logits / temperature)
    weight_version: int
    finish_reason: str  # the engine's: stop (eos or a stop string), length or abort
    request: ChatCompletionRequest | CompletionRequest
    shown_tools: list[dict] | None = None  # the tools the prompt listed (None: none offered, or list_tools off)
    reply: dict | None = None  # chat: the assistant message the client got (content, reasoning_content, tool_calls)
    cut: bool = False  # a stop string cut the reply: the client saw less than the model wrote


OnCall = Callable[[CallRecord], Awaitable[None] | None]
# Prompts of this many characters or more are rendered and tokenized in a thread: the event loop (other calls,
# /health, the engine's results) goes on meanwhile. Below it the thread hop would cost more than the tokenizing.
OFF_LOOP_CHARS = 16_384
# Unicode normalization (NFC) can fold up to 3 characters into 1 before tokenizing: the character bound's margin.
NORMALIZED_CHARS_PER_CHAR = 3
# Text averages about 4 characters a token: a prompt past twice the context usually shows it in this many leading
# characters per context token (a text of longer tokens is tokenized whole, and then is short in tokens).
SAMPLE_CHARS_PER_TOKEN = 8
# An `on_call` hook may also shape the call (the training gateway's sessions do): `prompt_ids(messages, tools)`
# renders the chat prompt in place of the template alone, and `sampling_for(SamplingParams)` replaces the
# request's sampling.


@dataclass
class _Run:
    """One choice to generate: its index, prompt and sampling."""

    index: int
    generation: Generation
    prompt_text: str = ""
    reply: Reply | None = None  # chat: the choice's reply, once read


class Completions:
    """The OpenAI endpoints over a backend (`generation.LocalBackend` or `ranks.RankSpread`). `chat_format`: the
    model's chat format family (None: detected from the tokenizer; agentrl/chat)."""

    def __init__(
        self,
        backend,
        tokenizer,
        model_name: str,
        max_model_len: int,
        on_call: OnCall | None = None,
        list_tools: bool = True,
        chat_format: str | None = None,
    ):
        self.backend = backend
        self.renderer = ChatRenderer(tokenizer, chat_format)
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = int(max_model_len)
        self.on_call = on_call
        self.list_tools = list_tools  # false: a request's tools are not shown to the model, only parsed for
        self.created = int(time.time())
        # No token covers more characters than the vocabulary's longest token string has (byte-level BPE: one per
        # byte), so a prompt of more characters than this could fit in no context.
        longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
        self.max_prompt_chars = self.max_model_len * max(longest, 1) * NORMALIZED_CHARS_PER_CHAR

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def card(self, model_id: str) -> dict:
        """GET /models/{model_id}: the card of the model served, 404 for any other."""
        if model_id != self.model_name:
            raise APIError(f"The model `{model_id}` does not exist", status=404, param="model", code="model_not_found")
        return self.model_card()

    def model_card(self) -> dict:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "agentrl",
            "max_model_len": self.max_model_len,
        }

    # ---- chat ------------------------------------------------------------------------------------------

    async def chat(self, payload: object, on_call: OnCall | None = None) -> dict | AsyncIterator[str]:
        request = parse(ChatCompletionRequest, payload)
        self._check(request)
        with_tools = request.tools_offered()
        grammar = output_grammar(request, self.backend, self.renderer.family)  # tool_choice, response_format
        hook = on_call or self.on_call
        render = getattr(hook, "prompt_ids", None) or self.renderer.prompt_ids
        shown_tools = request.tools if with_tools and self.list_tools else None
        texts = [(m.role, m.text()) for m in request.messages]
        # Templates may drop earlier assistant turns' text (reasoning), never the other roles'.
        await self._refuse_if_too_long([text for role, text in texts if role != "assistant"], "messages")
        prompt_ids = await _tokenized(sum(len(text) for _, text in texts), render, request.messages, shown_tools)
        if grammar is not None and self.renderer.codec.opens_reasoning(prompt_ids):
            raise grammar_in_reasoning(request, self.renderer.family.name)
        runs = self._runs(request, [(prompt_ids, "")], "messages", getattr(hook, "sampling_for", None), grammar)
        call = _Call("chat.completions", request, self, hook, shown_tools)
        if request.stream:
            return call.stream(runs, with_tools)
        outputs = await call.generate_all(runs)
        choices = [call.chat_choice(run, output, with_tools) for run, output in zip(runs, outputs, strict=True)]
        await call.record_all(runs, outputs)
        return call.response("chat.completion", choices, runs, outputs)

    # ---- completions -----------------------------------------------------------------------------------

    async def complete(self, payload: object, on_call: OnCall | None = None) -> dict | AsyncIterator[str]:
        request = parse(CompletionRequest, payload)
        self._check(request)
        if request.echo and request.logprobs is not None:
            raise APIError("echo with logprobs is not supported (prompt logprobs are not computed)", param="echo")
        prompts = await self._prompts(request)
        hook = on_call or self.on_call
        runs = self._runs(request, prompts, "prompt", getattr(hook, "sampling_for", None))
        call = _Call("completions", request, self, hook)
        if request.stream:
            return call.stream(runs, False)
        outputs = await call.generate_all(runs)
        choices = [call.text_choice(run, output) for run, output in zip(runs, outputs, strict=True)]
        await call.record_all(runs, outputs)
        return call.response("text_completion", choices, runs, outputs)

    async def _prompts(self, request: CompletionRequest) -> list[tuple[list[int], str]]:
        prompt = request.prompt
        if isinstance(prompt, str) or (prompt and all(isinstance(token, int) for token in prompt)):
            prompt = [prompt]
        if not prompt:
            raise APIError("prompt is empty; send a string, a list of token ids, or a list of either", param="prompt")
        if len(prompt) * request.n > MAX_CHOICES:
            raise APIError(
                f"this call asks for {len(prompt)} prompts x n={request.n} = {len(prompt) * request.n} completions; "
                f"one call makes at most {MAX_CHOICES}: split the prompts over several calls",
                param="prompt",
                code="too_many_choices",
            )
        vocab = len(self.tokenizer)
        prompts = []
        for item in prompt:
            if isinstance(item, str):
                await self._refuse_if_too_long([item], "prompt")
                ids = await _tokenized(len(item), self._encode, item)
                prompts.append((ids, item))
                continue
            # One too long for the context is refused by _runs, with no scan of its ids here.
            bad = [token for token in item if not 0 <= token < vocab] if len(item) < self.max_model_len else []
            if bad:
                raise APIError(f"prompt has token ids outside the vocabulary [0, {vocab}): {bad[:5]}", param="prompt")
            prompts.append((list(item), self.renderer.text(item)))
        if any(not ids for ids, _ in prompts):
            raise APIError("a prompt renders to no tokens; send some text", param="prompt")
        return prompts

    def _encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return self.tokenizer(text, add_special_tokens=special_tokens)["input_ids"]

    # ---- shared ----------------------------------------------------------------------------------------

    async def _refuse_if_too_long(self, texts: list[str], what: str) -> None:
        """The context-length error for a prompt holding `texts` that cannot fit: from its characters alone, or
        from the tokens of its leading characters (see the module's docstring)."""
        chars = sum(map(len, texts))
        if chars > self.max_prompt_chars:
            raise self._too_long(
                what,
                f"the {what} hold {chars} characters, more than {self.max_model_len} tokens of this tokenizer can "
                f"spell ({self.max_prompt_chars} characters)",
            )
        sample_chars = self.max_model_len * SAMPLE_CHARS_PER_TOKEN
        if chars <= sample_chars:
            return
        sample = "".join(texts)[:sample_chars]
        # A token may merge across each text's ends in the whole prompt: one fewer each at most.
        tokens = len(await _tokenized(sample_chars, self._encode, sample, False)) - len(texts)
        if tokens >= self.max_model_len:
            raise self._too_long(
                what, f"the first {sample_chars} of the {chars} characters of the {what} are {tokens} tokens already"
            )

    def _too_long(self, what: str, found: str) -> APIError:
        return APIError(
            f"This model's maximum context length is {self.max_model_len} tokens. However, {found}. "
            f"Shorten the {what}.",
            param=what,
            code="context_length_exceeded",
        )

    def _check(self, request) -> None:
        if request.model != self.model_name:
            raise APIError(
                f"The model `{request.model}` does not exist; this server serves `{self.model_name}` (GET /v1/models)",
                status=404,
                param="model",
                code="model_not_found",
            )
        unsupported = request.unsupported()
        if unsupported:
            raise APIError(
                f"{', '.join(unsupported)} is not supported by agentrl serve; leave it unset",
                param=unsupported[0],
                code="unsupported_parameter",
            )

    def _runs(
        self, request, prompts: list[tuple[list[int], str]], what: str, sampling_for=None, grammar=None
    ) -> list[_Run]:
        limit = request.token_limit()
        runs = []
        for p, (ids, text) in enumerate(prompts):
            new_tokens = limit if limit is not None else self.max_model_len - len(ids)
            if len(ids) >= self.max_model_len or len(ids) + new_tokens > self.max_model_len:
                raise APIError(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{len(ids) + new_tokens} tokens ({len(ids)} in the {what}, {new_tokens} for the completion). "
                    f"Shorten the {what} or lower max_tokens.",
                    param=what,
                    code="context_length_exceeded",
                )
            for j in range(request.n):
                sampling = SamplingParams(
                    max_new_tokens=new_tokens,
                    temperature=1.0 if request.temperature is None else request.temperature,
                    top_p=1.0 if request.top_p is None else request.top_p,
                    stop_token_ids=() if request.ignore_eos else self.renderer.stop_ids,
                    seed=None if request.seed is None else request.seed + j,
                    grammar=grammar,
                )
                if sampling_for is not None:
                    sampling = sampling_for(sampling)
                runs.append(_Run(p * request.n + j, Generation(ids, sampling, request.stop_strings()), text))
        return runs


class _Call:
    """One request's generation and response building."""

    def __init__(
        self,
        endpoint: str,
        request,
        completions: Completions,
        on_call: OnCall | None,
        shown_tools: list[dict] | None = None,
    ):
        self.endpoint = endpoint
        self.request = request
        self.server = completions
        self.on_call = on_call
        self.shown_tools = shown_tools
        self.id = f"{'chatcmpl' if endpoint == 'chat.completions' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    async def generate_all(self, runs: list[_Run]) -> list[GenerateOutput]:
        return await asyncio.gather(*(self.server.backend.generate(run.generation) for run in runs))

    async def record(self, run: _Run, output: GenerateOutput) -> None:
        if self.on_call is None:
            return
        record = CallRecord(
            self.endpoint,
            self.id,
            run.index,
            list(run.generation.prompt_ids),
            output.output_ids.tolist(),
            output.logprobs.tolist(),
            int(output.weight_version),
            output.finish_reason,
            self.request,
            self.shown_tools,
            run.reply.message if run.reply is not None else None,
            run.reply.cut if run.reply is not None else False,
        )
        result = self.on_call(record)
        if inspect.isawaitable(result):
            await result

    async def record_all(self, runs: list[_Run], outputs: list[GenerateOutput]) -> None:
        for run, output in zip(runs, outputs, strict=True):
            await self.record(run, output)

    # ---- one choice ------------------------------------------------------------------------------------

    def _text(self, run: _Run, output: GenerateOutput) -> tuple[str, bool, list[int]]:
        """The reply's text, whether a stop string cut it, and the ids it shows (no end-of-turn token)."""
        ids = output.output_ids.tolist()
        if ids and output.finish_reason == "stop" and ids[-1] in run.generation.sampling.stop_token_ids:
            ids = ids[:-1]
        text, cut = cut_at_stop(self.server.renderer.text(ids), run.generation.stop)
        if cut:
            ids = ids[: _tokens_covering(self.server.renderer, ids, len(text))]
        return text, cut, ids

    def _finish_reason(self, output: GenerateOutput, cut: bool) -> str:
        return "stop" if cut else output.finish_reason

    def reader(self, run: _Run, with_tools: bool) -> ReplyReader:
        """The choice's reply reader: at most one call with parallel_tool_calls false (a grammar holds required and
        named choices to one; under auto the first call is the reply's). The request's tools type the arguments
        of formats that write them as text (GLM), whether the prompt listed them or not."""
        return ReplyReader(
            self.server.renderer,
            run.generation.prompt_ids,
            self.request.tools,
            with_tools,
            run.generation.stop,
            self.request.parallel_tool_calls,
        )

    def _reply_finish(self, reply: Reply, output: GenerateOutput) -> str:
        return "tool_calls" if reply.calls else self._finish_reason(output, reply.cut)

    def chat_choice(self, run: _Run, output: GenerateOutput, with_tools: bool) -> dict:
        run.reply = self.reader(run, with_tools).read(output.output_ids)
        return {
            "index": run.index,
            "message": run.reply.message,
            "logprobs": self._chat_logprobs(self._text(run, output)[2], output) if self.request.logprobs else None,
            "finish_reason": self._reply_finish(run.reply, output),
        }

    def text_choice(self, run: _Run, output: GenerateOutput) -> dict:
        text, cut, ids = self._text(run, output)
        return {
            "index": run.index,
            "text": run.prompt_text + text if self.request.echo else text,
            "logprobs": self._text_logprobs(ids, output) if self.request.logprobs is not None else None,
            "finish_reason": self._finish_reason(output, cut),
        }

    def _chat_logprobs(self, ids: list[int], output: GenerateOutput) -> dict:
        top = bool(self.request.top_logprobs)
        entries = []
        for token_id, logprob in zip(ids, output.logprobs.tolist(), strict=False):
            token = self.server.renderer.text([token_id])
            entry = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
            entries.append({**entry, "top_logprobs": [entry] if top else []})
        return {"content": entries}

    def _text_logprobs(self, ids: list[int], output: GenerateOutput) -> dict:
        tokens = [self.server.renderer.text([token_id]) for token_id in ids]
        logprobs = output.logprobs.tolist()[: len(ids)]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        top = [{token: lp} for token, lp in zip(tokens, logprobs, strict=True)] if self.request.logprobs else None
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets}

    def response(self, kind: str, choices: list[dict], runs: list[_Run], outputs: list[GenerateOutput]) -> dict:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.server.model_name,
            "choices": choices,
            "usage": self._usage(runs, outputs),
            "system_fingerprint": None,
        }

    def _usage(self, runs: list[_Run], outputs: list[GenerateOutput]) -> dict:
        prompts = {id(run.generation.prompt_ids): len(run.generation.prompt_ids) for run in runs}
        return usage(sum(prompts.values()), sum(len(output.output_ids) for output in outputs))

    # ---- streaming ---------------------------------------------------------------------------------------

    async def stream(self, runs: list[_Run], with_tools: bool) -> AsyncIterator[str]:
        """SSE lines: each choice's text as it is generated (chat: its content and reasoning_content as the family's
        parser reads them, held back where a stop string, a marker or a tool call may be starting; the tool calls
        whole in the choice's last chunk), then its finish, the usage if asked, and `data: [DONE]`."""
        events: asyncio.Queue = asyncio.Queue()
        chat = self.endpoint == "chat.completions"
        tasks = [asyncio.ensure_future(self._stream_one(run, events)) for run in runs]
        sent = {run.index: "" for run in runs}
        ids: dict[int, list[int]] = {run.index: [] for run in runs}
        readers = {run.index: self.reader(run, with_tools) for run in runs} if chat else {}
        outputs: dict[int, GenerateOutput] = {}
        try:
            if chat:
                for run in runs:
                    yield self._chunk([{"index": run.index, "delta": {"role": "assistant", "content": ""}}])
            while len(outputs) < len(runs):
                run, kind, value = await events.get()
                if kind == "error":
                    yield _sse({"error": _error_body(value)})
                    break
                if kind == "tokens":
                    tokens, logprobs = value
                    visible = [
                        (t, lp)
                        for t, lp in zip(tokens, logprobs, strict=True)
                        if t not in run.generation.sampling.stop_token_ids
                    ]
                    if chat:
                        fields = readers[run.index].feed(tokens)
                    else:
                        ids[run.index] += tokens
                        text = streamable_prefix(self.server.renderer.text(ids[run.index]), run.generation.stop, False)
                        fields = {"text": text[len(sent[run.index]) :] if text.startswith(sent[run.index]) else ""}
                        sent[run.index] += fields["text"]
                    if any(fields.values()) or (self.request.logprobs and visible):
                        yield self._chunk([self._delta(run, fields, visible, chat)])
                    continue
                outputs[run.index] = value
                if chat:
                    run.reply = readers[run.index].read(value.output_ids)
                await self.record(run, value)
                if chat:
                    yield self._chunk([self._last_chat_delta(run, value, readers[run.index])])
                else:
                    yield self._chunk([self._last_text_delta(run, value, sent[run.index])])
            else:
                if self.request.stream_options is not None and self.request.stream_options.include_usage:
                    ordered = [outputs[run.index] for run in runs]
                    yield self._chunk([], usage=self._usage(runs, ordered))
            yield "data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()

    async def _stream_one(self, run: _Run, events: asyncio.Queue) -> None:
        try:
            output = await self.server.backend.generate(
                run.generation, lambda tokens, logprobs: events.put_nowait((run, "tokens", (tokens, logprobs)))
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:
            events.put_nowait((run, "error", error))
            return
        events.put_nowait((run, "done", output))

    def _delta(self, run: _Run, fields: dict, visible: list[tuple[int, float]], chat: bool) -> dict:
        """A chunk's choice: chat `fields` (content, reasoning_content) or a completion's `text`."""
        entries = None
        if self.request.logprobs:
            tokens = [(self.server.renderer.text([t]), lp) for t, lp in visible]
            if chat:
                entries = {"content": [self._chat_entry(token, lp) for token, lp in tokens]}
            else:
                entries = {
                    "tokens": [token for token, _ in tokens],
                    "token_logprobs": [lp for _, lp in tokens],
                    "top_logprobs": [{token: lp} for token, lp in tokens],
                    "text_offset": [],
                }
        if chat:
            return {"index": run.index, "delta": fields, "logprobs": entries, "finish_reason": None}
        return {"index": run.index, "text": fields["text"], "logprobs": entries, "finish_reason": None}

    def _chat_entry(self, token: str, logprob: float) -> dict:
        entry = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
        return {**entry, "top_logprobs": [entry] if self.request.top_logprobs else []}

    def _last_text_delta(self, run: _Run, output: GenerateOutput, sent: str) -> dict:
        text, cut, _ = self._text(run, output)
        rest = text[len(sent) :] if text.startswith(sent) else ""
        return {"index": run.index, "text": rest, "logprobs": None, "finish_reason": self._finish_reason(output, cut)}

    def _last_chat_delta(self, run: _Run, output: GenerateOutput, reader: ReplyReader) -> dict:
        delta = reader.last_delta(run.reply)
        return {
            "index": run.index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": self._reply_finish(run.reply, output),
        }

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> str:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.endpoint == "chat.completions" else "text_completion",
            "created": self.created,
            "model": self.server.model_name,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return _sse(chunk)


async def _tokenized(chars: int, tokenize: Callable, *args):
    """`tokenize(*args)`, in a thread where the text is long (`chars`) enough to hold the event loop up."""
    if chars < OFF_LOOP_CHARS:
        return tokenize(*args)
    return await asyncio.to_thread(tokenize, *args)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _error_body(error: BaseException) -> dict:
    if isinstance(error, APIError):
        return error.body()["error"]
    return {"message": f"generation failed: {error!r}", "type": "server_error", "param": None, "code": None}


def _tokens_covering(renderer: ChatRenderer, ids: list[int], chars: int) -> int:
    """The fewest leading ids whose text reaches `chars` characters (the ids a cut text still shows)."""
    for count in range(len(ids) + 1):
        if len(renderer.text(ids[:count])) >= chars:
            return count
    return len(ids)
