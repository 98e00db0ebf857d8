"""gemmgen in PyTorch: custom ops (gemmgen::mm, gemmgen::linear), gemmgen.nn.Linear, and the kernel registry.

torch is imported by the modules that need it (ops, nn, registry), never by this package's __init__ or by stats,
so `gemmgen.stats()` answers without torch and the core never needs it.

    import gemmgen
    layer = gemmgen.nn.Linear(4096, 14336, activation="gelu", device="cuda", dtype=torch.bfloat16)
    y = layer(x)                          # a tuned kernel when `gemmgen tune-linear` stored one, else torch
    gemmgen.stats()                       # kernel calls and fallbacks (by reason)
"""
