"""Notebook 03, input pipelines: TFRecord shards written and read by the torch DataLoader and by
tf.data behind injected storage latency, and what share of a step waits for data.

    ladder       the input ladder (naive → shards → parallel reads → prefetch → cache), per framework
    read_rates   page-cache reading rates, reading mechanisms, loader processes to feed a GPU, CRC demo
    step_probe   a real training step to put behind a pipeline, in both frameworks
    findings     the numbers and verdicts drawn from the ladders and the reading mechanisms
"""
