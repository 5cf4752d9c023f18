"""Several policies behind one session URL: each is served under its name as the OpenAI `model`, and a call's
`model` picks the policy (its engine, tokenizer and chat template) that generates it."""

from __future__ import annotations

from agentrl.serve.completions import Completions
from agentrl.serve.protocol import APIError


class PolicyRouter:
    """The OpenAI endpoints of every policy in `served` ({name: its Completions}), as one Completions-like object
    for `openai_router`. The hook a call gets is its session's hook for the policy named (`hook.for_policy`)."""

    def __init__(self, served: dict[str, Completions]):
        self.served = served
        self.unknown_calls = 0  # calls naming a model no policy has, since the gateway started

    @property
    def names(self) -> list[str]:
        return list(self.served)

    def models(self) -> dict:
        return {"object": "list", "data": [completions.model_card() for completions in self.served.values()]}

    def card(self, model_id: str) -> dict:
        if model_id not in self.served:
            raise self.unknown(model_id)
        return self.served[model_id].model_card()

    async def chat(self, payload: object, on_call=None):
        name, completions = self._policy_of(payload, on_call)
        return await completions.chat(payload, on_call.for_policy(name) if on_call is not None else None)

    async def complete(self, payload: object, on_call=None):
        name, completions = self._policy_of(payload, on_call)
        return await completions.complete(payload, on_call.for_policy(name) if on_call is not None else None)

    def _policy_of(self, payload: object, on_call) -> tuple[str, Completions]:
        """The policy a call names in its `model`; a body without one is left to the first policy's Completions,
        whose parsing names what is missing."""
        name = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(name, str):
            first = next(iter(self.served))
            return first, self.served[first]
        if name not in self.served:
            self.unknown_calls += 1
            if on_call is not None:
                on_call.session.unknown_models.append(name)
            raise self.unknown(name)
        return name, self.served[name]

    def unknown(self, name: str) -> APIError:
        return APIError(unknown_model_message(name, self.names), status=404, param="model", code="model_not_found")


def unknown_model_message(name: str, known: list[str]) -> str:
    """The one line an agent gets for a model name no policy has."""
    return (
        f"The model `{name:.80}` is no policy of this job; call one of the policies by name: "
        f"{', '.join(known)} (model=NAME; GET /v1/models lists them)"
    )
