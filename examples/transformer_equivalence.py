"""N ranks against one process on the Keras example "Text classification
with Transformer": the same model (token and position embeddings, one
transformer block, Adam), trained on N ranks with 1/N of each global batch
and, on rank 0, in one process on the whole global batches; prints how far
apart the weights end (the largest difference in any weight, and the
largest relative to each tensor's largest value, per table).

    hvdkerasrun -np 2 python examples/transformer_equivalence.py
    hvdkerasrun -np 4 python examples/transformer_equivalence.py --steps 64

The example's sizes by default (vocabulary 20,000, 200 tokens, width 32);
dropout is off, since ranks draw their own masks. Random token ids stand in
for IMDB's reviews (no download here); `--sparse-as-dense` densifies the
embedding gradients instead.
"""

from __future__ import annotations

import argparse

import keras
import numpy as np
import tensorflow as tf

import hvdkeras as hvd


class TokenAndPositionEmbedding(keras.layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(vocab_size, embed_dim)
        self.pos_emb = keras.layers.Embedding(maxlen, embed_dim)

    def call(self, x):
        positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
        return self.token_emb(x) + self.pos_emb(positions)


class TransformerBlock(keras.layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, **kwargs):
        super().__init__(**kwargs)
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([keras.layers.Dense(ff_dim, activation="relu"),
                                     keras.layers.Dense(embed_dim)])
        self.norm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.norm2 = keras.layers.LayerNormalization(epsilon=1e-6)

    def call(self, inputs):
        out1 = self.norm1(inputs + self.att(inputs, inputs))
        return self.norm2(out1 + self.ffn(out1))


def build(args, optimizer):
    keras.utils.set_random_seed(7)
    inputs = keras.Input((args.maxlen,), dtype="int32")
    x = TokenAndPositionEmbedding(args.maxlen, args.vocabulary, args.width)(inputs)
    x = TransformerBlock(args.width, 2, 32)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dense(20, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocabulary", type=int, default=20000)
    parser.add_argument("--maxlen", type=int, default=200)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--sparse-as-dense", action="store_true")
    args = parser.parse_args()
    tf.config.experimental.enable_op_determinism()
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    per_rank = args.global_batch // n
    rng = np.random.default_rng(0)
    x = rng.integers(0, args.vocabulary, size=(args.steps * args.global_batch, args.maxlen))
    y = rng.integers(0, 2, size=(args.steps * args.global_batch,))
    mine = np.concatenate([np.arange(s * args.global_batch + r * per_rank,
                                     s * args.global_batch + (r + 1) * per_rank)
                           for s in range(args.steps)])
    model = build(args, hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3),
                                                 sparse_as_dense=args.sparse_as_dense,
                                                 name="transformer"))
    model.fit(x[mine], y[mine], batch_size=per_rank, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    if r != 0:
        return
    reference = build(args, keras.optimizers.Adam(1e-3))
    reference.fit(x, y, batch_size=args.global_batch, shuffle=False, verbose=0)
    worst = 0.0
    for got, want, variable in zip(model.get_weights(), reference.get_weights(),
                                   reference.weights):
        apart = float(np.max(np.abs(got - want)))
        worst = max(worst, apart)
        if "embedding" in variable.path:
            scale = max(float(np.max(np.abs(want))), 1e-12)
            print(f"{variable.path}: {apart:.3g} ({apart / scale:.3g} of its largest value)")
    print(f"{n} ranks, {args.steps} steps, "
          f"{'sparse_as_dense' if args.sparse_as_dense else 'default settings'}: largest "
          f"difference from one process {worst:.3g}", flush=True)


if __name__ == "__main__":
    main()
