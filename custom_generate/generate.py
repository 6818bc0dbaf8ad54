"""DropMatch for transformers' `generate(custom_generate=...)`: this folder is what transformers loads from
a repository (a local path or a Hub id), with trust_remote_code=True.

    out = target.generate(**inputs, assistant_model=draft, custom_generate="owner/dropmatch",
                          trust_remote_code=True, max_new_tokens=64, dropmatch_rule="dropmatch", dropmatch_p=0.3)

The work is the DropMatch Studio package's (dropmatch.hf_generate), installed beside transformers
(requirements.txt here); this file only hands transformers' call to it.
"""

from dropmatch.hf_generate import generate as _dropmatch_generate


def generate(model, *args, **kwargs):
    """transformers calls this with `model` (the target) and generate()'s own arguments."""
    return _dropmatch_generate(model, *args, **kwargs)
