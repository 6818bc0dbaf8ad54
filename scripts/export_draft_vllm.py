"""Export the shipped draft (assets/draft) as a standard Llama checkpoint that vLLM loads as a draft
model: the draft's own two blocks and final norm, the target's input embedding copied in (ours
shares it at run time) and a head tied to it, over the whole vocabulary. Ours scores only the
8192 shipped token ids (the target's head rows of those ids); vLLM's Llama has no way to mask the
other rows, so the exported draft may propose a token outside them: same blocks, slightly different
proposals (docs/serving.md gives the measured agreement).

    python scripts/export_draft_vllm.py [OUT_DIR]     # default runs/vllm/draft; prints the folder
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def export(out: Path) -> Path:
    from safetensors.torch import load_file, save_file

    from dropmatch.models.loading import EMBEDDED_DRAFT_DIR, embedded_target_source

    target_dir = Path(embedded_target_source()[0])
    draft = load_file(str(EMBEDDED_DRAFT_DIR / "draft.safetensors"))
    draft.pop("head_rows")
    target = load_file(str(target_dir / "model.safetensors"))
    embedding = target["model.embed_tokens.weight"]
    config = json.loads((EMBEDDED_DRAFT_DIR / "config.json").read_text())
    if embedding.shape != (config["vocab_size"], config["hidden_size"]):
        raise SystemExit(f"error: the target's embedding is {tuple(embedding.shape)}, the draft expects "
                         f"({config['vocab_size']}, {config['hidden_size']})")
    config.update(architectures=["LlamaForCausalLM"], tie_word_embeddings=True, dtype="float32")
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.float().contiguous() for name, tensor in draft.items()}
    tensors["model.embed_tokens.weight"] = embedding.float().contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (target_dir / name).exists():
            shutil.copy(target_dir / name, out / name)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "runs" / "vllm" / "draft")
    args = parser.parse_args()
    try:
        print(export(args.out))
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
