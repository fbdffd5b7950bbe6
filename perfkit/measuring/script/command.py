"""A user's unchanged script as one configuration: its command line built from perfkit's
parameters through an argument mapping (DeepSpeed's autotuner calls it ``arg_mappings``), run as a
child of the kernel, its output streamed, its metrics read (:mod:`perfkit.measuring.script.metrics`).

The mapping names, for each parameter, the script's flag:

- ``"--batch-size"``: the flag and the value (``--batch-size 32``); a list gives every item
  after the flag (``--layers 2 4``);
- ``"--batch-size={value}"`` or any template with ``{value}``: that text, split as a shell would,
  the value put in after the split (a JSON value with spaces stays one argument);
- a mapping (``args: {opt: {betas: [0.9, 0.95]}}``) or a list inside a template goes as JSON;
- for a bool, the flag alone when True and nothing when False (``{"bf16": "--bf16"}``);
- a mapping of values to flags: ``{"precision": {"bf16": "--bf16", "fp32": ""}}``.

A parameter whose value is None is left out. The command itself may name parameters too, where a
flag must come before the script (``"torchrun --nproc-per-node {world_size} train.py"``); a brace
that names no parameter stays as written (``python -c "d={}"``, ``--overrides '{"lr": 0.1}'``,
Hydra's ``model.layers={4,8}``), and ``{{name}}`` writes a literal ``{name}``. The script runs in its own session, so the whole
process group (a ``torchrun`` and its ranks) is signalled at a timeout or an interrupt, and every
process of it carries the configuration's teardown token in its environment (the engine reaps
what escaped). Its ending decides the row: exit 0 and a metric → ``ok``; an allocator's message
in its output → ``oom``; another non-zero exit → ``failed`` with the last lines of its stderr; the
deadline → ``timeout``; exit 0 without any metric → ``failed``, naming the sources tried.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfkit.core import checks
from perfkit.core.errors import BadInputError
from perfkit.core.status import FAILED, OK, OOM, TIMEOUT, is_oom_text
from perfkit.measuring.script import metrics

__all__ = ["ScriptConfig", "build_argv", "run_script", "config_from_params", "check_params", "TAIL_LINES",
           "NAMED_PARAMETERS"]

TAIL_LINES = 20
WORKLOAD = "script"


@dataclass(kw_only=True, frozen=True)
class ScriptConfig:
    """One run of a script (module docstring)."""

    command: str | Sequence[str]
    """The script's command line (shell words, no shell): ``"python train.py --epochs 1"``."""
    arg_mappings: Mapping[str, object] = field(default_factory=dict)
    """Parameter name -> the script's flag (module docstring)."""
    values: Mapping[str, object] = field(default_factory=dict)
    """The parameters' values for this configuration (those the mapping names)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables set for the script, over the kernel's."""
    cwd: str | None = None
    """The script's working directory (None: the kernel's)."""
    timeout_s: float = 600.0
    sources: Sequence[str] = ("performance", "json")
    """Where its metrics are (:data:`perfkit.measuring.script.metrics.SOURCES`)."""
    json_prefix: str = "PERFKIT_METRIC"
    regex: str | None = None
    csv_path: str | None = None
    """A MAD-style CSV the script writes (``csv`` source), relative to ``cwd``."""

    def __post_init__(self):
        argv = self.argv_base
        if not argv:
            raise BadInputError("command is empty: name the script's command line")
        if shutil.which(argv[0], path=self._search_path()) is None and not _executable(argv[0], self.cwd):
            raise BadInputError(f"command {argv[0]!r} is not found or not executable (PATH, or a path from "
                                f"{self.cwd or 'the working directory'})")
        if self.cwd is not None and not Path(self.cwd).is_dir():
            raise BadInputError(f"cwd {self.cwd!r} is not a directory")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise BadInputError(f"timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        for source in self.sources:
            checks.one_of("metric source", source, metrics.SOURCES)
        if not self.sources:
            raise BadInputError(f"sources is empty: name where the script's metrics are ({', '.join(metrics.SOURCES)})")
        if "regex" in self.sources:
            if not self.regex:
                raise BadInputError("source 'regex' needs regex: a pattern with named groups")
            metrics.check_regex(self.regex)
        elif self.regex:
            metrics.check_regex(self.regex)
        if "csv" in self.sources and not self.csv_path:
            raise BadInputError("source 'csv' needs csv_path: the CSV file the script writes")
        if unknown := sorted(set(self.arg_mappings) - set(self.values)):
            raise BadInputError(f"arg_mappings names {unknown}, which are not parameters of this run "
                                f"(parameters: {sorted(self.values)})")
        build_argv(self)  # a mapping that cannot take its value is refused here

    @property
    def argv_base(self) -> list[str]:
        words = shlex.split(self.command) if isinstance(self.command, str) else [str(a) for a in self.command]
        return [_fill(w, self.values) for w in words]

    def _search_path(self) -> str | None:
        return self.env.get("PATH", os.environ.get("PATH"))


def _executable(program: str, cwd: str | None) -> bool:
    path = Path(program) if Path(program).is_absolute() else Path(cwd or ".") / program
    return ("/" in program) and path.is_file() and os.access(path, os.X_OK)


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _text(value) -> str:
    """A value as one argument: a mapping or a list as JSON (``{"betas": [0.9, 0.95]}``, which a
    script's ``json.loads`` or argparse ``type=json.loads`` reads), anything else as ``str``."""
    return json.dumps(value) if isinstance(value, (Mapping, list, tuple)) else str(value)


def _fill(word: str, values: Mapping) -> str:
    """``word`` with each ``{name}`` of a parameter replaced by its value (:func:`_text`); ``{{`` and
    ``}}`` write a literal brace; every other brace stays as written (``python -c "d={}"``,
    ``--overrides '{"lr": 0.1}'``, Hydra's ``model.layers={4,8}``). A ``{name}`` that is an
    identifier but no parameter is refused: the likeliest cause is a misspelt parameter."""
    def one(m: re.Match) -> str:
        if m.group(0) in ("{{", "}}"):
            return m.group(0)[0]
        name = m.group(1)
        if name not in values:
            raise BadInputError(f"command names {{{name}}}, which is not a parameter of this run (parameters: "
                                f"{sorted(values)}; write {{{{{name}}}}} for a literal {{{name}}})")
        return _text(values[name])
    return _PLACEHOLDER.sub(one, word) if "{" in word or "}" in word else word


def build_argv(cfg: ScriptConfig) -> list[str]:
    """The script's argv: its command, then each mapped parameter's flag (module docstring)."""
    argv = cfg.argv_base
    for name, flag in cfg.arg_mappings.items():
        value = cfg.values.get(name)
        if value is None:
            continue
        if isinstance(flag, Mapping):
            key = value if value in flag else str(value)
            if key not in flag:
                raise BadInputError(f"arg_mappings[{name!r}] maps {sorted(map(str, flag))}, not {value!r}")
            argv += shlex.split(str(flag[key] or ""))
        elif not isinstance(flag, str) or not flag:
            raise BadInputError(f"arg_mappings[{name!r}] must be a flag, a '{{value}}' template or a mapping "
                                f"of values to flags, got {flag!r}")
        elif "{value}" in flag:
            # The template split as a shell would, then the value put in whole: a JSON value with
            # spaces stays one argument (`--opt={value}` -> `--opt={"betas": [0.9, 0.95]}`).
            argv += [w.replace("{value}", _text(value)) for w in shlex.split(flag)]
        elif isinstance(value, bool):
            argv += [flag] if value else []
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(_text, value)]
        else:
            argv += [flag, _text(value)]
    return argv


