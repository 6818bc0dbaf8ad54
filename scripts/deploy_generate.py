"""Stage DropMatch's `generate(custom_generate=...)` repository, upload it to the Hugging Face Hub, or list it.

    python scripts/deploy_generate.py --dry-run
    python scripts/deploy_generate.py --stage DIR                # write it into DIR, to read or to load
    python scripts/deploy_generate.py --repo you/dropmatch --source URL   # HF_TOKEN (write) or `hf auth login`
    python scripts/deploy_generate.py --docs                     # rewrite docs/generate.md's rule table

The repository stands alone: `custom_generate/` holds generate.py and the decoding core it needs (settings,
rules, masks, verify, drafting, the engine, the transformers adapter), each module written at stage time
from the package's own file, a requirements.txt that names torch and transformers only (transformers
within the tested range), and the LICENSE. The model card (README.md) is custom_generate/card.md, written
for a Hub reader, with docs/generate.md's argument tables: the rules a Hub user can run (no trained judge
ships there) derived from the rule table (acceptance.RULES and their Knobs) at that moment, as `--docs`
writes the full table into the guide.

The core is found, not listed: the module-level imports of dropmatch.hf_generate, followed. transformers'
loader copies (and from the Hub downloads) the modules named in `from .module import` lines beside
generate.py, one folder deep, so every module goes in one folder and every relative import is rewritten
to name its module there (`from ..config import` becomes `from .config import`): nothing else of a module
changes. Staging refuses a core that imports anything but the standard library, torch and transformers
(and numpy, which transformers requires).
"""

from __future__ import annotations

import argparse
import ast
import re
import string
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "dropmatch.hf_generate"  # the module whose `generate` transformers calls
FOLDER = "custom_generate"
# One specifier a line: transformers' loader checks each line, reading only the first specifier of a line.
# The upper bound: the first release not tested (TESTED); a later one is refused at load, in one line.
REQUIREMENTS = ("torch>=2.6", "transformers>=5.20", "transformers<5.26")  # never a pin that replaces a user's torch
TESTED = {"transformers": ("5.20.0", "5.23.0", "5.25.0"), "torch": ("2.13.0",)}  # what the staged folder ran on
ALLOWED = {"torch", "transformers", "numpy"}  # besides the standard library (numpy: transformers requires it)
# Imports inside a core function that reach the Studio on purpose, never called by generate(): (module,
# what it imports) -> why. They are not staged; a test holds generate() to working without them.
STUDIO_DOORS = {("dropmatch.pair_services", "dropmatch.lab"): "PairServices.rule_lab, the Studio's rule lab"}
CARD = Path(FOLDER) / "card.md"  # the model card's text, its $-placeholders filled by model_card()
HUB_REPO = "owner/dropmatch"  # the card's repository until --repo names it
IMPORT_FROM = re.compile(r"from\s+(\.+[\w.]*)\s+import")
GUIDE = Path("docs") / "generate.md"
TABLE_START = "<!-- rules and knobs: written from the rule table by `python scripts/deploy_generate.py --docs` -->"
TABLE_END = "<!-- end of the rule table -->"


