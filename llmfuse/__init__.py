"""llmfuse: fused Llama decoder kernels and a looped decode kernel (all layers in one launch).

    import llmfuse
    model = llmfuse.from_pretrained("path/to/checkpoint", dtype=torch.bfloat16, looped=True)
    out = model.generate(input_ids, max_new_tokens=64)          # [B, prompt + new]

Layers: ``kernels/`` (one fused instruction per file), ``ops`` (launchers), ``looped``
(the Python interpreter of the looped schedule), ``model`` (the engine), ``reference``
(the unfused static-cache decoder: baseline, oracle and prefill path).
"""

import fusecore  # noqa: F401  (fixes the kernel mode before any llmfuse kernel is defined)

from . import reference
from .config import LlamaConfig
from .model import LlamaModel, from_pretrained, sample_tokens
from .weights import CheckpointError, LlamaWeights, random_weights

__all__ = [
    "CheckpointError", "LlamaConfig", "LlamaModel", "LlamaWeights", "from_pretrained", "random_weights",
    "reference", "sample_tokens",
]
