"""BERT-base encoder (12 layers, hidden 768, 12 heads, feed-forward 3072, vocabulary 30,522) in plain torch.

Inputs ``input_ids`` and ``attention_mask`` (int64, ``[seq_len]`` each, 1 = real token, 0 = padding); output
``output`` = the last hidden state ``[seq_len, 768]``. No pooler (the encoder is what a serving benchmark runs;
108,891,648 parameters). Attention is written with plain matmul/softmax so every exporter sees the same graph; padding
positions get an additive -10000 bias (the original BERT's value, safe in fp16). Initialisation as in BERT:
N(0, 0.02) weights, zero biases, unit layer norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    max_positions: int = 512
    type_vocab: int = 2
    layer_norm_eps: float = 1e-12
    init_std: float = 0.02


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.output = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, bias):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + bias
        context = torch.matmul(scores.softmax(dim=-1), v).transpose(1, 2).flatten(2)
        return self.norm(x + self.output(context))


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.intermediate = nn.Linear(cfg.hidden, cfg.intermediate)
        self.output = nn.Linear(cfg.intermediate, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x, bias):
        x = self.attention(x, bias)
        return self.norm(x + self.output(nn.functional.gelu(self.intermediate(x))))


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig = BertConfig(), seq_len: int = 128):
        super().__init__()
        if not 1 <= seq_len <= cfg.max_positions:
            raise ValueError(f"seq_len must be in 1..{cfg.max_positions}, got {seq_len}")
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.embedding_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.register_buffer("position_ids", torch.arange(seq_len), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, cfg.init_std)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask):
        x = (self.word_embeddings(input_ids) + self.position_embeddings(self.position_ids)
             + self.token_type_embeddings.weight[0])
        x = self.embedding_norm(x)
        # [batch, 1, 1, seq]: 0 for tokens, -10000 for padding, in the activations' dtype
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return x
