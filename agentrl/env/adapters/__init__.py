"""Adapters to other packages' environments: `env.id: PREFIX:NAME` builds NAME of that package as an agentrl env."""
