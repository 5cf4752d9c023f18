"""`agentrl check-model PATH`: what agentrl makes of a model folder's chat format, before any run uses it.

It prints the family (detected, or named with --chat-format), where the chat template comes from, the special tokens
the family's parser reads, the stop ids, whether multi-turn rendering is append-only (the template probe), and a
sample multi-turn tool conversation rendered by the model's template and parsed back turn by turn. Exit 0 when every
check passes, 1 when one fails (the output says which), 2 for a folder agentrl cannot read (the message says why and
what to do).
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.errors import UserError


def add_arguments(parser) -> None:
    parser.add_argument("path", help="a model folder, a run folder or a run's checkpoint folder")
    parser.add_argument(
        "--chat-format", default=None, help="the family to use instead of detecting one (agentrl check-model --list)"
    )
    parser.add_argument("--list", action="store_true", help="list the registered chat formats and exit")


def main(args) -> int:
    from agentrl.chat import ChatTemplateError, UnknownChatFormat, load_codec, registered_names

    if args.list:
        for name in registered_names():
            print(name)
        return 0
    from agentrl.trainer.folders import model_folder

    folder = Path(model_folder(args.path, f"agentrl check-model {args.path}")[0])
    try:
        codec = load_codec(folder, args.chat_format)
    except (UnknownChatFormat, ChatTemplateError, KeyError) as error:
        raise UserError(f"{folder}: {_message(error)}") from None
    except OSError as error:
        raise UserError(f"{folder}: cannot load its tokenizer ({error}); pass a Hugging Face model folder") from None
    return print_report(codec, folder, detected=args.chat_format is None)


def print_report(codec, folder: Path, detected: bool) -> int:
    from agentrl.chat import ChatTemplateError
    from agentrl.chat.probe import same_turn, sample_conversation

    tokenizer, family = codec.tokenizer, codec.family
    print(f"model folder    {folder}")
    print(f"chat format     {family.name} ({'detected' if detected else 'named with --chat-format'})")
    print(f"chat template   {_template_source(folder)}")
    markers = family_markers(family)
    special = set(tokenizer.get_added_vocab()) | set(tokenizer.all_special_tokens)
    shown = [f"{marker}{'' if marker in special else ' (plain text here, not a special token)'}" for marker in markers]
    print(f"parser markers  {', '.join(shown) or 'none'}")
    stops = ", ".join(f"{tokenizer.convert_ids_to_tokens(i)} ({i})" for i in codec.stop_ids)
    print(f"stop ids        {stops}")
    probe = codec.probe()
    checks = {
        "renders tools=": probe.renders_tools,
        "renders parallel calls": probe.renders_parallel_calls,
        "writes turns after its own generation prompt": probe.keeps_generation,
        "turns parse back to what was written": probe.round_trip,
        "prompt + turn tokenize as apart": probe.tokens_split_exactly,
        "append-only after a tool result": probe.append_only_after_tool,
        "append-only after a user message": probe.append_only_after_user,
    }
    print(f"thinking        {'on' if probe.thinking else 'off (or none)'}")
    for name, ok in checks.items():
        print(f"  {'yes' if ok else 'no ':3}  {name}")
    for note in probe.notes:
        print(f"       note: {note}")
    print(f"append-only     {'yes' if probe.append_only else 'no: a rewritten history starts a new sample'}")

    messages, turns = sample_conversation(codec, probe.thinking)
    from agentrl.chat.probe import PROBE_TOOL

    text = codec.render(messages, [PROBE_TOOL], generation_prompt=False)
    print("\nA sample tool conversation as the template renders it:\n")
    print(text)
    failed = not probe.round_trip
    for index, expected in ((2, turns[0]), (4, turns[1])):
        try:
            written = codec.written_turn(messages, index, [PROBE_TOOL])
        except ChatTemplateError as error:
            print(f"turn {index}: not parsed back here: {error}")
            continue
        prompt = codec.render(messages[:index], [PROBE_TOOL], True)
        parsed = family.parse(
            codec.without_end(written), tools=[PROBE_TOOL], in_reasoning=codec.ends_in_reasoning(prompt)
        )
        calls = [(call.name, call.arguments) for call in parsed.calls]
        print(f"turn {index} parsed back: content={parsed.content!r} reasoning={parsed.reasoning!r} calls={calls}")
        if parsed.errors:
            print(f"  errors: {parsed.errors}")
        if not same_turn(parsed, expected):
            failed = True
            print(f"  differs from the turn that was written: {expected}")
    # The parse-back is what must hold; the other probe results describe the template and are not failures.
    print("\nok" if not failed else "\nFAILED: the template's turns do not parse back (notes above)")
    return 1 if failed else 0


def _template_source(folder: Path) -> str:
    for name in ("chat_template.jinja", "chat_template.json"):
        if (folder / name).is_file():
            return str(folder / name)
    config = folder / "tokenizer_config.json"
    if config.is_file() and "chat_template" in json.loads(config.read_text()):
        return f"{config} (chat_template)"
    return "none found in the folder (the tokenizer's default)"


def family_markers(family) -> list[str]:
    """The strings the family's parser reads: its turn ends, reasoning markers and every mode's exit markers."""
    found = [*family.end_of_turn, family.reasoning_open, family.reasoning_close]
    for mode in family.modes.values():
        found.extend(mode.exits)
    return list(dict.fromkeys(marker for marker in found if marker))


def _message(error: Exception) -> str:
    return error.args[0] if error.args else repr(error)
