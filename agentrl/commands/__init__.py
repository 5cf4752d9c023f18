"""One module per `agentrl` subcommand, each with `add_arguments(parser)` and `main(args) -> exit code`; agentrl/cli.py
is the parser and the table of them. A command assembles the packages below it; its body is here, what it builds
from lives in those packages (the `train` command's roles in agentrl/roles/, a run's life in agentrl/run/).
"""
