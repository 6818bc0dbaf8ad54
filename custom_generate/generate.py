"""DropMatch for transformers' `generate(custom_generate=...)` from a clone of DropMatch Studio, where the
package is installed: `custom_generate="."` at the repository's root, with trust_remote_code=True.

    out = target.generate(**inputs, assistant_model=draft, custom_generate=".",
                          trust_remote_code=True, max_new_tokens=64, dropmatch_rule="dropmatch", dropmatch_p=0.3)

This file only hands transformers the installed package's `generate` (dropmatch.decoding.hf_generate;
requirements.txt here names it). The Hub repository is another folder, written by `python
scripts/deploy_generate.py --stage DIR`: generate.py and the method package (dropmatch/decoding/) beside it,
copied as it is, needing torch and transformers only.
"""

from dropmatch.decoding.hf_generate import generate  # noqa: F401  (transformers calls `generate` of this file)
