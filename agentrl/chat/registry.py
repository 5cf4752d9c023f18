"""Find chat format families by name: the built-ins, in-process registrations, `module:Class`, or the
`agentrl.chat_formats` entry points (as envs and algorithms plug in: agentrl/plugins.py)."""

from __future__ import annotations

from agentrl.plugins import Registry

ENTRY_POINT_GROUP = "agentrl.chat_formats"
_formats = Registry("chat format", ENTRY_POINT_GROUP, "agentrl.chat.registry.register")


def register(name: str, target: str | type) -> None:
    """Register `name` -> a ChatFamily subclass or its `"module:Class"` path; a taken name is an error."""
    _formats.register(name, target)


def registered_names() -> list[str]:
    return _formats.names()


def resolve(name: str) -> type:
    """The ChatFamily subclass behind `name`, imported now."""
    from agentrl.chat.family import ChatFamily

    found = _formats.resolve(name, hint=" (set chat.format to one of the known names, or leave it unset to detect)")
    if not (isinstance(found, type) and issubclass(found, ChatFamily)):
        raise TypeError(f"chat format {name!r} resolves to {found!r}, not a subclass of agentrl.chat.family.ChatFamily")
    return found


register("hermes", "agentrl.chat.hermes:HermesFamily")
register("qwen3", "agentrl.chat.qwen3:Qwen3Family")
register("llama3", "agentrl.chat.llama3:Llama3Family")
register("mistral", "agentrl.chat.mistral:MistralFamily")
register("harmony", "agentrl.chat.harmony:HarmonyFamily")
register("deepseek_v3", "agentrl.chat.deepseek:DeepSeekV3Family")
register("deepseek_r1", "agentrl.chat.deepseek:DeepSeekR1Family")
register("glm45", "agentrl.chat.glm:GLM45Family")
