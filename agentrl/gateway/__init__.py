"""The training gateway: the policy under training served over an OpenAI-style API, one session per episode."""
