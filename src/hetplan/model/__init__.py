"""Model specifications (decoder-only transformers, dense or mixture-of-experts) built from Hugging Face
``config.json`` files or presets, and their counts (:mod:`.counts`: parameters, FLOPs, activation bytes). The torch
reference model (:mod:`.torch_transformer`, :mod:`.torch_moe`) needs the ``torch`` extra; importing this package
does not import torch."""

from hetplan.model.spec import ModelSpec, load_model, list_presets

__all__ = ["ModelSpec", "load_model", "list_presets"]
