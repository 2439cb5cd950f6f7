"""looprl.models: the default model and loading of any HF causal LM from a local path.

    from looprl.models import init_default_model, load_model, pretrain
    path = init_default_model("~/.cache/looprl/models/default")   # tokenizer + random Llama, HF format
    pretrain(path, steps=300)                                     # optional
    lm = load_model(path)                                         # lm.model, lm.tokenizer
"""

from looprl.models.loading import LoadedModel, load_model
from looprl.models.pretrain import PretrainResult, pretrain
from looprl.models.tiny import DEFAULT_SIZE, SIZES, init_default_model

__all__ = ["DEFAULT_SIZE", "SIZES", "LoadedModel", "PretrainResult", "init_default_model",
           "load_model", "pretrain"]
