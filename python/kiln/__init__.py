"""kiln from Python: lower torch.export programs to ExecuTorch programs (.pte) and run them.

    import kiln
    lowered = kiln.lower(exported_program, backend="xnnpack")   # a torch.export.ExportedProgram, a .pt2, a spec
    lowered.write("model.pte")                                  # + model.json (metadata), model.debug.json
    print(lowered.delegation)                                   # delegate call sites, fallback operators, reasons
    module = kiln.load(lowered.pte, threads=4)                  # or a path
    logits, = module.forward(input_ids)                         # numpy arrays or torch tensors, read in place

Everything runs in kiln's C++ libraries (the extension module kiln._kiln); numpy is the only
dependency. torch is used only when you hand kiln torch objects, and never imported otherwise.
Every failure raises kiln.Error with the one-line message the `kiln` CLI prints.
"""
from __future__ import annotations

from ._kiln import Error
from ._lower import LoweredProgram, lower
from ._runtime import Module, Tokenizer, generate, load

__all__ = ["Error", "LoweredProgram", "Module", "Tokenizer", "generate", "load", "lower"]
__version__ = "0.1.0"
