"""errors — the exceptions of the dfm package.

Every problem with a run's data is a TargetError; the subclasses say which check failed. The C library's
integer codes (common/error.h) map onto them (error_for_code), and the pure-Python reader's own classes
(python/dfm_targets.py) are re-raised as these, so `except dfm.TargetError` catches both backends.
"""
from __future__ import annotations


class TargetError(Exception):
    """A run's tokens or targets cannot be used: missing, incomplete, damaged or from another run. The
    message names the file or shard and key, and usually a HINT with the fix."""


class TargetFormatError(TargetError):
    """Malformed data: wrong magic, impossible sizes, disordered or missing keys."""


class TargetChecksumError(TargetError):
    """A stored checksum does not match the data (a damaged file)."""


class TargetVersionError(TargetError):
    """A format version this reader does not know."""


class TargetMismatchError(TargetError):
    """Artefacts or arguments that do not belong together (another run, configuration, K or d)."""


class TargetTruncatedError(TargetError):
    """A file shorter than its header or sidecar says."""


class TargetNotFoundError(TargetError):
    """A file, shard or record that must exist does not."""


class TargetStateError(TargetError):
    """A stage the reader needs is not complete: never run, interrupted, or being rebuilt right now (the
    message names the writer from RUN/.lock)."""


class TargetRebuiltError(TargetStateError):
    """The run was rebuilt (`dfm write-targets --force`, `dfm build --force`) after this reader's first
    generation was opened: reading on would mix two generations. Open the run again for the new one."""


class TargetRangeError(TargetError, IndexError):
    """A chunk id, sequence or value outside its range (also an IndexError)."""


class LibraryNotFound(ImportError):
    """libdfm.so could not be found (see dfm._lib for where it is looked for)."""


# common/error.h codes
_BY_CODE = {-3: TargetFormatError, -4: TargetVersionError, -5: TargetChecksumError, -7: TargetMismatchError,
            -15: TargetNotFoundError, -16: TargetTruncatedError, -11: TargetFormatError, -14: TargetStateError}


def error_for_code(rc: int) -> type:
    """The exception class of a negative DFM_E* code (EARG, a bad argument, is a ValueError)."""
    if rc == -17:
        return TargetRangeError
    if rc == -6:
        return ValueError
    return _BY_CODE.get(rc, TargetError)


def from_pure(e: Exception) -> TargetError:
    """The dfm exception for one raised by python/dfm_targets.py (same class names)."""
    cls = {"TargetFormatError": TargetFormatError, "TargetChecksumError": TargetChecksumError,
           "TargetVersionError": TargetVersionError, "TargetMismatchError": TargetMismatchError,
           "TargetTruncatedError": TargetTruncatedError}.get(type(e).__name__, TargetError)
    return cls(str(e))
