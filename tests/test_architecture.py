"""The architecture of ARCHITECTURE.md, kept true: which package of perfkit may import which.

Every ``.py`` under ``perfkit/`` is read with :mod:`ast`, never imported, so the check is fast,
has no side effects and sees imports inside functions too (many of perfkit's cross-package
imports are lazy, in function bodies). Each import is resolved to the module it lands in
(relative ``from ..x import y`` and absolute ``perfkit.x.y`` alike; ``from pkg import name`` lands
in ``pkg.name`` when that is a module) and checked against :data:`RULES`, the table of
ARCHITECTURE.md as data (:func:`test_rules_match_architecture_md` keeps the two equal).

Checked besides: every perfkit import and ``"perfkit.mod:function"`` launch target names
something that exists, in the package and in the notebooks, templates and benchmark scripts CI
does not import; analyses and plots never import torch; every package ``__init__.py`` opens by
saying what it may import; no module is over :data:`MAX_MODULE_LINES`; no package shadows a
public name; ARCHITECTURE.md stays under 200 lines and names only files that exist.

The functions take the package folder as a parameter (``violations(root)``, ...), so the tests
run them on a scratch copy with a deliberately broken import and watch it reported.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "perfkit"
ARCHITECTURE_MD = REPO / "ARCHITECTURE.md"

ANYTHING = "*"

#: Package (dotted, relative to ``perfkit``) -> what it may import besides itself. A module
#: belongs to the longest key that is a prefix of its name (``view.plots.gemm`` to
#: ``view.plots``, ``view.report`` to ``view``); ``__init__`` is ``perfkit/__init__.py`` alone.
#: An entry allows that module or package and everything under it, and nothing above it:
#: ``run.launch`` is the launcher, not ``run`` (its package ``__init__`` included).
RULES: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "analyse": frozenset({"core"}),
    "measuring": frozenset({"core", "analyse", "run.launch"}),
    "measuring.kernels": frozenset({"core", "analyse"}),
    "measuring.ops": frozenset({"core", "analyse", "measuring.kernels"}),
    "measuring.collectives": frozenset({"core", "analyse", "run.launch", "measuring.ops"}),
    "measuring.workloads": frozenset({"core"}),
    "measuring.training": frozenset({"core", "analyse", "run.launch", "measuring.workloads", "measuring.ops"}),
    "measuring.inference": frozenset({"core", "analyse", "measuring.kernels", "measuring.ops", "measuring.workloads"}),
    "measuring.data": frozenset({"core", "analyse", "measuring.workloads", "measuring.training"}),
    "measuring.script": frozenset({"core"}),
    "run": frozenset({"core"}),
    "ingest": frozenset({"core", "analyse"}),
    "view.plots": frozenset({"core", "analyse", "view.display"}),
    "view": frozenset({"core", "analyse", "run"}),
    "cli": frozenset({ANYTHING}),
    "__init__": frozenset({ANYTHING}),
}

#: Packages that never import these third-party packages themselves (any import, at any depth of
#: the module): an analysis never touches a device, a plot only draws DataFrames.
NEVER_IMPORT: dict[str, frozenset[str]] = {
    "analyse": frozenset({"torch"}),
    "view.plots": frozenset({"torch"}),
}

#: No module longer than this (lines). The issue asks for ~400; this leaves a little slack.
MAX_MODULE_LINES = 450


@dataclass(frozen=True)
class Import:
    """One perfkit import of one module, resolved."""

    path: Path  # the importing file
    line: int
    text: str  # the import as written (first line)
    target: str  # dotted module it lands in, e.g. "perfkit.run.launch"; "" when unresolved
    problem: str = ""  # why it could not be resolved


# --- reading the tree --------------------------------------------------------------------------

def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package folder ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _parse(text: str, filename: str) -> ast.Module:
    """A module's syntax tree, parsed once per content: every check here walks the same ~150
    files (and the copies the failure tests edit differ from them in one file), and parsing them
    anew for each check cost ~1 s of CPU a check. The trees are only read, never changed."""
    try:
        return _parse_text(text)
    except SyntaxError:
        return ast.parse(text, filename)  # the same error, naming the file


@functools.lru_cache(maxsize=None)
def _parse_text(text: str) -> ast.Module:
    return ast.parse(text)


def _defined_names(tree: ast.Module) -> set[str] | None:
    """Names bound at a module's top level (through if/try/with blocks); None: any name may exist."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        raise LookupError  # a star import: anything may be defined
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            for field in ("body", "orelse", "finalbody"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                visit(handler.body)

    try:
        visit(tree.body)
    except LookupError:
        return None
    return None if "__getattr__" in names else names


def _module_level(node: ast.AST):
    """The nodes run when the module is imported: through if/try/with, not into def or class."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield child
            yield from _module_level(child)


class _Tree:
    """The package's modules, their syntax trees, and import resolution against them."""

    def __init__(self, root: Path):
        self.root = root
        self.name = root.name
        self.modules = _modules(root)
        # folders with modules but no __init__.py (namespace packages; undocumented_packages() flags them)
        self.namespaces = {".".join([root.name, *d.relative_to(root).parts]) for d in root.rglob("*")
                           if d.is_dir() and any(d.glob("*.py")) and not (d / "__init__.py").exists()}
        self.texts = {mod: path.read_text() for mod, path in self.modules.items()}
        self.trees = {mod: _parse(self.texts[mod], str(path)) for mod, path in self.modules.items()}
        self._names: dict[str, set[str] | None] = {}
        self._imports: dict[tuple[str, bool], list[Import]] = {}

    def is_package(self, mod: str) -> bool:
        return self.modules[mod].name == "__init__.py"

    def defines(self, mod: str, name: str) -> bool:
        if mod not in self._names:
            self._names[mod] = _defined_names(self.trees[mod])
        names = self._names[mod]
        return names is None or name in names

    def imports(self, mod: str, *, top_level_only: bool = False) -> list[Import]:
        """Every import of a perfkit module in ``mod``, resolved: function bodies included, or
        only what runs at import time (``top_level_only``)."""
        key = (mod, top_level_only)
        if key in self._imports:
            return list(self._imports[key])  # a copy, as on the first call: the cache is never handed out
        path, tree = self.modules[mod], self.trees[mod]
        lines = self.texts[mod].splitlines()
        nodes = _module_level(tree) if top_level_only else ast.walk(tree)
        out = []
        for node in nodes:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            text = lines[node.lineno - 1].strip()
            for target, problem in self._resolve(mod, node):
                out.append(Import(path, node.lineno, text, target, problem))
        self._imports[key] = out
        return list(out)

    def _resolve(self, mod: str, node: ast.Import | ast.ImportFrom):
        """(target module, problem) per perfkit name the statement imports; foreign imports: none."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == self.name or alias.name.startswith(self.name + "."):
                    known = alias.name in self.modules or alias.name in self.namespaces
                    yield (alias.name, "") if known else ("", f"no module {alias.name}")
            return
        if node.level:
            package = mod if self.is_package(mod) else mod.rpartition(".")[0]
            parts = package.split(".")
            if node.level - 1 >= len(parts):
                yield "", "relative import beyond the top-level package"
                return
            base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if not (base == self.name or base.startswith(self.name + ".")):
            return
        if base not in self.modules and base not in self.namespaces:
            yield "", f"no module {base}"
            return
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in self.modules or sub in self.namespaces:
                yield sub, ""
            elif base in self.namespaces:
                yield "", f"no module {sub}"
            elif alias.name == "*" or self.defines(base, alias.name):
                yield base, ""
            else:
                yield "", f"{base} defines no {alias.name!r}"


# --- the rules ---------------------------------------------------------------------------------

def _rel(tree: _Tree, mod: str) -> str:
    """``perfkit.view.plots.gemm`` -> ``view.plots.gemm``; ``perfkit`` -> ``__init__``."""
    return mod[len(tree.name) + 1:] if mod != tree.name else "__init__"


def _under(name: str, entry: str) -> bool:
    return name == entry or name.startswith(entry + ".")


def owner(rel_module: str, rules: dict[str, frozenset[str]] = RULES) -> str | None:
    """The package of RULES a module (dotted, relative to perfkit) belongs to; None: no rule."""
    keys = [k for k in rules if _under(rel_module, k)]
    return max(keys, key=len) if keys else None


def _allowed(package: str, target_rel: str, rules: dict[str, frozenset[str]]) -> bool:
    allowed = rules[package]
    return ANYTHING in allowed or any(_under(target_rel, entry) for entry in {package, *allowed})


def _rule_text(package: str, rules: dict[str, frozenset[str]]) -> str:
    allowed = sorted(rules[package])
    return f"{package} may import {', '.join(allowed) if allowed else 'nothing outside itself'}"


def _show(tree: _Tree, path: Path) -> str:
    return f"{tree.root.name}/{path.relative_to(tree.root)}"


def violations(root: Path = PACKAGE, rules: dict[str, frozenset[str]] = RULES) -> list[str]:
    """Every import under ``root`` that breaks ``rules``, as ``file:line: import -> target (rule)``.

    Also reported: a module that belongs to no package of the rules, and an allowed import whose
    package ``__init__`` (run by Python before the module) imports what the importer may not,
    e.g. ``measuring`` importing ``run.launch`` while ``run/__init__.py`` imports the sweep engine.
    """
    tree = _Tree(root)
    found: list[str] = []
    for mod, path in tree.modules.items():
        package = owner(_rel(tree, mod), rules)
        if package is None:
            found.append(f"{_show(tree, path)}: belongs to no package of the rules "
                         f"({', '.join(rules)}): move it into one, or add its package to RULES "
                         "and ARCHITECTURE.md")
            continue
        for imp in tree.imports(mod):
            if not imp.target:
                continue  # reported by unresolved()
            target = _rel(tree, imp.target)
            where = f"{_show(tree, path)}:{imp.line}: `{imp.text}`"
            if not _allowed(package, target, rules):
                found.append(f"{where} imports {imp.target} ({_rule_text(package, rules)})")
                continue
            # The packages above the target run their __init__ first: what they import counts too.
            parts = imp.target.split(".")
            for depth in range(2, len(parts)):
                above = ".".join(parts[:depth])
                if _under(_rel(tree, above), package) or above not in tree.modules:
                    continue
                for inner in tree.imports(above, top_level_only=True):
                    if inner.target and not _allowed(package, _rel(tree, inner.target), rules):
                        found.append(
                            f"{where} imports {imp.target}, whose package {_show(tree, tree.modules[above])}"
                            f":{inner.line} imports {inner.target} ({_rule_text(package, rules)})")
    return list(dict.fromkeys(found))  # `from x import a, b` is one import of x


def foreign_imports(root: Path = PACKAGE, never: dict[str, frozenset[str]] = NEVER_IMPORT) -> list[str]:
    """Imports of third-party packages that ``never`` forbids a perfkit package (``torch`` in
    ``analyse``), as ``file:line: import (rule)``."""
    tree = _Tree(root)
    found = []
    for mod, path in tree.modules.items():
        keys = [k for k in never if _under(_rel(tree, mod), k)]
        banned = frozenset().union(*(never[k] for k in keys))
        lines = tree.texts[mod].splitlines()
        for node in ast.walk(tree.trees[mod]):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if name.split(".")[0] in banned:
                    found.append(f"{_show(tree, path)}:{node.lineno}: `{lines[node.lineno - 1].strip()}` "
                                 f"({' and '.join(keys)}: never import {name.split('.')[0]})")
    return found


def unresolved(root: Path = PACKAGE) -> list[str]:
    """perfkit imports that name no module or no name, and ``"perfkit.mod:function"`` targets.

    A function-level import of a moved module fails only when that function runs; this finds it
    without running anything. Launch targets (``launch("perfkit.x.y:fn", ...)``) and ``-m``
    module arguments are strings, so no import check sees them: they are resolved here too.
    """
    tree = _Tree(root)
    found = []
    for mod, path in tree.modules.items():
        for imp in tree.imports(mod):
            if imp.problem:
                found.append(f"{_show(tree, path)}:{imp.line}: `{imp.text}`: {imp.problem}")
        for node in ast.walk(tree.trees[mod]):
            for target, line in _module_strings(node, tree.name):
                module, _, function = target.partition(":")
                if module not in tree.modules:
                    found.append(f"{_show(tree, path)}:{line}: {target!r}: no module {module}")
                elif function and not tree.defines(module, function):
                    found.append(f"{_show(tree, path)}:{line}: {target!r}: {module} defines no {function!r}")
    return found


def _snippets(path: Path):
    """(first line, Python source) of each piece of Python in a file outside the package."""
    text = path.read_text()
    if path.suffix == ".py":
        yield 1, text
    elif path.suffix == ".ipynb":
        import json
        for cell in json.loads(text)["cells"]:
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                # IPython magics and shell escapes are not Python
                yield 0, "\n".join("" if line.lstrip()[:1] in "%!" else line for line in source.splitlines())
    elif path.suffix == ".sh":  # python heredocs: `"$PY" - <<'EOF'` ... `EOF`
        for match in re.finditer(r"<<'?(\w+)'?\n(.*?)\n\1\n", text, re.S):
            yield text[: match.start(2)].count("\n") + 1, match.group(2)


def unresolved_outside(repo: Path = REPO, root: Path = PACKAGE) -> list[str]:
    """perfkit imports (and ``-m perfkit.x`` modules) in notebooks, templates, benchmarks and
    scripts that name no module or name: code that CI does not import (a GPU node's script,
    a template) would otherwise keep an old path until someone runs it."""
    tree = _Tree(root)
    files = [*repo.glob("benchmarks/*.py"), *repo.glob("benchmarks/*.sh"), *repo.glob("notebooks/*.ipynb"),
             *repo.glob("templates/*.ipynb"), *repo.glob("tests/notebooks/*.ipynb"), repo / "conftest.py"]
    found = []
    for path in sorted(f for f in files if f.exists()):
        shown = path.relative_to(repo)
        for first, source in _snippets(path):
            try:
                code = ast.parse(source)
            except SyntaxError:
                continue  # not Python after all (a shell line in a notebook); nbval runs the cell
            for node in ast.walk(code):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                    line = source.splitlines()[node.lineno - 1].strip()
                    for _, problem in tree._resolve(tree.name, node):
                        if problem:
                            where = f"{shown}:{first + node.lineno - 1}" if first else f"{shown} (a cell)"
                            found.append(f"{where}: `{line}`: {problem}")
        for module in re.findall(rf"-m\s+({tree.name}(?:\.\w+)+)", path.read_text()):
            if module not in tree.modules:
                found.append(f"{shown}: `-m {module}`: no module {module}")
    return found


_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+:[A-Za-z_]\w*")


def _module_strings(node: ast.AST, package: str):
    """("perfkit.x:fn" or "perfkit.x", line) for launch targets and ``-m`` arguments in a node."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _TARGET.fullmatch(node.value):
        if node.value.startswith(package + "."):
            yield node.value, node.lineno
    if isinstance(node, (ast.List, ast.Tuple)):
        for flag, arg in zip(node.elts, node.elts[1:]):
            if (isinstance(flag, ast.Constant) and flag.value == "-m" and isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str) and arg.value.startswith(package + ".")):
                yield arg.value, arg.lineno


