"""Print uv's flags for the package sources pip is configured with: `make venv` installs with uv.

uv installs perfkit's ~200 dependencies in ~20 s where pip takes ~100 s (2 cores), but it reads
neither pip.conf nor PIP_* variables. This reads them through `pip config list` (index, extra
indexes, find-links, constraints, CA bundle; a variable wins over site over user over global files,
as in pip) so uv installs from exactly where pip would. With `--index-strategy unsafe-best-match`
uv, like pip, takes the best version from all indexes, not the first index that has the package.
"""
import shlex
import subprocess
import sys

PRIORITY = {"global": 0, "user": 1, "site": 2, ":env:": 3}  # pip's own order: later wins
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint", "cert": "--cert"}

listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
chosen: dict[str, tuple[int, str]] = {}
for line in listing.splitlines():
    name, _, value = line.partition("=")
    scope, _, key = name.rpartition(".")
    if key in FLAGS and scope in PRIORITY and PRIORITY[scope] >= chosen.get(key, (-1, ""))[0]:
        chosen[key] = (PRIORITY[scope], " ".join(shlex.split(value)))
args = []
for key, (_, value) in chosen.items():
    for item in value.split():
        args += [FLAGS[key], item]
print(shlex.join(args))
