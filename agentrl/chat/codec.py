"""A model's chat format bound to its tokenizer: messages -> prompt ids through the model's own chat template,
generated ids -> a parsed turn (whole or streamed), and the template's ids for the messages that follow a turn
whose generated ids are kept as they are.

    codec = load_codec("path/to/model")                 # the family detected, or format="qwen3"
    ids = codec.prompt_ids(messages, tools)
    turn = codec.parse_ids(output_ids, prompt_ids=ids)  # content, reasoning, calls, errors
    history = [*messages, codec.assistant_message(turn)]
    ids += output_ids + codec.continuation_ids(history, [tool_result_message], tools, ended_with=output_ids[-1])
"""

from __future__ import annotations

from pathlib import Path

from agentrl.chat.errors import ChatTemplateError, NotAppendOnly
from agentrl.chat.family import ChatFamily, ModelSignals
from agentrl.chat.scan import Mode, Scanner
from agentrl.chat.turn import ParsedTurn, TurnDelta

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21: TokenStream decodes a sliding window instead
    DecodeStream = None

PLACEHOLDER = "\u2591agentrl\u2591"
NOTHING = TurnDelta()  # the delta of a piece that goes into a capture mode's body (read only, as every delta)


class ChatCodec:
    """`family`: a ChatFamily instance; `template_kwargs`: extra variables for the chat template (Qwen3's
    `enable_thinking`, harmony's `reasoning_effort`)."""

    def __init__(self, tokenizer, family: ChatFamily, template_kwargs: dict | None = None):
        if not tokenizer.chat_template:
            raise ChatTemplateError(
                "the tokenizer has no chat template; use an instruct/chat model folder (its tokenizer_config.json or "
                "chat_template.jinja) or set tokenizer.chat_template"
            )
        self.tokenizer, self.family, self.template_kwargs = tokenizer, family, dict(template_kwargs or {})
        vocab = tokenizer.get_vocab()
        stops = [vocab[token] for token in family.end_of_turn if token in vocab]
        if not stops:
            raise ChatTemplateError(
                f"the tokenizer has none of the {family.name} end-of-turn tokens {', '.join(family.end_of_turn)}; "
                "this model is not in that format: set chat.format to its family (or leave it unset to detect)"
            )
        eos = tokenizer.eos_token_id
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys([*stops, *([eos] if eos is not None else [])]))
        self._stop_text = {token_id: tokenizer.convert_ids_to_tokens(token_id) for token_id in self.stop_ids}
        # the end tokens a turn's text drops before parsing (a family may need some as markup)
        self._dropped = frozenset(i for i, text in self._stop_text.items() if text not in family.markup_ends)
        self._probe = None
        self._pieces: list[str | None] | bool | None = None
        self._lanes: dict[int, tuple[Mode, list]] = {}  # id(mode) -> (the mode, its lane table)

    # ---- rendering ------------------------------------------------------------------------------

    def render(self, messages: list[dict], tools: list[dict] | None = None, generation_prompt: bool = True) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                tokenize=False,
                add_generation_prompt=generation_prompt,
                **self.template_kwargs,
            )
        except Exception as error:  # the template's own checks raise jinja errors, bad values TypeErrors
            raise ChatTemplateError(
                f"the {self.family.name} chat template refused these messages: {type(error).__name__}: {error}"
            ) from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The template's ids for `messages` and the generation prompt."""
        return self.encode(self.render(messages, tools, True))

    def continuation_ids(
        self,
        history: list[dict],
        new: list[dict],
        tools: list[dict] | None = None,
        ended_with: int | None = None,
        keep_rewritten: bool = False,
    ) -> list[int]:
        """The template's ids after the last assistant turn of `history` (its generated ids are kept as they are)
        for the `new` messages (tool results, a user message) and the next generation prompt.

        `ended_with`: the stop id that ended the generated turn, if one did (a family whose stop token is the next
        message's role, GLM's <|observation|>, then does not repeat it). Where the template renders `history`
        differently once `new` follows, NotAppendOnly is raised; `keep_rewritten=True` returns the ids after the
        turn anyway (the generated ids stay as the model wrote them; the whole conversation's ids would differ).
        """
        full, start = self.continuation_start(history, new, tools, ended_with, keep_rewritten)
        return self.encode(full[start:])

    def continuation_start(
        self,
        history: list[dict],
        new: list[dict],
        tools: list[dict] | None = None,
        ended_with: int | None = None,
        keep_rewritten: bool = False,
    ) -> tuple[str, int]:
        """`continuation_ids` as text: the template's text for `history` and `new` with the generation prompt, and
        where in it the text after the generated turn starts (for callers that tokenize it themselves)."""
        if not new:
            raise ValueError("continuation_ids needs at least one new message after the assistant turn")
        full = self.render([*history, *new], tools, True)
        # where the first new message's content starts: the turn's end is the last end mark before it
        marked = self.render([*history, {**new[0], "content": PLACEHOLDER}, *new[1:]], tools, True)
        cut = self.turn_end(full[: common_prefix(full, marked)])
        if not keep_rewritten:
            self._check_kept(history, tools, full[:cut], [m["role"] for m in new])
        if ended_with is not None and not self.family.closers:
            stop = self._stop_text.get(ended_with, "\0")
            if full.startswith(stop, cut):
                cut += len(stop)
        return full, cut

    def closing_ids(self, history: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The ids that close the last assistant turn of `history` when the length limit cut it (the end token the
        template writes there); none for a family whose next message's role token closes a turn (GLM)."""
        if not self.family.closers:
            return []
        rendered = self.render(history, tools, False).rstrip()
        closer = next((c for c in self.family.closers if rendered.endswith(c)), self.family.closers[0])
        return self.encode(closer)

    def turn_end(self, text: str) -> int:
        """Where the last assistant turn ends in `text`, the template's rendering up to the next message's content:
        after its closer, or (GLM) before the next message's role token."""
        marks = self.family.closers or self.family.end_of_turn
        found = max(((text.rfind(mark), mark) for mark in marks), key=lambda hit: hit[0])
        if found[0] < 0:
            raise ChatTemplateError(
                f"the chat template does not end an assistant message with any of {', '.join(marks)}; agentrl needs "
                f"that to append messages without re-tokenizing: check that chat.format={self.family.name} fits it"
            )
        return found[0] + (len(found[1]) if self.family.closers else 0)

    def _check_kept(self, history: list[dict], tools, kept: str, roles: list[str]) -> None:
        alone = self.render(history, tools, False)
        if alone.startswith(kept) and not alone[len(kept) :].strip():
            return
        at = common_prefix(alone, kept)
        raise NotAppendOnly(
            f"the {self.family.name} chat template renders the history differently once a {'/'.join(roles)} message "
            f"follows (at character {at}: {alone[max(0, at - 30) : at + 30]!r} becomes "
            f"{kept[max(0, at - 30) : at + 30]!r}); keep the turn as generated (keep_rewritten) or start a new sample"
        )

    def written_turn(
        self, messages: list[dict], index: int, tools: list[dict] | None = None, keep_rewritten: bool = False
    ) -> str:
        """The assistant message at `index` as the template writes it right after its own generation prompt: the
        text a model that keeps to its format generates for it, its end token included where the template writes
        one. NotAppendOnly where the template does not write the turn after that prompt (R1's `<think>`), unless
        `keep_rewritten`: a prompt that opens reasoning is then followed by the turn as the model writes it, its
        reasoning (the family's `reasoning_key`), the reasoning's close, and the rest as the template writes it."""
        prompt = self.render(messages[:index], tools, True)
        written = self.render(messages[: index + 1], tools, False)
        end = self.turn_end(written) if self.family.closers else len(written.rstrip())
        reasoning = (messages[index].get(self.family.reasoning_key) or "").strip() if self.family.reasoning_key else ""
        if written.startswith(prompt):
            turn = written[len(prompt) : end]
            if reasoning and reasoning not in turn:  # R1 after tool outputs: no <think> opened, the reasoning dropped
                if not (keep_rewritten and self.family.reasoning_open):
                    raise NotAppendOnly(
                        f"turn {index}: the {self.family.name} chat template does not write its reasoning; keep the "
                        "turns as generated (keep_rewritten, chat.rewritten=keep) to train it as the model writes it"
                    )
                opener, closer = self.family.reasoning_open, self.family.reasoning_close
                return f"{opener}\n{reasoning}\n{closer}\n\n{turn.lstrip()}"
            return turn
        base = prompt.rstrip()[: -len(self.family.reasoning_open)] if self.ends_in_reasoning(prompt) else None
        if keep_rewritten and base is not None and written.startswith(base):
            thought = (
                f"{reasoning}\n{self.family.reasoning_close}\n\n" if reasoning else f"{self.family.reasoning_close}\n\n"
            )
            return thought + written[len(base) : end].lstrip()
        at = common_prefix(prompt, written)
        before, after = prompt[max(0, at - 30) : at + 30], written[max(0, at - 30) : at + 30]
        fix = (
            "; keep the turns as generated (keep_rewritten, chat.rewritten=keep) to train the turn as the model "
            "writes it after the prompt's reasoning opener"
            if base is not None
            else ""
        )
        raise NotAppendOnly(
            f"turn {index} is not written after its own generation prompt: at character {at} the prompt has "
            f"{before!r}, the conversation with the turn {after!r}{fix}"
        )

    def conversation_ids(
        self, messages: list[dict], tools: list[dict] | None = None, keep_rewritten: bool = False
    ) -> tuple[list[int], list[int]]:
        """A whole conversation's ids and loss mask, built as an episode builds them: the prompt (mask 0), each
        assistant turn as the template writes it (mask 1, with the stop token where the next message's role is
        the stop), the template's ids for the messages after it (mask 0). For SFT transcripts: trained on exactly
        the sequences RL samples."""
        turns = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
        if not turns:
            raise ValueError("a conversation to train on needs at least one assistant message")
        ids = self.prompt_ids(messages[: turns[0]], tools)
        mask = [0] * len(ids)
        for k, index in enumerate(turns):
            following = messages[index + 1 : turns[k + 1] if k + 1 < len(turns) else len(messages)]
            output = self.encode(self.written_turn(messages, index, tools, keep_rewritten))
            stop = self.family.turn_stop(following[0]["role"] if following else None)
            if stop is not None:
                output.append(self.tokenizer.convert_tokens_to_ids(stop))
            ids += output
            mask += [1] * len(output)
            if following:
                after = self.continuation_ids(messages[: index + 1], following, tools, output[-1], keep_rewritten)
                ids += after
                mask += [0] * len(after)
        return ids, mask

    # ---- parsing --------------------------------------------------------------------------------

    def turn_text(self, output_ids) -> str:
        """A turn's text for parsing: special tokens kept (they are markup), its end-of-turn token dropped."""
        ids = [int(i) for i in output_ids]
        while ids and ids[-1] in self._dropped:
            ids.pop()
        return self.decode(ids)

    def decode(self, ids) -> str:
        """Ids -> text with the special tokens kept (they are a family's markup)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def without_end(self, text: str) -> str:
        """`text` without a trailing end-of-turn token."""
        for token_id in self._dropped:
            token = self._stop_text[token_id]
            if token and text.endswith(token):
                return text[: -len(token)]
        return text

    def opens_reasoning(self, prompt_ids) -> bool:
        """Whether the prompt ends inside a reasoning block (R1's and the thinking Qwen3's prompts open it)."""
        if not self.family.reasoning_open or prompt_ids is None or len(prompt_ids) == 0:
            return False
        tail = [int(i) for i in prompt_ids[-8:]]
        pieces = self._pieces if isinstance(self._pieces, list) else None  # once a stream has built the table
        if pieces is not None and all(i < len(pieces) and pieces[i] is not None for i in tail):
            return self.ends_in_reasoning("".join(pieces[i] for i in tail))  # the table's text: no decode call
        return self.ends_in_reasoning(self.decode(tail))

    def ends_in_reasoning(self, prompt: str) -> bool:
        opener = self.family.reasoning_open
        return bool(opener) and prompt.rstrip().endswith(opener)

    def parse_ids(self, output_ids, prompt_ids=None, tools: list[dict] | None = None) -> ParsedTurn:
        """The generated ids of one turn -> its ParsedTurn (`prompt_ids` tell whether it starts inside reasoning)."""
        in_reasoning = self.opens_reasoning(prompt_ids)
        return self.family.parse(self.turn_text(output_ids), tools=tools, in_reasoning=in_reasoning)

    def stream(self, prompt_ids=None, tools: list[dict] | None = None) -> TokenStream:
        """A streaming parser fed generated ids as they come."""
        return TokenStream(self, self.family.stream(tools=tools, in_reasoning=self.opens_reasoning(prompt_ids)))

    def assistant_message(self, turn: ParsedTurn, call_ids: list[str] | None = None) -> dict:
        return self.family.assistant_message(turn, call_ids)

    def pieces(self) -> list[str | None] | None:
        """Each id's text where it is whole characters on its own, else None; None where the tokenizer's decoding is
        not byte-level (an id's text then depends on its neighbours: SentencePiece's leading spaces). Built once."""
        if self._pieces is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is None or type(backend.decoder).__name__ != "ByteLevel":
                self._pieces = False
            else:
                texts = backend.decode_batch([[i] for i in range(backend.get_vocab_size())], skip_special_tokens=False)
                self._pieces = [None if "\ufffd" in text else text for text in texts]
        return self._pieces or None

    def lane_table(self, mode: Mode) -> list:
        """Per id, for a stream in `mode` on its lane (`Scanner.lane`): (its text, the delta it makes) where the id
        is whole characters in which no exit marker of the mode can start (and, in a text mode, that do not end
        in whitespace, which the channel would hold), False where it is not, None until looked at
        (`lane_entry`). One table per mode, shared by every stream of this codec; needs `pieces`."""
        kept = self._lanes.get(id(mode))
        if kept is None:
            kept = self._lanes[id(mode)] = (mode, [None] * len(self.pieces()))
        return kept[1]

    def lane_entry(self, mode: Mode, token: int):
        """`lane_table(mode)[token]`, worked out and kept."""
        piece = self.pieces()[token]
        entry = False
        if piece and token not in self._dropped and not mode.marker_start(piece):
            if mode.channel is None:
                entry = (piece, NOTHING)
            elif not piece[-1].isspace():
                entry = (piece, TurnDelta(piece) if mode.channel == "content" else TurnDelta("", piece))
        self.lane_table(mode)[token] = entry
        return entry

    def probe(self):
        """What the template does with multi-turn tool conversations (agentrl.chat.probe.TemplateProbe), once."""
        if self._probe is None:
            from agentrl.chat.probe import probe_template

            self._probe = probe_template(self)
        return self._probe


class TokenStream:
    """Generated ids in, TurnDeltas out: ids are decoded incrementally (a character whose bytes are still arriving
    waits for them), end-of-turn ids are dropped, and the text goes to the family's scanner. With a byte-level
    tokenizer (Qwen, Llama 3, gpt-oss, DeepSeek, GLM) an id whose bytes are whole characters is its text from a table
    (`ChatCodec.pieces`); the Rust `DecodeStream` decodes only the runs of ids that split a character (and every id
    of other tokenizers). `finish` decodes the whole turn once, so the turn is what `parse_ids` gives even where the
    last bytes never completed a character.

    The streamed token's fast path: while the scanner is on a lane (`Scanner.lane`: text going on in its channel, or
    a call body searched to its end), an id whose text cannot start a marker there (`ChatCodec.lane_table`, known
    per id) is appended where the scanner would put it, and its delta is the table's: no text scan, no new object."""

    def __init__(self, codec: ChatCodec, scanner: Scanner):
        self.codec, self.scanner, self.dropped = codec, scanner, codec._dropped
        self.ids: list[int] = []
        self.sent: list[tuple[int, int, str]] = []  # the text each `_feed` gave the scanner, after ids[start:end]
        self.backend = getattr(codec.tokenizer, "backend_tokenizer", None)
        self.streams = DecodeStream is not None and self.backend is not None
        self.pieces = codec.pieces() if self.streams else None
        self.decoder = None if self.pieces is not None or not self.streams else DecodeStream(skip_special_tokens=False)
        self.prefix_offset = self.read_offset = 0  # the decode window of tokenizers without DecodeStream
        self.whole_pieces = self.pieces is not None  # every id so far was whole characters: the text sent is the turn
        self.lanes = getattr(scanner, "lane", None) if self.pieces is not None else None
        self.lane: list | None = None  # the lane table of the scanner's mode, while it is on one
        self.lane_mode: Mode | None = None
        self.lane_parts: list[str] = []
        if self.lanes is not None:
            self._find_lane()

    def feed(self, ids) -> TurnDelta:
        lane = self.lane
        if lane is not None:
            if len(ids) != 1:
                return self._feed_run(ids)
            token = ids[0]  # one id a feed: the streamed token
            if type(token) is not int:
                token = int(token)
            try:
                entry = lane[token]
            except IndexError:  # an id past the tokenizer's vocabulary (a model's padded embedding)
                entry = False
            if entry is None:
                entry = self.codec.lane_entry(self.lane_mode, token)
            if entry is not False:
                piece, delta = entry
                self.ids.append(token)
                self.lane_parts.append(piece)
                return delta
        delta = self._feed(ids)
        if self.lanes is not None:
            self._find_lane()
        return delta

    def _feed_run(self, ids) -> TurnDelta:
        """Several ids on a lane: those the lane takes, one delta for them; the rest (from the first it does not
        take) through `_feed`."""
        lane, mode, texts, taken = self.lane, self.lane_mode, [], []
        for token in ids:
            token = int(token)
            try:
                entry = lane[token]
            except IndexError:
                entry = False
            if entry is None:
                entry = self.codec.lane_entry(mode, token)
            if entry is False:
                break
            texts.append(entry[0])
            taken.append(token)
        if taken:
            self.ids += taken
            self.lane_parts += texts
        head = NOTHING
        if texts and mode.channel is not None:
            text = "".join(texts)
            head = TurnDelta(text) if mode.channel == "content" else TurnDelta("", text)
        if len(taken) == len(ids):
            return head
        rest = self._feed(ids[len(taken) :])
        self._find_lane()
        return rest if head is NOTHING else head + rest

    def _find_lane(self) -> None:
        found = self.lanes() if self.decoder is None else None  # a character's bytes still arriving: no lane
        if found is None:
            self.lane = None
            return
        self.lane_mode, self.lane_parts = found
        self.lane = self.codec.lane_table(self.lane_mode)

    def _feed(self, ids) -> TurnDelta:
        pieces, dropped = self.pieces, self.dropped
        start = len(self.ids)
        new = []
        for token in ids:
            token = int(token)
            if token in dropped:
                continue
            self.ids.append(token)
            if not self.streams:
                continue
            if pieces is not None and self.decoder is None and token < len(pieces):
                piece = pieces[token]
                if piece is not None:
                    new.append(piece)
                    continue
            if self.decoder is None:  # a character split across ids starts: decode the run until it completes
                self.decoder = DecodeStream(skip_special_tokens=False)
            self.whole_pieces = False
            piece = self.decoder.step(self.backend, token)
            if piece:
                new.append(piece)
                if pieces is not None:
                    self.decoder = None
        text = ("".join(new) if len(new) != 1 else new[0]) if self.streams else self._window_text()
        self.sent.append((start, len(self.ids), text))
        return self.scanner.feed(text) if text else TurnDelta()

    def finish(self) -> tuple[TurnDelta, ParsedTurn]:
        rest = ""
        if not self.whole_pieces:  # bytes that never completed a character come last
            whole, sent = self.codec.decode(self.ids), self._sent_text()
            rest = whole[len(sent) :] if whole.startswith(sent) else ""
        first = self.scanner.feed(rest) if rest else None
        last, turn = self.scanner.finish()
        self.lane = None
        return (last if first is None else first + last), turn

    def _sent_text(self) -> str:
        """The text the scanner was given: each `_feed`'s, and the table's text of the ids the fast path took."""
        parts, at = [], 0
        for start, end, text in self.sent:
            parts += [self.pieces[i] for i in self.ids[at:start]]
            parts.append(text)
            at = end
        parts += [self.pieces[i] for i in self.ids[at:]]
        return "".join(parts)

    def _window_text(self) -> str:
        """The text the ids since the last call add; "" while a character's bytes are still arriving."""
        text = self.codec.decode(self.ids[self.prefix_offset :])
        if text.endswith("\ufffd"):
            return ""
        before = self.codec.decode(self.ids[self.prefix_offset : self.read_offset])
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(before) :]


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # the longest common prefix, by halving (slices compare in C)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def load_codec(
    model: str | Path | object,
    format: str | None = None,
    template_kwargs: dict | None = None,
    model_type: str | None = None,
) -> ChatCodec:
    """The codec of a model folder (or of a loaded tokenizer): its family named by `format`, else detected from the
    tokenizer's special tokens, its template and the config's model_type."""
    from agentrl.chat.detect import detect_family, model_type_of
    from agentrl.chat.registry import resolve

    if isinstance(model, str | Path):
        from transformers import AutoTokenizer

        folder = Path(model)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model_type = model_type or model_type_of(folder)
    else:
        tokenizer = model
    name = format or detect_family(ModelSignals.of(tokenizer, model_type))
    return ChatCodec(tokenizer, resolve(name)(), template_kwargs)
