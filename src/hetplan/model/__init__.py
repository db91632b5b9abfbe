"""Model specifications (decoder-only transformers) built from Hugging Face ``config.json`` files or presets."""

from hetplan.model.spec import ModelSpec, load_model, list_presets

__all__ = ["ModelSpec", "load_model", "list_presets"]
