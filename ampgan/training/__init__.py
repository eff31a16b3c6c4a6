"""Training: the `python -m ampgan.train` entry (`entry`), the loop and the run lifecycle (`loop`),
full-state checkpoints (`checkpoint`), compiled steps lent across a sweep's jobs (`graph_pool`)
and the device, mode, threads and seeds (`hardware`).

`entry` is the composition root: config -> build (`ampgan.tasks`) -> loop -> tracking. The loop and
checkpoints never import tracking or the steps: they drive whatever task and tracker they are given.
"""
