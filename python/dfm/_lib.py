"""_lib — the ctypes binding to libdfm (the C library the `dfm` and `dfm-train` programs are built from).

Why ctypes: the surface is a dozen C functions over plain structs (shard/target_reader.h,
schemas/chunk_shard.h, common/error.h), so ctypes binds it with no compiler and no build step at
install time (`pip install ./python` stays a pure-Python install), and it releases the GIL during each
call, so reader threads run in parallel. A call costs about a microsecond, against 10-30 us for
decoding and checking one target record, so the binding keeps the C reader's speed (bench/results/
python_loader.md). cffi's ABI mode would be the same speed for one more dependency.

Where the library is found, first hit wins:
  1. $DFM_LIB: the path of a libdfm.so;
  2. a copy bundled in the installed package (dfm/libdfm.so; `pip install ./python` copies build/libdfm.so
     when it has been built: run `make` first);
  3. the source tree: <repo>/build/libdfm.so, when the package is used from python/ in a checkout.
A missing library raises LibraryNotFound (an ImportError) at the first call, not at import, so the
pure-Python reader (backend="python") still works without it.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

from dfm.errors import LibraryNotFound, error_for_code

HERE = os.path.dirname(os.path.abspath(__file__))
CANDIDATES = (os.path.join(HERE, "libdfm.so"), os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "libdfm.so"))

DFM_TARGET_END = 1


class Trec(ctypes.Structure):
    """dfm_trec (schemas/target_record.h): the caller's arrays one record is decoded into."""
    _fields_ = [("chunk_id", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("mask", ctypes.c_uint64),
                ("ids", ctypes.c_void_p), ("scores", ctypes.c_void_p), ("emb", ctypes.c_void_p)]


class TargetInfo(ctypes.Structure):
    """dfm_target_info (shard/target_reader.h)."""
    _fields_ = [("n_chunks", ctypes.c_uint64), ("k", ctypes.c_uint32), ("d", ctypes.c_uint32), ("dtype", ctypes.c_int),
                ("ids_only", ctypes.c_int), ("n_shards", ctypes.c_uint32), ("span", ctypes.c_uint64),
                ("raw_bytes", ctypes.c_uint64), ("stored_bytes", ctypes.c_uint64), ("fingerprint", ctypes.c_char * 17),
                ("generation", ctypes.c_char * 17), ("tokens_generation", ctypes.c_char * 17),
                ("n_ids", ctypes.c_uint64), ("slots", ctypes.c_int)]


class OpenOpts(ctypes.Structure):
    """dfm_target_open_opts (shard/target_reader.h)."""
    _fields_ = [("tokens_run", ctypes.c_char_p), ("k", ctypes.c_uint32), ("d", ctypes.c_uint32),
                ("n_chunks", ctypes.c_uint64), ("prefetch", ctypes.c_int)]


class ChunkMeta(ctypes.Structure):
    """dfm_chunk_meta (schemas/chunk_shard.h)."""
    _fields_ = [("doc_first", ctypes.c_uint64), ("doc_last", ctypes.c_uint64), ("n_valid", ctypes.c_uint16),
                ("flags", ctypes.c_uint16), ("reserved", ctypes.c_uint32)]


class ChunkShard(ctypes.Structure):
    """dfm_chunk_shard (schemas/chunk_shard.h): the 128-byte header as bytes, the read-only mapping."""
    _fields_ = [("path", ctypes.c_char_p), ("hdr", ctypes.c_uint8 * 128), ("map", ctypes.c_void_p),
                ("map_bytes", ctypes.c_size_t), ("record_bytes", ctypes.c_size_t)]


class ChunkSet(ctypes.Structure):
    """The public head of dfm_chunk_set (schemas/chunk_shard.h)."""
    _fields_ = [("n_shards", ctypes.c_int), ("shards", ctypes.POINTER(ctypes.POINTER(ChunkShard))),
                ("n_chunks", ctypes.c_uint64),
                ("chunk_len", ctypes.c_uint32), ("seq_len", ctypes.c_uint32), ("n_docs", ctypes.c_uint64)]


_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None


def library_path() -> str:
    """The libdfm.so this process uses (see the module docstring for the search order)."""
    env = os.environ.get("DFM_LIB")
    if env:
        if not os.path.isfile(env):
            raise LibraryNotFound(f"DFM_LIB={env} is not a file. HINT: point it at build/libdfm.so (make builds it)")
        return env
    for c in CANDIDATES:
        if os.path.isfile(c):
            return c
    raise LibraryNotFound("libdfm.so not found (looked at $DFM_LIB, %s). HINT: run `make` in the dfm checkout and "
                          "set DFM_LIB=<checkout>/build/libdfm.so, or reinstall with `pip install ./python` after "
                          "`make`, or use backend='python'" % ", ".join(CANDIDATES))


def lib() -> ctypes.CDLL:
    """The loaded library with its prototypes declared (loaded once per process)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    path = library_path()
    L = ctypes.CDLL(path)
    vp, u64, c_int = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
    protos = {
        "dfm_last_error": (ctypes.c_char_p, []),
        "dfm_strerror": (ctypes.c_char_p, [c_int]),
        "dfm_error_clear": (None, []),
        "dfm_target_reader_open": (c_int, [ctypes.c_char_p, ctypes.POINTER(OpenOpts), ctypes.POINTER(vp)]),
        "dfm_target_reader_close": (None, [vp]),
        "dfm_target_reader_info": (ctypes.POINTER(TargetInfo), [vp]),
        "dfm_target_reader_get": (c_int, [vp, u64, ctypes.POINTER(Trec)]),
        "dfm_target_reader_seek": (c_int, [vp, u64]),
        "dfm_target_reader_next": (c_int, [vp, ctypes.POINTER(Trec)]),
        "dfm_target_reader_raw": (c_int, [vp, u64, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_size_t)]),
        "dfm_chunk_set_open": (c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ChunkSet))]),
        "dfm_chunk_set_close": (None, [ctypes.POINTER(ChunkSet)]),
        "dfm_chunk_set_get": (c_int, [ctypes.POINTER(ChunkSet), u64, ctypes.POINTER(ctypes.POINTER(ChunkMeta)),
                                      ctypes.POINTER(ctypes.POINTER(ctypes.c_uint32))]),
        "dfm_checksum64": (u64, [vp, ctypes.c_size_t]),
        "dfm_manifest_read_generation": (c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]),
        "dfm_dtype_name": (ctypes.c_char_p, [c_int]),
        "dfm_tokenizer_load": (c_int, [ctypes.c_char_p, ctypes.POINTER(vp)]),
        "dfm_tokenizer_free": (None, [vp]),
        "dfm_tokenizer_decode": (c_int, [vp, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t, c_int,
                                         ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(L, name)
        fn.restype, fn.argtypes = res, args
    _lib, _path = L, path
    return L


def last_error(rc: int) -> str:
    """The C library's message for the failure rc (this thread's last error)."""
    L = lib()
    msg = L.dfm_last_error() or b""
    return msg.decode(errors="replace") or (L.dfm_strerror(rc) or b"").decode()


def check(rc: int, where: str = "") -> int:
    """Raise the dfm exception for a negative DFM_E* code (message from dfm_last_error); return rc otherwise."""
    if rc < 0:
        msg = last_error(rc)
        raise error_for_code(rc)(f"{where}: {msg}" if where else msg)
    return rc