def _pump(stream, sink: list[str], tail: deque, echo) -> None:
    for line in iter(stream.readline, ""):
        line = line.rstrip("\n")
        sink.append(line)
        tail.append(line)
        echo(line)
    stream.close()


def _end_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the script's process group, SIGKILL what is left of it after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the script itself: a zombie would keep its group alive
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def run_script(cfg: ScriptConfig, *, echo=None) -> dict:
    """Run ``cfg``'s script once and return its row (module docstring). ``echo(line)`` sees each
    output line as it comes (default: printed, so a notebook shows the script's output live)."""
    echo = echo or (lambda line: print(line, flush=True))
    argv = build_argv(cfg)
    env = {**os.environ, **{k: str(v) for k, v in cfg.env.items()}}
    row = {"workload": WORKLOAD, "command": shlex.join(argv), **{k: v for k, v in cfg.values.items()}}
    out: list[str] = []
    err: list[str] = []
    err_tail: deque = deque(maxlen=TAIL_LINES)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cfg.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, bufsize=1, start_new_session=True)
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, out, deque(maxlen=1), echo), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, err, err_tail,
                                                  lambda line: print(line, file=sys.stderr, flush=True)), daemon=True)]
    for t in pumps:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=cfg.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if timed_out or proc.poll() is None:  # the deadline, or an interrupt of the kernel
            _end_group(proc)
        else:
            _end_group(proc, grace_s=1.0)  # the script's own children it left behind
    for t in pumps:
        t.join(timeout=5)
    row["wall_time_s"] = time.perf_counter() - started
    row["exit_code"] = proc.returncode
    csv_text = None
    if "csv" in cfg.sources and cfg.csv_path:
        path = Path(cfg.cwd or ".") / cfg.csv_path
        csv_text = path.read_text() if path.is_file() else None
    found = metrics.read_metrics(out + err, cfg.sources, json_prefix=cfg.json_prefix, regex=cfg.regex,
                                 csv_text=csv_text)
    row.update(metrics.summarise(found))
    row["metrics"] = sorted(found)
    tail = "\n".join(err_tail)
    if timed_out:
        row["status"], row["reason"] = TIMEOUT, f"the script ran past timeout_s = {cfg.timeout_s:g} s"
    elif is_oom_text("\n".join(err[-200:] + out[-50:])) and proc.returncode != 0:
        row["status"], row["reason"] = OOM, f"the script ran out of memory (exit {proc.returncode}):\n{tail}"
    elif proc.returncode != 0:
        row["status"], row["reason"] = FAILED, f"the script exited {proc.returncode}:\n{tail}"
    elif not found:
        tried = ", ".join(cfg.sources)
        row["status"], row["reason"] = FAILED, (f"no metric found in the script's output (tried {tried}"
                                                f"{'; json lines start with ' + repr(cfg.json_prefix) if 'json' in cfg.sources else ''})")
    else:
        row["status"], row["reason"] = OK, None
    return row


