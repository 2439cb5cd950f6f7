"""looprl.models: the default model and loading of any HF causal LM from a local path.

    from looprl.models import init_default_model, load_model, pretrain
    path = init_default_model("~/.cache/looprl/models/default")   # tokenizer + random Llama, HF format
    pretrain(path, steps=300)                                     # optional
    lm = load_model(path)                                         # lm.model, lm.tokenizer
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "loading": ["LoadedModel", "load_model"],
    "pretrain": ["PretrainResult", "pretrain"],
    "tiny": ["DEFAULT_SIZE", "SIZES", "init_default_model"],
})
