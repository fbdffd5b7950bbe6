"""Imported outputs into a results directory, beside sweeps' rows: ``perfkit import KIND PATH...``.

Each imported file becomes one results file, ``DIR/results/import-<kind>-<sha256[:16]>.parquet``,
named by the file's digest: importing the same file again adds nothing, and a changed file is a
new import. Every row carries ``source`` (the kind), ``source_path`` and ``source_sha256``; its
fingerprint describes the run the file recorded (its devices, hosts and library version), not
the machine that imported it. All files are read before any is written: one bad file (exit 2)
leaves the directory as it was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfkit.core.errors import BadInputError

__all__ = ["KINDS", "ImportResult", "import_files"]


def _nccl_tests(text: str, source: str, options: dict):
    from perfkit.ingest.nccl_tests import parse

    return parse(text, source=source, **options)


def _vllm_bench(text: str, source: str, options: dict):
    from perfkit.ingest.vllm_bench import parse

    return parse(text, source=source, **options)


def _mlperf(text: str, source: str, options: dict):
    from perfkit.ingest.mlperf import parse

    return parse(text, source=source, **options)


def _mad(text: str, source: str, options: dict):
    from perfkit.ingest.mad import parse

    return parse(text, source=source, **options)


#: What ``perfkit import`` reads: kind -> reader(text, source name, options) -> ParsedRun.
KINDS: dict[str, Callable] = {"nccl-tests": _nccl_tests, "vllm-bench": _vllm_bench, "mlperf": _mlperf, "mad": _mad}
#: A folder named for a kind stands for these files in it (``vllm bench sweep``'s runs; its
#: summary.json repeats them).
_FOLDER_FILES = {"vllm-bench": "run=*.json"}


@dataclass
class ImportResult:
    added: list[tuple[str, int]] = field(default_factory=list)
    """(file, rows) for each file imported now."""
    unchanged: list[str] = field(default_factory=list)
    """Files already imported into the directory (by digest): nothing added."""
    failed_runs: list[str] = field(default_factory=list)
    """One line per run of a several-run file that failed before its table (its rows are absent)."""


def _results_path(out_dir: Path, kind: str, digest: str) -> Path:
    return out_dir / "results" / f"import-{kind}-{digest[:16]}.parquet"


def import_files(kind: str, paths: Sequence[str | Path], out_dir: str | Path, **options) -> ImportResult:
    """Read every file of ``paths`` as ``kind`` (:data:`KINDS`), then write each one's rows into
    ``out_dir`` (module docstring). ``options`` go to the reader (nccl-tests: ``op``,
    ``world_size``, ``partial``)."""
    import pandas as pd

    from perfkit.core import env
    from perfkit.core.results import write_rows

    if kind not in KINDS:
        raise BadInputError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    if not paths:
        raise BadInputError("name at least one file to import")
    out_dir = Path(out_dir)
    files = []
    for path in map(Path, paths):
        if path.is_dir() and kind in _FOLDER_FILES:
            found = sorted(path.rglob(_FOLDER_FILES[kind]))
            if not found:
                raise BadInputError(f"{path}: a folder without {_FOLDER_FILES[kind]} files")
            files += found
        else:
            files.append(path)
    parsed = []
    for path in files:
        if path.is_dir():
            raise BadInputError(f"{path} is a folder: name the {kind} output files in it")
        if not path.is_file():
            raise BadInputError(f"{path}: no such file")
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadInputError(f"{path}: not text ({err})") from None
        digest = hashlib.sha256(data).hexdigest()
        try:
            parsed.append((path, digest, KINDS[kind](text, path.name, options)))
        except BadInputError:
            raise
        except Exception as error:  # noqa: BLE001 - a reader's own bug or an input it did not foresee: one line
            what = str(error).splitlines()[0][:200] if str(error) else ""
            raise BadInputError(f"{path}: not readable as {kind} output ({type(error).__name__}: {what}); "
                                "if it is, please report it with the file") from error
    done = ImportResult()
    now = pd.Timestamp.now(tz="UTC")
    for path, digest, run in parsed:
        target = _results_path(out_dir, kind, digest)
        if target.exists():
            done.unchanged.append(str(path))
            continue
        # A file of several runs: each run's rows with its own facts (tool version, library, hosts).
        frame = pd.concat([pd.DataFrame(part.rows).assign(
            source_tool_version=part.facts.get("tool_version"), backend=part.facts.get("backend"),
            **env.flat_columns({**part.facts, "source": kind})) for part in (run.parts or [run]) if part.rows],
            ignore_index=True)
        done.failed_runs += [f"{path}: {part.reason}" for part in run.parts if not part.rows and part.reason]
        frame.insert(0, "config_id", target.stem)
        frame = frame.assign(source=kind, source_path=str(path.resolve()), source_sha256=digest,
                             param_names=json.dumps([]), notebook=None, recorded_at=now)
        write_rows(frame, target)
        done.added.append((str(path), len(frame)))
    return done
