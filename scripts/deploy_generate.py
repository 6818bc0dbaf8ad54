"""Stage DropMatch's `generate(custom_generate=...)` repository, upload it to the Hugging Face Hub, or list it.

    python scripts/deploy_generate.py --dry-run
    python scripts/deploy_generate.py --stage DIR                # write it into DIR, to read or to load
    python scripts/deploy_generate.py --repo you/dropmatch --source URL   # HF_TOKEN (write) or `hf auth login`
    python scripts/deploy_generate.py --docs                     # rewrite docs/generate.md's rule table

The repository stands alone: `custom_generate/` holds generate.py and, beside it, every module of the method
package (dropmatch/decoding/) copied as it is, a requirements.txt that names torch and transformers only
(transformers within the tested range), and the LICENSE. The model card (README.md) is custom_generate/card.md,
written for a Hub reader, with docs/generate.md's argument tables: the rules a Hub user can run (no trained
judge ships there) derived from the rule table (acceptance.RULES and their Knobs) at that moment, as `--docs`
writes the full table into the guide.

transformers' loader copies (and from the Hub downloads) the modules named in `from .module import` lines
beside generate.py, one folder deep: the package is one flat folder whose modules import each other as
`from .module import` (or `from . import module`) only, so its files need no rewriting. Staging refuses a
package that imports anything but its own modules, the standard library, torch and transformers (and numpy,
which transformers requires).
"""

from __future__ import annotations

import argparse
import ast
import string
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path("dropmatch") / "decoding"  # the method package, staged whole
ENTRY = "hf_generate"  # its module whose `generate` transformers calls
FOLDER = "custom_generate"
# One specifier a line: transformers' loader checks each line, reading only the first specifier of a line.
# The upper bound: the first release not tested (TESTED); a later one is refused at load, in one line.
REQUIREMENTS = ("torch>=2.6", "transformers>=5.20", "transformers<5.26")  # never a pin that replaces a user's torch
TESTED = {"transformers": ("5.20.0", "5.23.0", "5.25.0"), "torch": ("2.13.0",)}  # what the staged folder ran on
ALLOWED = {"torch", "transformers", "numpy"}  # besides the standard library (numpy: transformers requires it)
CARD = Path(FOLDER) / "card.md"  # the model card's text, its $-placeholders filled by model_card()
HUB_REPO = "owner/dropmatch"  # the card's repository until --repo names it
GUIDE = Path("docs") / "generate.md"
TABLE_START = "<!-- rules and knobs: written from the rule table by `python scripts/deploy_generate.py --docs` -->"
TABLE_END = "<!-- end of the rule table -->"


def package_files(root: Path = ROOT) -> list[Path]:
    """The method package's modules (its __init__.py, a package marker, aside: transformers writes its own)."""
    return sorted(path for path in (root / PACKAGE).glob("*.py") if path.name != "__init__.py")


def outside_imports(path: Path, siblings: set[str]) -> list[str]:
    """What module `path` imports beyond its siblings in the package, the standard library and ALLOWED,
    wherever the import is written (transformers' loader checks them all): one line each."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            names = [node.module] if node.module else [alias.name for alias in node.names]
            if node.level != 1 or any(name not in siblings for name in names):
                found.append(f"{path.name} line {node.lineno}: {'.' * node.level}{node.module or ''} is not a sibling")
        else:
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name} line {node.lineno}: {name}" for name in modules
                      if name.split(".")[0] not in ALLOWED | set(sys.stdlib_module_names)]
    return found


def generate_module(modules: list[str]) -> str:
    """custom_generate/generate.py: `generate` from the entry module, and one `from .module import` line per
    staged module (transformers' loader follows only such lines; `from . import x` escapes it)."""
    named = "\n".join(f"from .{m} import __name__ as _  # noqa: E402,F401" for m in modules if m != ENTRY)
    return (f'''"""DropMatch for transformers' `generate(custom_generate=...)`: what transformers loads from this
repository with trust_remote_code=True. It needs torch and transformers only.

    out = target.generate(**inputs, assistant_model=draft, custom_generate="owner/dropmatch",
                          trust_remote_code=True, max_new_tokens=64, dropmatch_rule="dropmatch", dropmatch_p=0.3)

Written by scripts/deploy_generate.py; the modules beside it are DropMatch Studio's method package
(dropmatch/decoding/), each file as it is there.
"""

from .{ENTRY} import generate

# Every module of this folder, so that transformers' loader copies (from the Hub: downloads) each one.
{named}

__all__ = ["generate"]
''')


def staged_modules(root: Path = ROOT) -> dict[str, str]:
    """{file name in custom_generate/: text}: generate.py, the package's modules as they are, requirements.txt.
    ValueError (one line) when a module imports beyond its siblings, the standard library and ALLOWED."""
    paths = package_files(root)
    siblings = {path.stem for path in paths}
    for path in paths:
        outside = outside_imports(path, siblings)
        if outside:
            raise ValueError(f"{PACKAGE.as_posix()}/{outside[0]}: the method package imports its own modules, torch "
                             "and transformers only")
    files = {path.name: path.read_text(encoding="utf-8") for path in paths}
    files["generate.py"] = generate_module(sorted(siblings))
    files["requirements.txt"] = "".join(line + "\n" for line in REQUIREMENTS)
    return files


def rule_table(root: Path = ROOT, hub: bool = False) -> str:
    """The markdown table of dropmatch_rule and every knob generate() accepts, from the rule table: each
    rule's label and modes, each knob's key, the rules that read it, generate()'s default and its help.
    hub: without the rules that need a trained judge (none ships on the Hub) and the knobs only they read."""
    sys.path.insert(0, str(root))
    try:
        from dropmatch.decoding.acceptance import KNOBS, RULES
        from dropmatch.decoding.hf_generate import PREFIX, default_rule
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
    requirements.txt first, the package's modules, the licence, the card)."""
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
