#!/usr/bin/env bash
# bash tests/multinode/cluster.sh up N | down | status | exec K COMMAND...   (as root; see cluster.py)
cd "$(dirname "$0")/../.." && exec python3 -m tests.multinode.cluster "$@"
