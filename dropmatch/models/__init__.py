"""The Studio's side of transformers (the model wrapper the engine sees is the method package's:
decoding/causal_lm.py, decoding/cpu_kernels.py).

    loading.py      a pair from the hub or the embedded CPU pair; ModelLoadError
    references.py   the target's own greedy generate() and transformers' assisted generation
    peer.py         a rival's own generation beside a run
"""

from .loading import (EMBEDDED_DRAFT_DIR, ModelLoadError, build_draft_model, load_embedded_models, load_embedded_pair,
                      load_embedded_target, load_hub_pair, load_pair)
from .references import (Divergence, assisted_generate, ensemble_assisted_generate, first_divergence, greedy_reference,
                         prompt_lookup_generate, sequence_nll)
