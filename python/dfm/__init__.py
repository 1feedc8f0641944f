"""dfm — DFM training targets and batches for PyTorch trainers, over libdfm (the C library of the dfm
pipeline and of dfm-train).

    import dfm
    run = dfm.open_run("RUN")                                 # the run's target shards (C reader)
    for b in dfm.Batches("RUN", seq_len=128, batch=8, seed=1): # dfm-train's batches: tokens, labels, memory
        ...
    mods = dfm.torch.DFMModules.from_safetensors("OUT/dfm_modules.safetensors")   # needs torch

Modules: dfm.targets (TargetRun, open_run), dfm.data (Batches, load_tokens), dfm.torch (modules on a
backbone; imported on first use), dfm.errors. `python -m dfm inspect RUN --chunk N` prints a record as
`dfm inspect` does. Where libdfm.so is found: dfm._lib.
"""
from dfm._version import __version__
from dfm.data import Batch, Batches, load_tokens, permutation, read_dump
from dfm.errors import (LibraryNotFound, TargetChecksumError, TargetError, TargetFormatError, TargetMismatchError,
                        TargetNotFoundError, TargetRangeError, TargetTruncatedError, TargetVersionError)
from dfm.targets import PyTargetRun, TargetRun, open_run

__all__ = ["__version__", "Batch", "Batches", "load_tokens", "permutation", "read_dump", "open_run", "TargetRun", "PyTargetRun",
           "TargetError", "TargetFormatError", "TargetChecksumError", "TargetVersionError", "TargetMismatchError",
           "TargetTruncatedError", "TargetNotFoundError", "TargetRangeError", "LibraryNotFound"]


def __getattr__(name: str):
    if name == "torch":  # dfm.torch on first use, so `import dfm` does not need torch
        import importlib
        return importlib.import_module("dfm.torch")
    raise AttributeError(f"module 'dfm' has no attribute {name!r}")
