"""Adapters to other packages' environments: each makes the env ids `PREFIX:NAME` of one package."""