#: notebooks/script.ipynb's parameters that go to the script through ``arg_mappings`` (beside ``args``).
NAMED_PARAMETERS = ("batch_size", "precision", "world_size", "seq_len", "steps")


def config_from_params(*, command, arg_mappings, args, env, cwd, timeout_s, sources, json_prefix, regex,
                       csv_path, **named) -> ScriptConfig:
    """The :class:`ScriptConfig` of notebooks/script.ipynb's parameters: its named parameters
    (:data:`NAMED_PARAMETERS`) and ``args`` are the values the mapping and the command may use."""
    if unknown := sorted(set(named) - set(NAMED_PARAMETERS)):
        raise BadInputError(f"unknown parameters {unknown}: put the script's own values in args")
    if not isinstance(args, Mapping):
        raise BadInputError(f"args must be a mapping of the script's values, got {type(args).__name__}")
    if clash := sorted(set(args) & set(NAMED_PARAMETERS)):
        raise BadInputError(f"args repeats {clash}: set them as the notebook's own parameters")
    return ScriptConfig(command=command, arg_mappings=dict(arg_mappings or {}), values={**named, **args},
                        env=dict(env or {}), cwd=cwd, timeout_s=timeout_s, sources=tuple(sources),
                        json_prefix=json_prefix, regex=regex, csv_path=csv_path)


def check_params(params: Mapping[str, object]) -> None:
    """The value check of notebooks/script.ipynb (its metadata ``perfkit.check``), run from the
    notebook's folder as its kernel is: the command exists, the mapping names parameters, the
    regex compiles with named groups."""
    config_from_params(**dict(params))
