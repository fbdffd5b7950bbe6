"""The documentation: the site builds with no warning, its generated references match the code,
the README stays a front page, and every ```sh example in docs/ runs as written.

A ```sh block is a promise that the commands work from the repository root (with ../shared beside
it); a ```bash block is shown, not run, and the line above it says why (`<!-- not run: reason -->`:
it needs a cluster, a GPU, the user's own files or minutes).
A number in a block's `# ...` comment lines (e.g. "58.78 ms") is a claim about the output: it must
appear in what the block prints, so the docs cannot drift from the code's numbers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SHARED = REPO.parent / "shared"

_BLOCK = re.compile(r"^(?P<indent> *)```(?P<lang>\w+)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
_DECIMAL = re.compile(r"\b\d+\.\d+\b")


def _blocks(lang: str) -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for m in _BLOCK.finditer(page.read_text(encoding="utf-8")):
            if m["lang"] == lang:
                body = "\n".join(line[len(m["indent"]):] for line in m["body"].splitlines())
                found.append((f"{page.name}:{page.read_text(encoding='utf-8')[:m.start()].count(chr(10)) + 1}", body))
    return found


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


@pytest.mark.slow
def test_the_site_builds_strictly_with_references_generated_from_the_code(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is a dev extra (make installs it)")
    pytest.importorskip("material", reason="mkdocs-material is a dev extra (make installs it)")
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("reference"))
    subprocess.run([sys.executable, str(DOCS / "gen_reference.py"), "--out", str(docs / "reference")],
                   check=True, env=_env(), cwd=REPO)
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8").replace("site_dir: build/site", "site_dir: site")
    (tmp_path / "mkdocs.yml").write_text(config, encoding="utf-8")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    assert not re.search(r"^WARNING", built.stderr, re.M), built.stderr[-3000:]

    # the generated references hold the code's own words: every subcommand, every notebook, every
    # glossary term
    from perfkit.cli import build_parser
    from perfkit.core.glossary import GLOSSARY

    cli = (docs / "reference" / "cli.md").read_text(encoding="utf-8")
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert all(f"## perfkit {name}" in cli for name in sub.choices)
    notebooks = (docs / "reference" / "notebooks.md").read_text(encoding="utf-8")
    assert all(f"## {p.name}" in notebooks for p in (REPO / "notebooks").glob("*.ipynb"))
    glossary = (docs / "reference" / "glossary.md").read_text(encoding="utf-8")
    assert all(f"**{term}**" in glossary for term in GLOSSARY)
    for page in ("cli", "notebooks", "columns", "glossary"):
        assert (tmp_path / "site" / "reference" / page / "index.html").is_file()


def test_the_readme_is_a_front_page_whose_links_resolve():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150, "the README is the front page: details belong in docs/"
    quickstart = re.search(r"```(?:bash|sh)\n(.*?)```", readme, re.S)
    assert quickstart is not None
    commands = [line.split("#")[0].strip() for line in quickstart[1].splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"], "the quickstart is exactly two commands"
    generated = {f"docs/reference/{page}.md" for page in ("cli", "notebooks", "columns", "glossary")}
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target and target not in generated:  # those make docs writes (git ignores them)
            assert (REPO / target).exists(), f"README links to {target}, which does not exist"
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        assert page.name in nav, f"docs/{page.name} is not in mkdocs.yml's nav"


def test_every_glossary_term_is_defined_in_words():
    from perfkit.core.glossary import GLOSSARY

    assert len(GLOSSARY) >= 20
    for term, meaning in GLOSSARY.items():
        assert len(meaning.split()) >= 6, f"{term!r} is defined in too few words: {meaning!r}"


_SH = _blocks("sh")


@pytest.mark.slow
@pytest.mark.parametrize("where,body", _SH, ids=[w for w, _ in _SH])
def test_every_sh_example_in_the_docs_runs_as_written(where, body, tmp_path):
    if not (SHARED / "reference").is_dir() and "../shared" in body:
        pytest.skip(f"{where} reads ../shared/reference, which is absent here")
    # a checkout-like folder: the example's relative paths (notebooks/, templates/, ../shared)
    # resolve, and what it writes (runs/...) lands in tmp
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("notebooks", "templates"):
        (work / name).symlink_to(REPO / name)
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=work, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, f"{where} failed:\n{body}\n--- stderr ---\n{ran.stderr[-3000:]}"
    claims = [n for line in body.splitlines() if line.lstrip().startswith("#") for n in _DECIMAL.findall(line)]
    missing = [n for n in claims if n not in ran.stdout]
    assert not missing, f"{where}: its comments promise {missing}, which the output does not show"


def test_every_shell_example_runs_or_says_why_not():
    assert len(_SH) >= 6, "the docs' ```sh examples are the ones tests run; keep some"
    unexplained = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            if m["lang"] == "bash":
                before = text[:m.start()].rstrip().splitlines()
                if not (before and re.fullmatch(r"\s*<!-- not run: .{10,} -->", before[-1])):
                    unexplained.append(f"{page.name}:{text[:m.start()].count(chr(10)) + 1}")
    assert not unexplained, ("a ```bash block is shown, not run: say why on the line above it "
                             f"(<!-- not run: reason -->), or make it ```sh so the suite runs it: {unexplained}")
