"""The Space upload: the README's front matter agrees with requirements.txt, the loader and the
shipped files; the deploy allow-list carries everything the app reads, and binaries go to Xet/LFS."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import yaml

from dropmatch import assets
from dropmatch.decoding.config import PRESETS
from dropmatch.models.loading import EMBEDDED_DRAFT_DIR, GGUF_FILE, GGUF_REPO, GGUF_REVISION
from dropmatch.decoding.trained_judge import SHIPPED_JUDGE

ROOT = Path(__file__).resolve().parent.parent

ZEROGPU_PYTHONS = {"3.10", "3.12"}  # what ZeroGPU Spaces run (spaces' own docs)
HARDWARE = {"cpu-basic", "cpu-upgrade", "zero-a10g", "t4-small", "t4-medium", "l4x1", "a10g-small", "a10g-large"}
BINARY = (".safetensors", ".gguf", ".bin", ".pt", ".png", ".gif", ".jpg", ".webp")


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def pins() -> dict[str, str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_front_matter_matches_requirements_the_loader_and_the_presets():
    meta = front_matter()
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == pins()["gradio"]
    assert str(meta["python_version"]) in ZEROGPU_PYTHONS
    assert meta["suggested_hardware"] in HARDWARE
    assert (ROOT / meta["app_file"]).is_file()
    assert 0 < len(meta["short_description"]) <= 60  # the Hub's limit
    assert meta["preload_from_hub"] == [f"{GGUF_REPO} {GGUF_FILE} {GGUF_REVISION}"]
    preset_ids = {name for spec in PRESETS.values() if spec is not None for name in (spec.target, spec.draft, spec.head)
                  if "/" in name}
    assert set(meta["models"]) == {GGUF_REPO} | preset_ids


def dry_run_listing() -> list[str]:
    """The files `scripts/deploy_space.py --dry-run` lists (as a user runs it), after checking its total line."""
    out = subprocess.run([sys.executable, "scripts/deploy_space.py", "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    listed = [line.split("MB  ", 1)[1] for line in lines[:-1]]
    assert re.fullmatch(r"\d+ files, \d+\.\d MB", lines[-1]) and int(lines[-1].split()[0]) == len(listed)
    return listed


def test_dry_run_lists_every_file_the_app_reads_and_no_benchmark_report():
    listed = set(dry_run_listing())
    read_by_the_app = {path for name, path in vars(assets).items() if name.endswith("_FILE")}  # every named file
    needed = {*read_by_the_app, *assets.PAGE_FILES.values(),
              *assets.RECORDED_DIR.glob("*.json"), *assets.LESSONS_DIR.glob("*.json"), *EMBEDDED_DRAFT_DIR.iterdir(),
              SHIPPED_JUDGE, ROOT / "app.py",
              ROOT / "requirements.txt", ROOT / "README.md", ROOT / ".gitattributes",
              *(ROOT / "dropmatch").rglob("*.py")}
    images = re.findall(r"\]\((assets/[^)]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    needed |= {ROOT / image for image in images}
    missing = {str(path.relative_to(ROOT)) for path in needed if "__pycache__" not in str(path)} - listed
    assert not missing, missing
    assert not any(name.endswith(".html") or name.startswith(("tests/", "scripts/", "runs/", "assets/lessons/runs/"))
                   for name in listed)


def test_every_shipped_binary_is_marked_for_xet_or_lfs():
    patterns = [line.split()[0] for line in (ROOT / ".gitattributes").read_text().splitlines()
                if line and not line.startswith("#") and "filter=lfs" in line]
    for path in map(Path, dry_run_listing()):
        if path.suffix in BINARY:
            assert any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns), path


def test_upload_without_a_space_name_is_one_clear_line():
    out = subprocess.run([sys.executable, "scripts/deploy_space.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "--space owner/name" in out.stderr


def test_the_generate_repositorys_dry_run_lists_custom_generate_the_core_its_requirements_and_the_model_card(tmp_path):
    """What `custom_generate="owner/dropmatch"` needs on the Hub (generate.py, the decoding core's modules beside
    it, requirements naming torch and transformers only), the licence and a card with the arguments and the
    citation (the repository staged in a folder by the script, as a user would look at it before uploading)."""
    done = subprocess.run([sys.executable, "scripts/deploy_generate.py", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[-1] for line in done.stdout.splitlines()]
    assert listed[:2] == ["custom_generate/generate.py", "custom_generate/requirements.txt"]
    assert listed[-2:] == ["LICENSE", "README.md"]
    assert {"custom_generate/engine.py", "custom_generate/config.py"} <= set(listed)
    assert all(name.startswith("custom_generate/") and name.endswith(".py") for name in listed[2:-2])
    staged = subprocess.run([sys.executable, "scripts/deploy_generate.py", "--stage", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert staged.returncode == 0 and [line.split()[-1] for line in staged.stdout.splitlines()] == listed, staged.stderr
    card = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: transformers") and "custom_generate" in card
    assert "dropmatch_rule" in card and "2603.03333" in card and "```python" in card
    requirements = (tmp_path / "custom_generate" / "requirements.txt").read_text().split()
    assert [re.split("[<>=]", line)[0] for line in requirements] == ["torch", "transformers", "transformers"]
