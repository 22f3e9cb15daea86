"""Tiny random-init draft models built inside the tests (no downloads).

A byte-level BPE tokenizer trained on a few lines (about 300 tokens, a
tokenizer unlike the fake target's), and a 2-layer Qwen2-shaped model in
float64, so that logits of a cached and an uncached forward agree to the
last bit that matters for argmax.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def tiny_tokenizer():
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = ["def add(a, b):\n    return a + b\n", "The model reads the text and writes the answer.", "你好世界 😀 and more"] * 20
    tok.train_from_iterator(corpus, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def tiny_model(seed: int = 0):
    import torch
    import transformers

    tokenizer = tiny_tokenizer()
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float64), tokenizer
