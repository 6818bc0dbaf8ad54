"""The shape of the code: no import cycles, short functions, one table of defaults, one version."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import gradio as gr

from dropmatch.decoding.acceptance import AUTO_AGREEMENT
from dropmatch.decoding.config import DEFAULTS, LAB_P, Settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dropmatch"
MAX_FUNCTION_LINES = 60


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere (top level, inside functions, TYPE_CHECKING)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in modules and module != name}


def test_the_package_has_no_import_cycle():
    """Every import among dropmatch's modules, wherever it is written, points one way."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imported_modules(path, set(paths)) for name, path in paths.items()}
    # A package's __init__ re-exporting its own modules is not a cycle of the code's layers.
    graph = {name: {m for m in deps if not (paths[m].name == "__init__.py" and name.startswith(m + "."))}
             for name, deps in graph.items()}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for dependency in sorted(graph[module]):
            if state.get(dependency) == "open":
                cycle = trail[trail.index(dependency):] + [dependency] if dependency in trail else [module, dependency]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if dependency not in state:
                visit(dependency, trail + [dependency])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_function_in_the_package_the_app_or_the_scripts_is_over_sixty_lines():
    sources = [ROOT / "app.py", *PACKAGE.rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    long = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 60 lines: " + "; ".join(long)


def test_app_py_is_only_the_top_level_a_space_needs():
    lines = (ROOT / "app.py").read_text().count("\n")
    assert lines < 150, f"app.py is {lines} lines; the UI belongs in dropmatch/ui/"


def test_the_package_version_is_the_project_version():
    import dropmatch

    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert dropmatch.__version__ == declared, f"dropmatch.__version__ {dropmatch.__version__} != pyproject {declared}"


def test_the_api_the_benchmark_and_the_controls_read_the_one_table_of_defaults():
    """/compare's signature, the benchmark's parser and the app's controls (run and rule lab) all
    start at config.DEFAULTS."""
    from dropmatch.bench import build_parser
    from dropmatch.ui.callbacks import settings_endpoint
    from dropmatch.decoding.acceptance import KNOBS
    from dropmatch.ui.layout import build_layout

    api = inspect.signature(settings_endpoint(lambda settings: iter([settings])))
    for name, parameter in api.parameters.items():
        expected = inspect.Parameter.empty if name == "prompt" else getattr(DEFAULTS, name)
        assert parameter.default == expected, f"/compare's {name} defaults to {parameter.default!r}, not {expected!r}"
    assert set(api.parameters) == set(Settings.names()), "the API's parameters are not Settings' fields"

    args = build_parser().parse_args(["--prompts", "x.jsonl"])
    for flag, name in (("max_new_tokens", "max_new_tokens"), ("gamma", "gamma"), ("draft_source", "draft_source"),
                       ("k", "k"), ("p", "p"), ("centroid", "centroid"), ("majority_fraction", "majority_fraction"),
                       ("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed")):
        assert getattr(args, flag) == getattr(DEFAULTS, name), f"bench --{flag} defaults to {getattr(args, flag)!r}"
    assert args.auto_agreement == AUTO_AGREEMENT

    with gr.Blocks():
        ui = build_layout()
    for name in ui.setting_names():
        if name == "prompt":
            continue
        value = ui.component(name).value
        assert value == getattr(DEFAULTS, name), f"the {name} control starts at {value!r}, not {getattr(DEFAULTS, name)!r}"
    lab = {name: LAB_P if name == "p" else knob.default for name, knob in KNOBS.items() if knob.lab}
    assert set(lab) >= {"num_paths", "p", "majority_fraction", "centroid", "fixed_js_threshold", "typical_eps"}
    for name, expected in lab.items():
        assert ui.lab_knobs[name].value == expected, f"the rule lab's {name} starts at {ui.lab_knobs[name].value!r}"


def test_scripts_and_tests_write_run_files_through_the_record_module_not_the_app():
    for path in [*(ROOT / "scripts").glob("*.py"), *(ROOT / "tests").glob("*.py")]:
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        assert "app.record_of" not in text and "app.RunRecord" not in text, f"{path.name} reaches into app.py"


def test_the_oracle_imports_no_decision_code_of_the_package():
    """tests/reference_rules.py decides from the definitions: of the package it imports data types only."""
    import ast

    allowed = {("dropmatch.decoding.acceptance", "Signals"), ("dropmatch.decoding.acceptance", "Verdict")}
    tree = ast.parse((Path(__file__).parent / "reference_rules.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(alias.name.startswith("dropmatch") for alias in node.names), "imports a package module"
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dropmatch"):
            names = {(node.module, alias.name) for alias in node.names}
            assert names <= allowed, f"the oracle imports {sorted(names - allowed)} from the package"


def test_the_method_package_imports_nothing_else_of_the_project():
    """dropmatch/decoding/ is taken whole by generate(), the vLLM plugin and the Hub folder: wherever an import
    is written (top level, inside a function, TYPE_CHECKING), it names a sibling (`from .x import`, `from . import
    x`), never a module of the project outside the package."""
    package = PACKAGE / "decoding"
    siblings = {path.stem for path in package.glob("*.py")}
    assert {"engine", "verifying", "acceptance", "hf_generate"} <= siblings
    stray = []
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                names = [node.module] if node.module else [alias.name for alias in node.names]
                if node.level != 1 or not set(names) <= siblings:
                    stray.append(f"{path.name}:{node.lineno} {'.' * node.level}{node.module or ''}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
                stray += [f"{path.name}:{node.lineno} {name}" for name in names if name.split(".")[0] == "dropmatch"]
    assert not stray, "the method package imports the project outside it: " + "; ".join(stray)
