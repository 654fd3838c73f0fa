"""Published models, as their papers state them: the data behind "why distributed".

    MODELS          year, parameters, training data, vocabulary, training compute, source of each
    GPT3_FAMILY     the eight GPT-3 configurations (Brown et al. 2020, Table 2.1)
    model_table()   MODELS with 6·N·D next to the stated compute

Only numbers the papers state are entered; None where a paper does not give one (AlexNet,
BERT, GPT-2 and LLaMA state their hardware and time, not FLOPs; GPT-2 states 40 GB of
text, not tokens). `model_table` adds C ≈ 6·N·D (`ddnb.cost.training_flops`, Kaplan et
al. 2020) for the transformers, an estimate to set beside the stated figure.
Taught in `notebooks/01_why_distributed.ipynb`.
"""
from __future__ import annotations

from ddnb.cost.transformer import training_flops, transformer_params

# name, year, parameters, training data (amount, unit), tokens, vocabulary, training compute in FLOPs, source.
# Vocabularies, as stated: BERT "a 30,000 token vocabulary" (WordPiece); GPT-2 50,257 (GPT-3 reuses its
# tokenizer); Chinchilla a slightly modified SentencePiece tokenizer of Gopher's 32,000 (Rae et al. 2021);
# LLaMA "32k tokens"; Llama 3 "a vocabulary with 128K tokens".
# Deliberately repetitive: data, one dict of the same keys per published model (`duplicates` sees its shape twice).
MODELS = [
    {"name": "AlexNet", "year": 2012, "params": 60e6, "data": 1.2e6, "data_unit": "images", "tokens": None, "vocab": None,
     "flops": None, "transformer": False,
     "source": "Krizhevsky et al. 2012, ImageNet Classification with Deep CNNs, Sec. 1-2: 60 million parameters, "
               "1.2 million training images (90 epochs, 5-6 days on two GTX 580 GPUs)"},
    {"name": "BERT-Large", "year": 2018, "params": 340e6, "data": 3.3e9, "data_unit": "words", "tokens": 128e9, "vocab": 30000,
     "flops": None, "transformer": True,
     "source": "Devlin et al. 2018, BERT, Sec. 3 and App. A.2: 340M parameters, 3.3B words, "
               "1,000,000 steps of 256 x 512 = 128,000 tokens (4 days on 16 Cloud TPUs)"},
    {"name": "GPT-2", "year": 2019, "params": 1542e6, "data": 40e9, "data_unit": "bytes of text", "tokens": None, "vocab": 50257,
     "flops": None, "transformer": True,
     "source": "Radford et al. 2019, Language Models are Unsupervised Multitask Learners, Sec. 2.1 and "
               "Table 2: 1542M parameters, WebText 40 GB of text"},
    {"name": "GPT-3", "year": 2020, "params": 175e9, "data": 300e9, "data_unit": "tokens", "tokens": 300e9, "vocab": 50257,
     "flops": 3.14e23, "transformer": True,
     "source": "Brown et al. 2020, Language Models are Few-Shot Learners, Sec. 2.1-2.2 and App. D: "
               "175B parameters, 300B tokens, 3.14e23 FLOPs (3.64e3 petaflop/s-days)"},
    {"name": "Chinchilla", "year": 2022, "params": 70e9, "data": 1.4e12, "data_unit": "tokens", "tokens": 1.4e12, "vocab": 32000,
     "flops": 5.76e23, "transformer": True,
     "source": "Hoffmann et al. 2022, Training Compute-Optimal Large Language Models, Sec. 4 and Table 3: "
               "70B parameters, 1.4T tokens, 5.76e23 FLOPs (Gopher's budget)"},
    {"name": "LLaMA-65B", "year": 2023, "params": 65.2e9, "data": 1.4e12, "data_unit": "tokens", "tokens": 1.4e12, "vocab": 32000,
     "flops": None, "transformer": True,
     "source": "Touvron et al. 2023, LLaMA: Open and Efficient Foundation Language Models, Table 2 and "
               "Table 15: 65.2B parameters, 1.4T tokens (1,022,362 A100-80GB GPU-hours)"},
    {"name": "Llama 3 405B", "year": 2024, "params": 405e9, "data": 15.6e12, "data_unit": "tokens",
     "tokens": 15.6e12, "vocab": 128000, "flops": 3.8e25, "transformer": True,
     "source": "Dubey et al. 2024, The Llama 3 Herd of Models, Sec. 1 and 3.2.1: 405B parameters, "
               "15.6T tokens, 3.8e25 FLOPs"},
]

# Brown et al. 2020, Table 2.1: stated parameters, layers, d_model, heads (context 2048, vocabulary 50257)
GPT3_FAMILY = [
    {"name": "GPT-3 Small", "params": 125e6, "n_layers": 12, "d_model": 768, "n_heads": 12},
    {"name": "GPT-3 Medium", "params": 350e6, "n_layers": 24, "d_model": 1024, "n_heads": 16},
    {"name": "GPT-3 Large", "params": 760e6, "n_layers": 24, "d_model": 1536, "n_heads": 16},
    # the table prints 24 heads of d_head 128 for d_model 2048, which do not multiply out; 16 of 128 do
    {"name": "GPT-3 XL", "params": 1.3e9, "n_layers": 24, "d_model": 2048, "n_heads": 16},
    {"name": "GPT-3 2.7B", "params": 2.7e9, "n_layers": 32, "d_model": 2560, "n_heads": 32},
    {"name": "GPT-3 6.7B", "params": 6.7e9, "n_layers": 32, "d_model": 4096, "n_heads": 32},
    # the table prints d_model 5140; its 40 heads of d_head 128 make 5120, the width used here
    {"name": "GPT-3 13B", "params": 13e9, "n_layers": 40, "d_model": 5120, "n_heads": 40},
    {"name": "GPT-3 175B", "params": 175e9, "n_layers": 96, "d_model": 12288, "n_heads": 96},
]
GPT3_VOCAB, GPT3_CONTEXT = 50257, 2048


def model_table() -> list[dict]:
    """MODELS in year order, each with "flops_6nd" = 6·N·D where the tokens are stated
    (None otherwise) and "ratio" = stated / 6·N·D where both exist."""
    rows = []
    for m in sorted(MODELS, key=lambda m: m["year"]):
        est = training_flops(m["params"], m["tokens"]) if m["transformer"] and m["tokens"] else None
        rows.append({**m, "flops_6nd": est, "ratio": m["flops"] / est if est and m["flops"] else None})
    return rows


def gpt3_family_table() -> list[dict]:
    """GPT3_FAMILY with "counted" = `transformer_params` of each configuration (tied
    embeddings, context 2048, vocabulary 50257) next to the stated parameters."""
    return [{**m, "counted": transformer_params(m["n_layers"], m["d_model"], GPT3_VOCAB, GPT3_CONTEXT)}
            for m in GPT3_FAMILY]
