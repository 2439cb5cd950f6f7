import json

import numpy as np
import pytest
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

from looprl.errors import ConfigError
from looprl.search.embed import HFEmbedder, info_nce, load_embedder, train_tokenizer


def test_trained_model_is_saved_in_hf_format(tiny_model_dir):
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "looprl_embed.json",
            "loss.png"} <= names
    meta = json.loads((tiny_model_dir / "looprl_embed.json").read_text())
    assert meta["pooling"] == "mean" and meta["result"]["steps"] > 0
    assert "rich" in meta["heldout_packages"]


def test_embeddings_are_normalised_and_deterministic(tiny_embedder):
    texts = ["def f(x):\n    return x + 1", "split a string into words", "class A: pass"]
    a = tiny_embedder.embed_code(texts)
    b = tiny_embedder.embed_code(texts[::-1])[::-1]
    assert a.shape == (3, tiny_embedder.dim) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert tiny_embedder.embed_queries([]).shape == (0, tiny_embedder.dim)


def test_training_lowers_the_contrastive_loss(tiny_model_dir):
    meta = json.loads((tiny_model_dir / "looprl_embed.json").read_text())
    # in-batch chance level for batch 32 is ln(32) = 3.47; training must get below it
    assert meta["result"]["final_loss"] < 3.3


def test_info_nce_prefers_matching_pairs():
    import torch
    q = torch.nn.functional.normalize(torch.randn(8, 16), dim=-1)
    assert info_nce(q, q, 0.05) < info_nce(q, q.roll(1, 0), 0.05)


def test_load_plain_hf_encoder_dir(tmp_path):
    tok = train_tokenizer(["def parse header line", "return the value"] * 20, 300)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    model = BertModel(BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=16,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32), add_pooling_layer=False)
    model.save_pretrained(tmp_path)
    fast.save_pretrained(tmp_path)
    emb = load_embedder(tmp_path)
    assert isinstance(emb, HFEmbedder) and emb.dim == 16
    v = emb.embed_queries(["parse header", "value"])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_missing_model_says_how_to_train(tmp_path):
    with pytest.raises(ConfigError, match="looprl embed train"):
        load_embedder(tmp_path / "nope")


def test_bag_of_tokens_matches_the_model_forward():
    """The 0-layer fast path must give the vectors BertModel + mean pooling gives."""
    import torch

    from looprl.search.embed import BagOfTokens, CodeEmbedder
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=300, hidden_size=24, num_hidden_layers=0,
                                 num_attention_heads=2, max_position_embeddings=40,
                                 type_vocab_size=1), add_pooling_layer=False).eval()
    with torch.no_grad():  # trained-looking LayerNorm and a non-zero token-type row
        model.embeddings.LayerNorm.weight.uniform_(0.5, 1.5)
        model.embeddings.LayerNorm.bias.normal_(0, 0.1)
        model.embeddings.token_type_embeddings.weight.normal_(0, 0.3)
        model.embeddings.word_embeddings.weight.add_(0.05)  # rows with a non-zero mean
    rng = np.random.default_rng(1)
    ids = [rng.integers(1, 300, size=n).tolist() for n in [1, 5, 5, 40, 17, 1, 33, 5]]
    emb = CodeEmbedder(model, tok=None, meta={}, model_id="t")
    assert isinstance(emb.bag, BagOfTokens)
    np.testing.assert_allclose(emb.bag(ids), emb.forward(ids), atol=2e-6)
    emb.bag.TOKENS_PER_BLOCK = 12  # split each length group into several blocks
    np.testing.assert_allclose(emb.bag(ids), emb.forward(ids), atol=2e-6)
    assert emb.bag([]).shape == (0, 24)


def test_cut_tokenizing_gives_the_ids_of_whole_texts(tiny_embedder):
    from looprl.search.embed import _encode, normalize_text
    tok = tiny_embedder.tok
    words = "def parse header line return value self result split words x" .split()
    rng = np.random.default_rng(2)
    texts = [" ".join(rng.choice(words, size=n)) for n in (0, 1, 3, 8, 9, 20, 60)]
    texts += ["a" * 300, "x = 1 " + "y" * 200, "   ", "if(a,b):return[c]" * 12]
    for max_len in (4, 8, 32):
        tok.no_padding()
        tok.no_truncation()
        want = [tok.encode(normalize_text(t)).ids[:max_len] or [1] for t in texts]
        assert _encode(tok, texts, max_len) == want


def test_default_model_dir_is_versioned(tmp_path, monkeypatch):
    from looprl.search.embed import MODEL_VERSION, default_model_dir
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path))
    (tmp_path / "models" / "code-embed").mkdir(parents=True)  # an older, unversioned model
    assert default_model_dir().name == f"code-embed-{MODEL_VERSION}"
    with pytest.raises(ConfigError, match="looprl embed train"):
        load_embedder()
