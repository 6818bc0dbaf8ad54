"""Upload the app to a Hugging Face Space, or say what would go there.

    python scripts/deploy_space.py --dry-run
    python scripts/deploy_space.py --space you/dropmatch-studio     # needs HF_TOKEN (write) or `hf auth login`

Only an allow-list goes up (what the app reads at run time, and the README's images): the app, the
package, requirements, the front-matter README, .gitattributes (binaries go to Xet/LFS), the draft,
the prompts, the recorded runs, the frontier the Trade-offs tab draws, How it works, the page's
scripts and styles and the screenshots. Benchmark reports, tests and scripts stay here. Files are taken from
`git ls-files`, so nothing untracked or ignored (a venv, a cache) can slip in.
"""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ALLOW = (
    "app.py", "README.md", "requirements.txt", ".gitattributes", "pyproject.toml",
    "dropmatch/*.py", "dropmatch/*/*.py",
    "assets/draft/*", "assets/judge/judge.json", "assets/prompts/*", "assets/recorded/*.json",
    "assets/*.js", "assets/*.css", "assets/tab_notes.md",  # the page's scripts, styles and tab notes
    "assets/lessons/*.json",  # the built-in lessons (DENY: not their runs)
    "assets/results/frontier.json", "assets/results/robustness.json", "assets/results/robustness_gamma15.json",
    "assets/results/same_drafts.json",
    "assets/screenshots/*",
    "docs/how_it_works.md",
)
DENY = ("assets/lessons/runs/*",)  # what the tests rebuild the built-in lessons from; the app never reads it


def space_files(root: Path = ROOT) -> list[Path]:
    """The tracked files (relative paths) that match the allow-list, sorted."""
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    return sorted(Path(name) for name in listed.splitlines()
                  if any(fnmatch.fnmatchcase(name, pattern) for pattern in ALLOW)
                  and not any(fnmatch.fnmatchcase(name, pattern) for pattern in DENY) and (root / name).is_file())


def listing(files: list[Path], root: Path = ROOT) -> str:
    """One line per file with its size, then `N files, X MB`."""
    sizes = [(root / path).stat().st_size for path in files]
    lines = [f"{size / 1e6:9.3f} MB  {path}" for path, size in zip(files, sizes)]
    return "\n".join([*lines, f"{len(files)} files, {sum(sizes) / 1e6:.1f} MB"])


def upload(space: str, files: list[Path], root: Path = ROOT) -> str:
    """Upload the files to the Space in one commit (huggingface_hub stores the binaries with Xet)."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(space, repo_type="space", space_sdk="gradio", exist_ok=True)
    commit = api.upload_folder(repo_id=space, repo_type="space", folder_path=str(root),
                               allow_patterns=[str(path) for path in files],
                               commit_message="Deploy DropMatch Studio")
    return str(getattr(commit, "commit_url", commit))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="list what would be uploaded, upload nothing")
    parser.add_argument("--space", help="the Space to upload to, owner/name")
    args = parser.parse_args(argv)
    files = space_files()
    print(listing(files))
    if args.dry_run:
        return 0
    if not args.space or args.space.count("/") != 1:
        print("error: name the Space as --space owner/name (or pass --dry-run)", file=sys.stderr)
        return 2
    try:
        print("uploaded:", upload(args.space, files))
    except Exception as error:  # no token, no network, no such owner: one line
        print(f"error: the upload to {args.space} failed: {str(error).splitlines()[0] if str(error) else error!r}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
