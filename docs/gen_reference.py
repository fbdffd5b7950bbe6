"""Write docs/reference/*.md from the code, so the references cannot drift from it: the command
line (each subcommand's argparse help), each notebook's parameters (its `parameters` cell), the
row columns and their units (the unit rules of `perfkit.core.results`, and the columns of a real
results folder), and the glossary (`perfkit.core.glossary`).

    python docs/gen_reference.py [--out docs/reference] [--rows DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def cli_page() -> str:
    from perfkit.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = ["# Command line", "", "Every `perfkit` command and its `--help`, generated from the parser.", ""]
    for name, p in sub.choices.items():
        out += [f"## perfkit {name}", "", "```text", p.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def notebooks_page() -> str:
    from perfkit.run.notebooks import read_notebook

    out = ["# Notebook parameters", "", "Each notebook's `parameters` cell: the names `-p NAME VALUE` and a "
           "sweep's grid take, their defaults and what they mean.", ""]
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        spec = read_notebook(path)
        out += [f"## {path.name}", "", "| parameter | default | type | meaning |", "|---|---|---|---|"]
        for p in spec.parameters.values():
            cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
            out.append(f"| `{p.name}` | `{cell(p.source)}` | {p.type_name} | {cell(p.comment)} |")
        out.append("")
    return "\n".join(out)


def columns_page(rows_dir: Path | None) -> str:
    from perfkit.core.results import _UNIT_SUFFIXES, load, unit_of

    out = ["# Row columns and units", "", "A column's name ends in its unit, and holds SI base units; the "
           "unit is also in the Parquet metadata (`df.attrs[\"units\"]`). The rules, longest suffix first:", "",
           "| name ends in | unit |", "|---|---|"]
    out += [f"| `{suffix}` | {unit} |" for suffix, unit in _UNIT_SUFFIXES]
    out += ["", "Every row also carries `config_id`, `status`, `reason`, its configuration's parameters "
            "(`param_names` lists them) and the environment fingerprint (`env_*`, whole as `env_json`).", ""]
    if rows_dir is not None and rows_dir.is_dir():
        df = load(rows_dir)
        out += [f"The columns of each workload, as the rows of `{rows_dir.name}` hold them:", ""]
        for workload, rows in df.groupby("workload"):
            cols = [c for c in rows.columns if rows[c].notna().any() and not str(c).startswith("env_")]
            out += [f"## {workload}", "", "| column | unit |", "|---|---|"]
            out += [f"| `{c}` | {unit_of(str(c)) or ''} |" for c in sorted(map(str, cols))]
            out.append("")
    return "\n".join(out)


def glossary_page() -> str:
    from perfkit.core.glossary import GLOSSARY

    out = ["# Glossary", ""]
    for term in sorted(GLOSSARY, key=str.lower):
        out += [f"**{term}**", f": {GLOSSARY[term]}", ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reference")
    parser.add_argument("--rows", type=Path, default=REPO.parent / "shared" / "reference" / "gpu-h200",
                        help="a results folder whose columns the columns page lists (default: the H200 reference)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in (("cli.md", cli_page()), ("notebooks.md", notebooks_page()),
                       ("columns.md", columns_page(args.rows)), ("glossary.md", glossary_page())):
        (args.out / name).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
