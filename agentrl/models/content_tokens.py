"""Chat text -> token ids with every message's content as text: a control string in content is never a special token.

A chat template writes turn markers (`<|im_start|>`, `<|im_end|>`) around each message's content. Tokenizing the
rendered text whole would also turn a marker *inside* content (a user's message, a tool result, a web page an agent
read) into the special token, so content could forge turns. Here the template's own special tokens stay special,
while content is tokenized as `tokenizer(text, split_special_tokens=True)` spells it: the tokens of its characters.

Content that holds no control string costs one cheap scan per message and is tokenized exactly as the whole text
always was. Otherwise the template is rendered once more with a unique mark in place of each such content; the marks
locate the content in the real text (which must be the marked text with each mark replaced by its content: verbatim,
trimmed of surrounding whitespace, or JSON-escaped, the ways templates write it). Whole-text tokenization decides: when
no special token falls inside content, its ids are kept; otherwise the text between the template's own special tokens
is tokenized with special tokens not recognized. A template that rewrites content in another way cannot place it:
content holding a control string is then refused (ContentError), never tokenized into turn markers.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import weakref
from collections.abc import Callable, Iterable

Span = tuple[int, int]  # [start, end) of one content's characters in the rendered text
# How templates write a message's content: as it is, trimmed (Llama 3), or as a JSON string's inside (`| tojson`).
WRITTEN: tuple[Callable[[str], str], ...] = (
    lambda content: content,
    str.strip,
    lambda content: json.dumps(content, ensure_ascii=False)[1:-1],
)


class ContentError(ValueError):
    """Content holding a control string that the chat template rewrites, so that it cannot be kept as text."""


class ContentTokenizer:
    """Token ids of rendered chat text where message content is text (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        specials = {
            str(token.content): int(index)
            for index, token in tokenizer.added_tokens_decoder.items()
            if token.special and token.content
        }
        self.special_ids = frozenset(specials.values())
        self._contains = _any_of(specials)
        # A control string can also form across content and the template's text beside it: content that opens with
        # the end of one, ends with the start of one, or lies inside one.
        self._opens = _any_of(s[i:] for s in specials for i in range(1, len(s)))
        self._closes = _any_of((s[:i] for s in specials for i in range(1, len(s))), r"\Z")
        self._inside = {s[i:j] for s in specials for i in range(1, len(s)) for j in range(i + 1, len(s))}
        self._longest = max(map(len, specials), default=0)
        nonce = secrets.token_hex(6)
        self._mark = "\u2591agentrl-content-{}-" + nonce + "\u2591"
        self._marks = re.compile("\u2591agentrl-content-(\\d+)-" + nonce + "\u2591")
        self._literal: Callable[[str], list[int]] | None = None

    def control_string(self, content: str) -> str | None:
        """The first control string (special token's text) in `content`, or None."""
        match = self._contains.search(content)
        return match.group() if match else None

    def may_form_control(self, content: str) -> bool:
        """Whether `content` holds a control string or could complete one with the template's text beside it."""
        if not content or not self.special_ids:
            return False
        if self._contains.search(content) or self._opens.match(content):
            return True
        if self._closes.search(content, max(0, len(content) - self._longest)):
            return True
        return len(content) < self._longest and content in self._inside

    def text_ids(self, text: str) -> list[int]:
        """`text`'s tokens with no special token recognized (`tokenizer(text, split_special_tokens=True)`)."""
        if not text:
            return []
        if self._literal is None:
            self._literal = _literal_encoder(self.tokenizer)
        return self._literal(text)

    def content_ids(self, content: str) -> list[int]:
        """One content's tokens on their own (an assistant turn's text in a transcript)."""
        if self.may_form_control(content):
            return self.text_ids(content)
        return self.tokenizer(content, add_special_tokens=False)["input_ids"]

    def wrapped_ids(self, before: str, content: str, after: str) -> list[int]:
        """The tokens of `before + content + after`: template text around one content."""
        spans = [(len(before), len(before) + len(content))] if self.may_form_control(content) else []
        return self.ids(before + content + after, spans)

    def rendered(
        self, render: Callable[[list[dict]], str], messages: list[dict], fields: tuple[str, ...] = ("content",)
    ) -> tuple[str, list[Span]]:
        """`render(messages)`, and the spans in it of the contents that may form a control string ([] if none do).

        `render` is the chat template applied to messages (the same call each time); `fields`: the keys of a
        message whose text is content (an assistant message's reasoning too, where the template writes it). Raises
        ContentError for content holding a control string that the template rewrites (`WRITTEN` lists the ways it
        may write content).
        """
        suspects = {
            (index, key): message[key]
            for index, message in enumerate(messages)
            for key in fields
            if isinstance(message.get(key), str) and self.may_form_control(message[key])
        }
        text = render(messages)
        if not suspects:
            return text, []
        numbers = {where: number for number, where in enumerate(suspects)}
        marked = render(
            [
                {**m, **{key: self._mark.format(numbers[(i, key)]) for key in fields if (i, key) in numbers}}
                for i, m in enumerate(messages)
            ]
        )
        contents = list(suspects.values())
        spans, unplaced = self._locate(marked, text, contents)
        if spans is not None:
            return text, spans
        for number in sorted(range(len(contents)), key=lambda n: n != unplaced):  # the unplaced one first
            control = self.control_string(contents[number])
            if control is not None:
                index, key = list(suspects)[number]
                what = "content" if key == "content" else f"{key!r}"
                raise ContentError(
                    f"message {index}'s {what} holds the control string {control!r}, and this chat template rewrites "
                    "message content (beyond trimming or JSON-escaping it), so agentrl cannot keep that string as text "
                    "(it would become a turn marker); remove it from the content, or use a chat template that writes "
                    "content unchanged"
                )
        return text, []  # nothing to keep apart: no content holds a whole control string

    def _locate(self, marked: str, text: str, contents: list[str]) -> tuple[list[Span] | None, int | None]:
        """The spans of `contents` in `text`, if `text` is `marked` with each mark replaced by its content as the
        template writes it (`WRITTEN`); else None and the number of the content that could not be placed."""
        spans: list[Span] = []
        matches = list(self._marks.finditer(marked))
        target = 0
        for number, match in enumerate(matches):
            index = int(match.group(1))
            chunk = marked[matches[number - 1].end() if number else 0 : match.start()]
            if not text.startswith(chunk, target):
                return None, index
            target += len(chunk)
            following = marked[match.end() : matches[number + 1].start() if number + 1 < len(matches) else None]
            for written in (form(contents[index]) for form in WRITTEN):
                if text.startswith(written, target) and text.startswith(following, target + len(written)):
                    break
            else:
                return None, index
            spans.append((target, target + len(written)))
            target += len(written)
        rest = marked[matches[-1].end() :] if matches else marked
        return (spans, None) if rest == text[target:] else (None, None)

    def ids(self, text: str, spans: list[Span], start: int = 0) -> list[int]:
        """The tokens of `text[start:]`, the characters in `spans` (offsets into `text`) being content."""
        text = text[start:]
        spans = [(max(a, start) - start, b - start) for a, b in spans if b > start]
        if not spans:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        template: list[tuple[int, int, int]] = []  # (start, end, id) of the template's own special tokens
        forged = False
        for index in (i for i, token in enumerate(ids) if token in self.special_ids):
            first, last = offsets[index]
            if any(first < b and a < last for a, b in spans):
                forged = True
            else:
                template.append((first, last, ids[index]))
        if not forged:
            return ids
        out: list[int] = []
        position = 0
        for first, last, token in template:
            out += self.text_ids(text[position:first])
            out.append(token)
            position = last
        return out + self.text_ids(text[position:])


_shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def content_tokenizer(tokenizer) -> ContentTokenizer:
    """The ContentTokenizer of `tokenizer`, built once per tokenizer object (again if tokens were added since)."""
    size = len(tokenizer)
    with _shared_lock:
        found = _shared.get(tokenizer)
        if found is None or found[0] != size:
            found = _shared[tokenizer] = (size, ContentTokenizer(tokenizer))
        return found[1]


def _any_of(strings: Iterable[str], tail: str = "") -> re.Pattern:
    """A regex matching any of `strings` (then `tail`), factored by common prefixes so that a search fails fast;
    with no strings, one that matches nothing."""
    trie: dict = {}
    for string in set(strings):
        node = trie
        for char in string:
            node = node.setdefault(char, {})
        node[""] = {}
    return re.compile(f"(?:{_pattern(trie)}){tail}" if trie else "(?!)")


def _pattern(node: dict) -> str:
    branches = [re.escape(char) + (_pattern(child) if child else "") for char, child in sorted(node.items()) if char]
    if "" in node:
        branches.append("")
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


def _literal_encoder(tokenizer) -> Callable[[str], list[int]]:
    """Tokens of text with special tokens not recognized. A fast tokenizer's backend gets a private copy with that
    set, so the shared one is never toggled under another thread's call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return lambda text: tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    from tokenizers import Tokenizer

    literal = Tokenizer.from_str(backend.to_str())
    literal.encode_special_tokens = True
    literal.no_truncation()
    literal.no_padding()
    return lambda text: literal.encode(text, add_special_tokens=False).ids


def spans_without(spans: list[tuple[int, int]], text: str, part: str) -> list[tuple[int, int]]:
    """`spans` less the characters of each occurrence of `part` in `text`."""
    holes, at = [], text.find(part)
    while part and at >= 0:
        holes.append((at, at + len(part)))
        at = text.find(part, at + len(part))
    for hole_start, hole_end in holes:
        spans = [
            piece
            for start, end in spans
            for piece in ((start, min(end, hole_start)), (max(start, hole_end), end))
            if piece[0] < piece[1]
        ]
    return spans
