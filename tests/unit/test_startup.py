import gc
import json
import subprocess
import sys

CHILD = """
import gc, json
from agentrl.run import startup_gc
defaults = gc.get_threshold()
startup_gc.defer_collection()
deferred = gc.get_threshold()
garbage = []
garbage.append(garbage)  # a cycle made during start-up
del garbage
startup_gc.settle()
startup_gc.settle()  # a second call changes nothing
print(json.dumps([defaults, deferred, gc.get_threshold(), gc.get_freeze_count(), gc.collect()]))
"""


def test_start_up_defers_collection_then_settles_to_the_defaults_with_start_up_frozen():
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    defaults, deferred, after, frozen, collected = json.loads(result.stdout)
    assert defaults == list(gc.get_threshold()) and deferred[0] >= 100 * defaults[0]
    assert after == defaults and frozen > 0
    assert collected == 0  # settle collected the start-up's young cycle before setting the rest aside
