"""Prints its own arguments (JSON, one line) and a metric: what a script receives, checked by the tests."""

import json
import sys

print("ARGV " + json.dumps(sys.argv[1:]), flush=True)
print("performance: 1.0 samples_per_second", flush=True)
