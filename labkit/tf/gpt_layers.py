"""The GPT-2-style decoder as Keras 3 layers (twin of the torch GPT in `labkit.torch.models`).

Pre-norm blocks, causal self-attention, 4x GELU MLP, learned position embeddings, output
projection tied to the token embedding. Initialisation follows GPT-2: N(0, 0.02), residual
projections scaled by 1/sqrt(2 * n_layer). Layer norms and linear layers have biases only when
`config.bias` is set, as in the torch twin.
"""

from __future__ import annotations

import math

import keras
from keras import layers, ops

from labkit.core.models import GPTConfig


def _init(std: float = 0.02):
    return keras.initializers.RandomNormal(stddev=std)


def _norm(c: GPTConfig, dtype, name: str):
    # torch LayerNorm(eps=1e-5); `center` is the bias.
    return layers.LayerNormalization(epsilon=1e-5, center=c.bias, dtype=dtype, name=name)


class CausalSelfAttention(layers.Layer):
    def __init__(self, c: GPTConfig, **kwargs):
        super().__init__(**kwargs)
        self.c = c
        proj_std = 0.02 / math.sqrt(2 * c.n_layer)
        self.qkv = layers.Dense(3 * c.n_embd, use_bias=c.bias, kernel_initializer=_init(),
                                dtype=self.dtype_policy, name="c_attn")
        self.proj = layers.Dense(c.n_embd, use_bias=c.bias, kernel_initializer=_init(proj_std),
                                 dtype=self.dtype_policy, name="c_proj")
        self.drop = layers.Dropout(c.dropout, dtype=self.dtype_policy)

    def call(self, x, training=False):
        c = self.c
        b, t = ops.shape(x)[0], ops.shape(x)[1]
        head = c.n_embd // c.n_head
        qkv = ops.reshape(self.qkv(x), (b, t, 3, c.n_head, head))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (b, t, heads, head)
        # Keras' fused attention picks the fastest kernel the backend has (flash on GPU).
        y = ops.dot_product_attention(q, k, v, is_causal=True)
        y = ops.reshape(y, (b, t, c.n_embd))
        return self.drop(self.proj(y), training=training)


class Block(layers.Layer):
    def __init__(self, c: GPTConfig, **kwargs):
        super().__init__(**kwargs)
        proj_std = 0.02 / math.sqrt(2 * c.n_layer)
        dt = self.dtype_policy
        self.ln_1 = _norm(c, dt, "ln_1")
        self.attn = CausalSelfAttention(c, dtype=dt, name="attn")
        self.ln_2 = _norm(c, dt, "ln_2")
        self.fc = layers.Dense(4 * c.n_embd, use_bias=c.bias, kernel_initializer=_init(),
                               dtype=dt, name="c_fc")
        self.fc_proj = layers.Dense(c.n_embd, use_bias=c.bias,
                                    kernel_initializer=_init(proj_std), dtype=dt, name="mlp_proj")
        self.drop = layers.Dropout(c.dropout, dtype=dt)

    def call(self, x, training=False):
        x = x + self.attn(self.ln_1(x), training=training)
        h = ops.gelu(self.fc(self.ln_2(x)), approximate=True)
        return x + self.drop(self.fc_proj(h), training=training)


class GPT(layers.Layer):
    """Token ids (batch, t) -> logits (batch, t, vocab_size)."""

    def __init__(self, c: GPTConfig, **kwargs):
        super().__init__(**kwargs)
        self.c = c
        dt = self.dtype_policy
        self.wte = layers.Embedding(c.vocab_size, c.n_embd, embeddings_initializer=_init(),
                                    dtype=dt, name="wte")
        self.wpe = layers.Embedding(c.block_size, c.n_embd, embeddings_initializer=_init(),
                                    dtype=dt, name="wpe")
        self.drop = layers.Dropout(c.dropout, dtype=dt)
        self.blocks = [Block(c, dtype=dt, name=f"h{i}") for i in range(c.n_layer)]
        self.ln_f = _norm(c, dt, "ln_f")

    def call(self, ids, training=False):
        t = ops.shape(ids)[1]
        x = self.wte(ids) + self.wpe(ops.arange(t))
        x = self.drop(x, training=training)
        for block in self.blocks:
            x = block(x, training=training)
        x = self.ln_f(x)
        # Tied output projection: logits = x @ wte^T (no separate lm_head weights).
        table = ops.cast(self.wte.embeddings, x.dtype)
        return ops.matmul(x, ops.transpose(table))
