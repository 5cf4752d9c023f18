"""An episode as the text a judge or a reward model reads: placeholders filled, turns written out."""

from __future__ import annotations

from agentrl.config.schema import PLACEHOLDER


def fill(template: str, arguments: dict) -> str:
    """`template` with {task}, {completion}, {transcript} and {answer} replaced by the episode's; any other
    braces (a JSON example in a rubric) stay as written."""
    values = {
        "task": str(arguments.get("task") or ""),
        "completion": str(arguments.get("completion") or ""),
        "transcript": written_transcript(arguments.get("transcript") or []),
        "answer": "(none)" if arguments.get("answer") is None else str(arguments["answer"]),
    }
    return PLACEHOLDER.sub(lambda match: values.get(match[1], match[0]), template)


def written_transcript(transcript: list[tuple[str, str]]) -> str:
    """Every turn: what the model wrote, then what the environment answered (the last answer included)."""
    parts = []
    for number, (action, observation) in enumerate(transcript, start=1):
        parts.append(f"[turn {number}: model]\n{action}")
        if observation:
            parts.append(f"[turn {number}: environment]\n{observation}")
    return "\n".join(parts)


def conversation(arguments: dict) -> list[dict]:
    """The episode as chat messages for a reward model's chat template: the task as the user's message, then each
    turn's reply and the environment's answer as the next user message; the environment's last answer (after
    the reply being judged) is left out."""
    messages = [{"role": "user", "content": str(arguments.get("task") or "")}]
    transcript = arguments.get("transcript") or []
    for index, (action, observation) in enumerate(transcript):
        messages.append({"role": "assistant", "content": action})
        if index + 1 < len(transcript):
            messages.append({"role": "user", "content": observation})
    return messages
