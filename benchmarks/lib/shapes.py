"""Real models' shapes for the benchmarks that build a random-initialised model of that size
(:mod:`benchmarks.gpu_check`, :mod:`benchmarks.bench_training`'s weight sync)."""

#: Qwen2.5-1.5B-Instruct's shape (its config.json), as ``model.tiny`` fields: random weights, real sizes.
QWEN25_1_5B_SHAPE = {
    "vocab_size": 151643,
    "embedding_rows": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
}