def _mentions(text: str, entry: str) -> bool:
    """``run.launch`` is mentioned as ``run.launch``, ``perfkit.run.launch`` or ``run/launch``."""
    pattern = r"[./]".join(re.escape(part) for part in entry.split("."))
    return re.search(rf"(?<![\w]){pattern}(?!\w)", text) is not None


def undocumented_packages(root: Path = PACKAGE, rules: dict[str, frozenset[str]] = RULES) -> list[str]:
    """Package ``__init__.py`` files (below the top level) whose docstring's opening (the summary
    line and the paragraph under it) does not say what the package may import: the word "import"
    and every package its rule allows."""
    tree = _Tree(root)
    found = [f"{root.name}/{Path(*ns.split('.')[1:])}/: modules but no __init__.py; add one that opens "
             "with one paragraph: what lives here and what it may import" for ns in sorted(tree.namespaces)]
    for mod in tree.modules:
        if mod == tree.name or not tree.is_package(mod):
            continue
        path = tree.modules[mod]
        package = owner(_rel(tree, mod), rules)
        doc = ast.get_docstring(tree.trees[mod]) or ""
        paragraphs = doc.strip().split("\n\n")
        # The opening: PEP 257's one-line summary and the paragraph under it (or one paragraph).
        first = "\n".join(paragraphs[:2] if "\n" not in paragraphs[0] else paragraphs[:1])
        if not first:
            found.append(f"{_show(tree, path)}: no docstring; open it with one paragraph: what lives "
                         "here and what it may import")
            continue
        if package is None:
            continue  # reported by violations()
        missing = [e for e in sorted(rules[package] - {ANYTHING}) if not _mentions(first, e)]
        if "import" not in first or missing:
            found.append(f"{_show(tree, path)}: the docstring's opening paragraph must say what the package "
                         f"may import ({_rule_text(package, rules)}); missing: "
                         f"{', '.join(missing) if missing else 'the word import'}")
    return found


