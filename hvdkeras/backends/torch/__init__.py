"""The PyTorch backend: collectives as registered torch custom ops with
autograd (`ops`) and their public functions (`collectives`); Keras's torch
trainer reaches them through `hvdkeras.backends.optimizer`.

Tensors live in host memory: a CUDA tensor is refused with a clear error
until the GPU path serves this binding.

What may import this package: the facade's dispatch (`hvdkeras.backends.dispatch`).
"""
