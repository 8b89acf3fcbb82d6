"""recurnorm.train: corpora, tokenizers, TrainConfig (``.config``), presets and the training loop.

Modules are imported on use (``recurnorm.train.data``, ``.tokenizer``,
``.presets``, ``.loop``) so that loading a corpus does not import torch.
"""