def shadowed_public_names(root: Path = PACKAGE) -> list[str]:
    """Names in ``perfkit.__all__`` that are also a module or package of perfkit.

    ``import perfkit.measuring.kernels.gemm`` binds ``perfkit.measuring`` to the package: a package named
    like a public function (``perfkit.measure``) would replace that function for every caller.
    """
    tree = ast.parse((root / "__init__.py").read_text())
    public: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            public = list(ast.literal_eval(node.value))
    children = {p.stem for p in root.glob("*.py")} | {d.name for d in root.iterdir() if d.is_dir()}
    return sorted(set(public) & children)


def module_sizes(root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(lines, path) of every module, largest first."""
    sizes = [(len(p.read_text().splitlines()), str(p.relative_to(root.parent)))
             for p in _modules(root).values()]
    return sorted(sizes, reverse=True)


def rules_from_markdown(text: str) -> dict[str, frozenset[str]]:
    """The ``| package | may import (besides itself) |`` table of ARCHITECTURE.md, as RULES."""
    rules: dict[str, frozenset[str]] = {}
    in_table = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if len(cells) == 2 and cells[0] == "package" and cells[1].startswith("may import"):
            in_table = True
            continue
        if not in_table:
            continue
        if not cells:
            break
        if set(cells[0]) <= set("-: "):
            continue
        names = re.findall(r"`([^`]+)`", cells[1])
        if cells[1].strip().lower().startswith("anything"):
            names = [ANYTHING]
        elif cells[1].strip().lower().startswith("nothing"):
            names = []
        rules[cells[0].strip("`")] = frozenset(names)
    return rules


def cycles(root: Path = PACKAGE) -> list[list[str]]:
    """Every circle of imports between modules (each strongly connected set of two or more, by
    Tarjan's algorithm), counting every import: in function bodies and under ``TYPE_CHECKING``
    too, since a circle there is still two modules that each need the other. The top-level
    package (``perfkit/__init__.py``, the public surface) is left out: it imports anything."""
    tree = _Tree(root)
    graph = {m: sorted({i.target for i in tree.imports(m) if i.target not in ("", m, tree.name)})
             for m in tree.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in graph:  # iterative Tarjan: no recursion limit on a deep import chain
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return sorted(found)


# --- tests -------------------------------------------------------------------------------------

def test_packages_import_only_what_architecture_md_allows():
    found = violations(PACKAGE)
    assert not found, "imports against ARCHITECTURE.md's rules:\n" + "\n".join(found)


def test_no_two_modules_import_each_other():
    found = cycles(PACKAGE)
    assert not found, "circles of imports (break each at its lowest module):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_analyses_and_plots_never_import_torch():
    found = foreign_imports(PACKAGE)
    assert not found, "\n".join(found)


def test_every_perfkit_import_and_launch_target_resolves():
    found = unresolved(PACKAGE)
    assert not found, "imports or launch targets that name nothing:\n" + "\n".join(found)


#: What a rank never imports: every rank of every launch starts a fresh interpreter, and pandas
#: with pyarrow cost ~0.4 s of CPU there (123 ranks in a run of the suite), the plotting stack more.
RANK_NEVER_LOADS = ("pandas", "pyarrow", "holoviews", "bokeh", "panel", "matplotlib")


def launch_targets(root: Path = PACKAGE) -> list[str]:
    """The modules of the package's ``"perfkit.x:fn"`` launch targets, sorted."""
    tree = _Tree(root)
    return sorted({target.partition(":")[0] for mod in tree.modules for node in ast.walk(tree.trees[mod])
                   for target, _ in _module_strings(node, tree.name) if ":" in target})


def test_a_rank_loads_neither_pandas_nor_the_plotting_stack():
    import subprocess
    import sys

    targets = launch_targets()
    assert "perfkit.measuring.training.step" in targets and "perfkit.measuring.collectives.benchmark" in targets
    probe = (f"import sys, importlib\nfor m in {['perfkit.run._rank_entry', *targets]!r}: importlib.import_module(m)\n"
             f"print(' '.join(m for m in {RANK_NEVER_LOADS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert not out.stdout.split(), (f"importing the launch targets {targets} loads {out.stdout.split()}: import "
                                    "them inside the functions that build DataFrames or plots, not at module level")


def test_notebooks_templates_and_benchmarks_use_paths_that_exist():
    found = unresolved_outside(REPO, PACKAGE)
    assert not found, "stale perfkit import paths outside the package:\n" + "\n".join(found)


def test_every_package_init_says_what_it_may_import():
    found = undocumented_packages(PACKAGE)
    assert not found, "\n".join(found)


def test_no_module_is_over_the_size_limit():
    sizes = module_sizes(PACKAGE)
    over = [f"{n} {p}" for n, p in sizes if n > MAX_MODULE_LINES]
    largest = "\n".join(f"  {n:4d} {p}" for n, p in sizes[:5])
    assert not over, (f"modules over {MAX_MODULE_LINES} lines (a module that long usually holds two "
                      f"roles: split it): {', '.join(over)}\nlargest five:\n{largest}")


def test_rules_match_architecture_md():
    documented = rules_from_markdown(ARCHITECTURE_MD.read_text())
    assert documented, "ARCHITECTURE.md has no `| package | may import (besides itself) |` table"
    assert documented == RULES, (
        "ARCHITECTURE.md's import table and RULES differ: change both together\n"
        f"  only in ARCHITECTURE.md: { {k: sorted(v) for k, v in documented.items() if RULES.get(k) != v} }\n"
        f"  only in RULES:           { {k: sorted(v) for k, v in RULES.items() if documented.get(k) != v} }")


def test_architecture_md_describes_every_package_and_names_only_files_that_exist():
    text = ARCHITECTURE_MD.read_text()
    lines = len(text.splitlines())
    assert lines <= 200, f"ARCHITECTURE.md has {lines} lines: it is a map, not a manual; keep it to 200"
    packages = sorted(d.name for d in PACKAGE.iterdir() if d.is_dir() and any(d.glob("*.py")))
    missing = [p for p in packages if f"`{p}/`" not in text]
    assert not missing, f"packages ARCHITECTURE.md's codemap does not describe (as `name/`): {missing}"
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.(?:py|cpp|sh))`", text))
    stale = sorted(n for n in named if not (REPO / n).exists() and not (PACKAGE / n).exists())
    assert not stale, f"files ARCHITECTURE.md names that do not exist (paths from the repo or perfkit/): {stale}"


def test_no_subpackage_shadows_a_public_name():
    clash = shadowed_public_names(PACKAGE)
    assert not clash, (f"perfkit.{clash[0]} is both a public name (perfkit.__all__) and a module: importing "
                       f"perfkit.{clash[0]}.x would replace the public {clash[0]} for every caller; rename it")


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / PACKAGE.name
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
    return copy


def test_a_forbidden_import_is_reported(tmp_path):
    copy = _copy(tmp_path)
    victim = sorted(p for p in (copy / "analyse").glob("*.py") if p.name != "__init__.py")[0]
    before = set(violations(copy))
    lines = victim.read_text().splitlines()
    lines.append("from perfkit.measuring.training import step  # deliberately forbidden")
    victim.write_text("\n".join(lines) + "\n")
    new = sorted(set(violations(copy)) - before)
    assert len(new) == 1, new
    assert new[0].startswith(f"perfkit/analyse/{victim.name}:{len(lines)}: ")
    assert "perfkit.measuring.training.step" in new[0] and "analyse may import core" in new[0]


def test_a_circle_is_reported_even_when_only_a_type_annotation_needs_it(tmp_path):
    copy = _copy(tmp_path)
    assert cycles(copy) == []
    models = copy / "measuring" / "workloads" / "models.py"
    models.write_text(models.read_text() + "\nif TYPE_CHECKING:\n    from perfkit.measuring.workloads.synthetic import Workload\n")
    assert cycles(copy) == [["perfkit.measuring.workloads.models", "perfkit.measuring.workloads.synthetic"]]


def test_a_relative_function_level_import_and_a_package_init_are_followed(tmp_path):
    copy = _copy(tmp_path)
    before = set(violations(copy))
    # A lazy relative import inside a function, from a plot module into the run package...
    plot = sorted(p for p in (copy / "view" / "plots").glob("*.py") if p.name != "__init__.py")[0]
    plot.write_text(plot.read_text() + "\n\ndef _lazy():\n    from ...run import notebooks\n")
    # ...and run/__init__.py pulling the sweep engine in front of the launcher measuring may use.
    init = copy / "run" / "__init__.py"
    init.write_text((init.read_text() if init.exists() else '"""run."""\n') + "from .sweep import engine\n")
    new = sorted(set(violations(copy)) - before)
    assert any(v.startswith(f"perfkit/view/plots/{plot.name}:") and "perfkit.run.notebooks" in v
               and "view.plots may import" in v for v in new), new
    assert any("perfkit/run/__init__.py:" in v and "perfkit.run.sweep.engine" in v
               and re.search(r"measuring(\.\w+)? may import", v) for v in new), new


def test_stale_imports_and_launch_targets_are_reported(tmp_path):
    copy = _copy(tmp_path)
    before = set(unresolved(copy))
    victim = copy / "run" / "launch.py"
    victim.write_text(victim.read_text() + '\n\ndef _stale():\n    from perfkit.training import train_rank\n'
                      '    return "perfkit.measuring.training.step:no_such_rank"\n')
    new = sorted(set(unresolved(copy)) - before)
    assert len(new) == 2, new
    assert "no module perfkit.training" in new[0] and "defines no 'no_such_rank'" in new[1]


def test_stale_paths_in_scripts_and_notebooks_are_reported(tmp_path):
    import json
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "benchmarks" / "check.sh").write_text(
        'step() {\n  "$PY" -m perfkit.cli env\n  "$PY" -m perfkit.gemm\n  "$PY" - <<\'EOF\'\nimport json\n'
        'from perfkit.training import TrainConfig\nEOF\n}\n')
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
            "source": ["%matplotlib inline\n", "from perfkit.core.timing import measure, no_such_name\n"]}
    (tmp_path / "notebooks" / "x.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {},
                                                                "nbformat": 4, "nbformat_minor": 5}))
    found = unresolved_outside(tmp_path, PACKAGE)
    assert found == [
        "benchmarks/check.sh:6: `from perfkit.training import TrainConfig`: no module perfkit.training",
        "benchmarks/check.sh: `-m perfkit.gemm`: no module perfkit.gemm",
        "notebooks/x.ipynb (a cell): `from perfkit.core.timing import measure, no_such_name`: "
        "perfkit.core.timing defines no 'no_such_name'",
    ], found
