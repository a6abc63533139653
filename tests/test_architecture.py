"""The package's shape: every module imports on its own, no import cycle, and
data flows one way (model -> QAT/training -> export -> validate -> profile ->
command line): no module imports a later stage, not even inside a function."""
from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Earlier stages first. A module may import its own stage and earlier ones;
# the longest matching prefix names a module's stage. The quantization-aware
# layer classes are layers a saved .keras model can contain (edgevit.saving
# loads them), so they and what they compute with sit with the other layers;
# the QAT rewrite and its registry, which training uses, come after them.
STAGES = [
    ("foundation", ("edgevit", "edgevit.errors", "edgevit.native_output", "edgevit.resample", "edgevit.registry",
                    "edgevit.saving", "edgevit.memory", "edgevit.data", "edgevit.layers", "edgevit.quantize",
                    "edgevit.models", "edgevit.converters")),
    ("training and QAT", ("edgevit.train", "edgevit.quantize.qat", "edgevit.quantize.registry",
                          "edgevit.quantize.graph_rewrites")),
    ("export", ("edgevit.litert", "edgevit.export")),
    ("validate", ("edgevit.evaluate", "edgevit.info")),
    ("profile", ("edgevit.profile",)),
    ("command line", ("edgevit.cli", "edgevit.__main__")),
]


def _package_roots() -> dict[str, Path]:
    """Dotted package name -> source folder, for edgevit and the packages
    installed inside it from elsewhere (edgevit.converters)."""
    roots = {}
    for name in ("edgevit", "edgevit.converters"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not importable"
        roots[name] = Path(list(spec.submodule_search_locations)[0])
    return roots


def _modules() -> dict[str, Path]:
    modules = {}
    roots = _package_roots()
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if any(name.startswith(other + ".") or name == other for other in roots if other != package
                   and other.startswith(package + ".")):
                continue  # a folder that belongs to the nested root
            modules[name] = path
    return modules


MODULES = _modules()


def _resolve(importer: str, node: ast.AST) -> list[str]:
    """The edgevit modules one import statement names."""
    is_package = MODULES[importer].name == "__init__.py"
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = importer.split(".")
            base = base[:len(base) - node.level + (1 if is_package else 0)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        names = [module] + [f"{module}.{alias.name}" for alias in node.names]
    found = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name.startswith("edgevit"):
            found.append(name)
    return found


def _imports(module: str, module_level_only: bool) -> set[str]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    found: set[str] = set()

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and not (module_level_only and inner):
                found.update(n for n in _resolve(module, child) if n != module)
            visit(child, inner)

    visit(tree, False)
    return found


def _stage(module: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(STAGES):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} belongs to no stage: add it to STAGES"
    return best


def test_module_list_covers_the_package():
    assert "edgevit.cli.output" in MODULES
    assert "edgevit.converters.api" in MODULES
    assert len(MODULES) > 60


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of ``graph`` (node -> the nodes it imports) meets."""
    cycles, state, stack = [], {}, []

    def dfs(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    return cycles


def test_no_import_cycle_among_modules():
    graph = {m: _imports(m, module_level_only=True) for m in MODULES}
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _room(module: str) -> str:
    """A package's modules share one room (they may import each other); a
    top-level module is a room of its own."""
    parts = module.split(".")
    if module.startswith("edgevit.converters"):
        return "edgevit.converters"
    return ".".join(parts[:2]) if len(parts) > 2 or MODULES[module].name == "__init__.py" else module


def test_no_import_cycle_between_rooms_even_through_imports_inside_functions():
    """A function-local import is still a dependency: a room that reaches
    back into one that imports it (litert's Arm64 and GPU runs into export/
    once did) is a cycle, whether or not Python notices at import time.
    The one exception: the registry builds models, and so imports the family
    modules, their weights and the loaders of both, inside create_model,
    while each family registers itself with it."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        lazy = set() if module != "edgevit.registry" else \
            _imports(module, module_level_only=False) - _imports(module, module_level_only=True)
        graph.setdefault(_room(module), set()).update(
            _room(t) for t in _imports(module, module_level_only=False) - lazy if _room(t) != _room(module))
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_a_later_stage():
    wrong = []
    for module in MODULES:
        for target in _imports(module, module_level_only=False):
            if _stage(target) > _stage(module):
                wrong.append(f"{module} ({STAGES[_stage(module)][0]}) imports {target} "
                             f"({STAGES[_stage(target)][0]})")
    assert not wrong, "\n".join(sorted(wrong))


MAX_MODULE_LINES = 600


def test_no_module_is_longer_than_a_newcomer_reads_in_one_sitting():
    """A module over MAX_MODULE_LINES holds more than one concern: split it
    along them (as quantize/ was) rather than raise the limit."""
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert not {name: lines for name, lines in lengths.items() if lines > MAX_MODULE_LINES}


@pytest.mark.parametrize("package", ["edgevit.litert", "edgevit.profile", "edgevit.quantize"])
def test_package_docstring_names_each_of_its_modules(package):
    """A newcomer finds a module from its package's map: the docstring names
    every module (as ``name``) with what it is for."""
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    modules = [name.rpartition(".")[2] for name in MODULES if name.rpartition(".")[0] == package]
    assert modules and not [m for m in modules if f"``{m}``" not in docstring]


def test_cli_output_helpers_import_nothing_else_from_edgevit():
    assert _imports("edgevit.cli.output", module_level_only=False) <= {"edgevit", "edgevit.errors"}


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """Each module is imported in its own freshly forked process from a parent
    that holds the third-party libraries but no edgevit module, so an import
    that works only after some other edgevit module was imported first (a
    partially initialised module, a hidden cycle) fails here."""
    script = textwrap.dedent("""
        import os, sys, traceback
        import numpy, click, rich, PIL, h5py, keras, tensorflow  # noqa: F401  (shared, not under test)
        assert not any(m == "edgevit" or m.startswith("edgevit.") for m in sys.modules)
        failed = []
        for name in sys.argv[1:]:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                try:
                    __import__(name)
                    code = 0
                except BaseException:
                    os.write(write, traceback.format_exc(limit=3).encode()[-2000:])
                    code = 1
                os._exit(code)
            os.close(write)
            message = os.read(read, 4000).decode(errors="replace")
            os.close(read)
            _, status = os.waitpid(pid, 0)
            if status != 0:
                failed.append(f"{name}: {message.strip().splitlines()[-1] if message.strip() else status}")
        print("\\n".join(failed))
        sys.exit(1 if failed else 0)
    """)
    names = [m for m in sorted(MODULES) if m != "edgevit.__main__"]  # __main__ runs the CLI
    proc = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"modules that fail to import alone:\n{proc.stdout}\n{proc.stderr[-3000:]}"


def _commands() -> list[str]:
    from edgevit.cli import main

    return sorted(main.commands)


@pytest.mark.parametrize("args", [["--help"], *([name, "--help"] for name in _commands()), ["list"],
                                  ["list", "--pretrained"], ["info", "mobilevit_v3_xs"], ["info", "vit_large16"]],
                         ids=" ".join)
def test_help_and_the_registry_answer_without_tensorflow(args):
    """Reading help, the model list and a model's facts answers at once: it
    imports neither TensorFlow nor Keras (seconds on a loaded host)."""
    code = ("import sys; from edgevit.cli import main\n"
            f"try:\n    main({args!r})\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False False"
