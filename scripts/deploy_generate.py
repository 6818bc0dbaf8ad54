"""Upload DropMatch's `custom_generate/` to a Hugging Face model repository, or say what would go there.

    python scripts/deploy_generate.py --dry-run
    python scripts/deploy_generate.py --repo you/dropmatch      # needs HF_TOKEN (write) or `hf auth login`

The repository gets custom_generate/generate.py and its requirements.txt (what transformers loads with
`custom_generate="you/dropmatch"`) and a model card (README.md) written from docs/generate.md: what it
does, the arguments, an example, the method's citation.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("custom_generate/generate.py", "custom_generate/requirements.txt")
CARD_HEADER = """---
library_name: transformers
tags:
- custom_generate
- speculative-decoding
license: apache-2.0
---

# DropMatch: training-free lossy verification for speculative decoding

A `custom_generate` decoding method for transformers: Monte-Carlo dropout on the target's LM head gives K
slightly different opinions; a draft token they agree with is accepted even when it is not the target's
exact choice (arXiv 2603.03333). At `dropmatch_p=0` or `dropmatch_rule="lossless"` it is lossless speculative
decoding.

"""
CITATION = """
## Citation

The method: DropMatch, arXiv 2603.03333 (https://arxiv.org/abs/2603.03333); cite the paper for the method.
This implementation: DropMatch Studio (Apache-2.0).
"""


def model_card(root: Path = ROOT) -> str:
    """The model card: the header, docs/generate.md's body (its title dropped), the citation."""
    guide = (root / "docs" / "generate.md").read_text(encoding="utf-8").split("\n", 1)[1]
    return CARD_HEADER + guide.strip() + "\n" + CITATION


def staged(folder: Path, root: Path = ROOT) -> list[Path]:
    """The repository's files written into `folder`; returns their relative paths."""
    for name in FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes((root / name).read_bytes())
    (folder / "README.md").write_text(model_card(root), encoding="utf-8")
    return [Path(name) for name in (*FILES, "README.md")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", help="the model repository, owner/name")
    parser.add_argument("--dry-run", action="store_true", help="list the files and their sizes; upload nothing")
    parser.add_argument("--stage", metavar="DIR", help="write the repository's files into DIR to read; upload nothing")
    args = parser.parse_args(argv)
    if args.stage:
        for path in staged(Path(args.stage)):
            print(f"{(Path(args.stage) / path).stat().st_size / 1e3:8.1f} kB  {path}")
        return 0
    if not args.dry_run and not args.repo:
        parser.error("give --repo owner/name, --dry-run or --stage DIR")
    with tempfile.TemporaryDirectory() as folder:
        files = staged(Path(folder))
        for path in files:
            print(f"{(Path(folder) / path).stat().st_size / 1e3:8.1f} kB  {path}")
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