@dataclass(frozen=True)
class Relative:
    """One relative import of a module: the statement, the modules it reaches (dotted names) and
    whether it runs inside a function (lazy) rather than when the module loads."""

    node: ast.ImportFrom
    targets: tuple[str, ...]
    lazy: bool


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of a dotted module name (a package's __init__.py), None when there is none."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def relative_imports(name: str, root: Path = ROOT) -> list[Relative]:
    """Every relative import of module `name`, with the modules each reaches."""
    path = module_file(name, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node, lazy in _import_froms(ast.parse(path.read_text(encoding="utf-8"))):
        if not node.level:
            continue
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        submodules = [f"{base}.{alias.name}" for alias in node.names if module_file(f"{base}.{alias.name}", root)]
        found.append(Relative(node, tuple(submodules) if submodules else (base,), lazy))
    return found


def _import_froms(tree: ast.AST, lazy: bool = False):
    """(ImportFrom node, whether it sits inside a function) for every `from ... import` of a tree."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.ImportFrom):
            yield child, lazy
        inside = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _import_froms(child, inside)


def core_modules(entry: str = ENTRY, root: Path = ROOT) -> list[str]:
    """The decoding core: `entry` and every module its module-level relative imports reach, followed
    (sorted dotted names). A lazy import must reach the core too, or be one of STUDIO_DOORS."""
    found, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        todo += [target for rel in relative_imports(name, root) if not rel.lazy for target in rel.targets]
    for name in found:
        for rel in relative_imports(name, root):
            stray = [t for t in rel.targets if t not in found and (name, t) not in STUDIO_DOORS]
            if rel.lazy and stray:
                raise ValueError(f"{name} imports {stray[0]} inside a function: stage it or name it in STUDIO_DOORS")
    return sorted(found)


def flat_name(name: str) -> str:
    """A module's file name in the staged folder: the last part of its dotted name."""
    return name.rpartition(".")[2]


def absolute_imports(source: str) -> set[str]:
    """The top-level names of every absolute import in a module, wherever it is written (transformers'
    loader checks them all)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module.split(".")[0])
    return names


def flattened(name: str, root: Path = ROOT) -> str:
    """Module `name`'s source with each relative import naming its module in the one staged folder;
    every other character as in the package. ValueError for an import the folder cannot express."""
    lines = module_file(name, root).read_text(encoding="utf-8").splitlines(keepends=True)
    for rel in relative_imports(name, root):
        node = rel.node
        if node.module is not None and len(rel.targets) == 1 and rel.targets[0].endswith("." + node.module.split(".")[-1]):
            spec = "." + flat_name(rel.targets[0])  # from ..config import X -> from .config import X
        elif node.module is None and all(flat_name(t) == alias.name for t, alias in zip(rel.targets, node.names)):
            spec = "."  # from . import acceptance, mc_head: siblings already
        else:
            raise ValueError(f"{name} line {node.lineno}: a relative import the flat folder cannot express")
        line = lines[node.lineno - 1]
        match = IMPORT_FROM.match(line, node.col_offset)
        lines[node.lineno - 1] = line[: match.start(1)] + spec + line[match.end(1):]
    return "".join(lines)


def header(name: str, root: Path = ROOT) -> str:
    """The comment a staged module starts with: where it came from."""
    source = module_file(name, root).relative_to(root).as_posix()
    return (f"# Generated by scripts/deploy_generate.py from DropMatch Studio's {source}: edit that file and\n"
            "# stage again, never this one.\n")


def generate_module(modules: list[str]) -> str:
    """custom_generate/generate.py: `generate` from the entry module, and one `from .module import` line per
    staged module (transformers' loader follows only such lines; `from . import x` escapes it)."""
    named = "\n".join(f"from .{flat_name(m)} import __name__ as _  # noqa: E402,F401" for m in modules
                      if m != ENTRY)
    return (f'''"""DropMatch for transformers' `generate(custom_generate=...)`: what transformers loads from this
repository with trust_remote_code=True. It needs torch and transformers only.

    out = target.generate(**inputs, assistant_model=draft, custom_generate="owner/dropmatch",
                          trust_remote_code=True, max_new_tokens=64, dropmatch_rule="dropmatch", dropmatch_p=0.3)

Generated by scripts/deploy_generate.py from DropMatch Studio's package; the modules beside it are the
package's own, each relative import naming its module in this folder.
"""

from .{flat_name(ENTRY)} import generate

# Every module of this folder, so that transformers' loader copies (from the Hub: downloads) each one.
{named}

__all__ = ["generate"]
''')


def staged_modules(root: Path = ROOT) -> dict[str, str]:
    """{file name in custom_generate/: text}: generate.py, the core's modules, requirements.txt.
    ValueError when two modules would share a file name or a module imports beyond ALLOWED."""
    modules = core_modules(root=root)
    files: dict[str, str] = {}
    for name in modules:
        text = flattened(name, root)
        outside = sorted(n for n in absolute_imports(text) if n not in ALLOWED and n not in sys.stdlib_module_names)
        if outside:
            raise ValueError(f"{name} imports {outside[0]}: the decoding core needs torch and transformers only")
        file = f"{flat_name(name)}.py"
        if file in files or file == "generate.py":
            raise ValueError(f"{name}: a second module named {file} in the one staged folder")
        files[file] = header(name, root) + text
    files["generate.py"] = generate_module(modules)
    files["requirements.txt"] = "".join(line + "\n" for line in REQUIREMENTS)
    return files


def rule_table(root: Path = ROOT, hub: bool = False) -> str:
    """The markdown table of dropmatch_rule and every knob generate() accepts, from the rule table: each
    rule's label and modes, each knob's key, the rules that read it, generate()'s default and its help.
    hub: without the rules that need a trained judge (none ships on the Hub) and the knobs only they read."""
    sys.path.insert(0, str(root))
    try:
        from dropmatch.acceptance import KNOBS, RULES
        from dropmatch.hf_generate import PREFIX, default_rule
        from dropmatch.rule_words import KNOB_HELP
    finally:
        sys.path.remove(str(root))
    default = default_rule()
    runnable = [rule for rule in RULES.values() if not (hub and rule.uses_judge)]
    rules = "; ".join(f"`{rule.name}`: {rule.label}{_rule_note(rule)}" for rule in runnable)
    lines = ["| argument | default | meaning | read by |", "|---|---|---|---|",
             f"| `{PREFIX}rule` | `{default.rule}` | {rules} | |"]
    for knob in KNOBS.values():
        value = getattr(default, knob.name)
        readers = ", ".join(rule.name for rule in runnable if knob in rule.knobs)
        if not readers:
            continue
        lines.append(f"| `{PREFIX}{knob.user_key}` | `{'auto' if value is None else value}` | "
                     f"{KNOB_HELP[knob.name].replace('|', '/')} | {readers} |")
    return "\n".join(lines)


def _rule_note(rule) -> str:
    """What limits a rule in generate(): one decoding mode, or a trained judge (none ships for other targets)."""
    notes = [f"{rule.modes[0]} only"] if len(rule.modes) == 1 else []
    if rule.uses_judge:
        notes.append("needs a trained judge: only the embedded pair ships one")
    return f" ({', '.join(notes)})" if notes else ""


def with_rule_table(guide: str, root: Path = ROOT) -> str:
    """The guide with the text between TABLE_START and TABLE_END replaced by rule_table()."""
    head, rest = guide.split(TABLE_START + "\n", 1)
    return head + TABLE_START + "\n" + rule_table(root) + "\n" + TABLE_END + rest.split(TABLE_END, 1)[1]


def hub_arguments(root: Path = ROOT) -> str:
    """docs/generate.md's "## Arguments" section, its rule table (markers included) the Hub's (rule_table(hub))."""
    guide = (root / GUIDE).read_text(encoding="utf-8")
    start = guide.index("## Arguments")
    head, rest = guide[start:guide.index("\n## ", start)].split(TABLE_START, 1)
    return (head + rule_table(root, hub=True) + rest.split(TABLE_END, 1)[1]).strip()


def model_card(root: Path = ROOT, repo: str = HUB_REPO, source: str | None = None) -> str:
    """The model card: custom_generate/card.md with the repository, the argument tables, the tested versions,
    the requirements and the Studio's source (a link, when given) filled in."""
    tested = "; ".join(f"{name} {', '.join(versions)}" for name, versions in TESTED.items())
    return string.Template((root / CARD).read_text(encoding="utf-8")).substitute(
        repo=repo, arguments=hub_arguments(root), requirements=", ".join(f"`{r}`" for r in REQUIREMENTS),
        tested=f"Tested with {tested} (CPU): greedy at p 0 is the target's own `generate()` token for token,\n"
               "and a greedy call raises no warning.",
        source=f" DropMatch Studio's source: {source}." if source else "")


def staged(folder: Path, root: Path = ROOT, repo: str = HUB_REPO, source: str | None = None) -> list[Path]:
    """The repository's files written into `folder`; returns their relative paths (generate.py and
    requirements.txt first, the core's modules, the licence, the card)."""
    files = staged_modules(root)
    order = ["generate.py", "requirements.txt"] + sorted(set(files) - {"generate.py", "requirements.txt"})
    written = []
    for name in order:
        path = Path(FOLDER) / name
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(files[name], encoding="utf-8")
        written.append(path)
    (folder / "LICENSE").write_text((root / "LICENSE").read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "README.md").write_text(model_card(root, repo, source), encoding="utf-8")
    return written + [Path("LICENSE"), Path("README.md")]


def _list(folder: Path, files: list[Path]) -> None:
    for path in files:
        print(f"{(folder / path).stat().st_size / 1e3:8.1f} kB  {path.as_posix()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", help="the model repository, owner/name")
    parser.add_argument("--dry-run", action="store_true", help="list the files and their sizes; upload nothing")
    parser.add_argument("--stage", metavar="DIR", help="write the repository's files into DIR; upload nothing")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/generate.md's table of rules and knobs")
    parser.add_argument("--source", help="the URL of DropMatch Studio's source, linked from the card (with --repo)")
    args = parser.parse_args(argv)
    if args.docs:
        (ROOT / GUIDE).write_text(with_rule_table((ROOT / GUIDE).read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    if args.stage:
        _list(Path(args.stage), staged(Path(args.stage)))
        return 0
    if not args.dry_run and not (args.repo and args.source):
        parser.error("give --repo owner/name with --source URL, --dry-run or --stage DIR")
    with tempfile.TemporaryDirectory() as folder:
        files = staged(Path(folder), repo=args.repo or HUB_REPO, source=args.source)
        _list(Path(folder), files)
        if args.dry_run:
            return 0
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(args.repo, repo_type="model", exist_ok=True)
        commit = api.upload_folder(repo_id=args.repo, folder_path=folder, commit_message="DropMatch custom_generate")
        print(getattr(commit, "commit_url", commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
