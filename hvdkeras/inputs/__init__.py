"""Each rank's share of the training data, for every input kind Keras takes:
`tf.data` pipelines (`tf_data`), torch `DataLoader`s (`torch_data`), NumPy
arrays and `keras.utils.PyDataset`s (`arrays`); which rows a rank takes is
the pure `plan`; `epochs` keeps the samplers whose epoch follows `fit`'s.

Note [shard before shuffling]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Ranks must split the data first and shuffle afterwards. A pipeline that
shuffles and then shards gives each rank a shard of *its own* shuffled
order: the orders agree only while every rank's random state does (TF's
global seed with a shuffle's op seed), and users set a different seed per
rank on purpose (`keras.utils.set_random_seed(1234 + rank)`, so ranks draw
different dropout noise). Then the shards overlap, some rows are trained on
twice and others never, and nothing fails. Split first (every rank takes
rows r, r + N, ...: the same split whatever each rank's seed), then shuffle
within the shard: every row is seen exactly once per epoch across the
ranks. The helpers here do that, refuse a `tf.data` pipeline that already
shuffles, and cut the shards to equal length, so every rank runs the same
number of steps (a rank with one step more would wait in its gradient
collective for ranks that have stopped).

What may import this package: the facade, `hvdkeras.callbacks` (the sampler
epochs) and the recipes.
"""
