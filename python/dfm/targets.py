"""targets — a run's target shards through the C reader (shard/target_reader.h), as NumPy arrays.

    import dfm
    with dfm.open_run("RUN") as run:             # checks manifest, fingerprints, every shard (C reader)
        run.n_chunks, run.k, run.d, run.dtype    # dtype is the stored one; arrays are always float32
        rec = run.get(1234)                      # one record (random access), see TargetRun.get
        for rec in run.records(start=0): ...     # key (= training) order, with order and shard checksums
        for seq in run.sequences(): ...          # stacked per training sequence

Every record is decoded and checked by libdfm before it is handed out; any failure raises a
dfm.TargetError subclass naming the shard and key. backend="python" uses the pure-Python reader
(python/dfm_targets.py: needs lmdb, zstandard, xxhash) instead, with the same interface.

A handle holds LMDB read transactions and a prefetch thread: it does not survive fork. Open one per
process (dfm.Batches does so in each DataLoader worker) and one per thread.
"""
from __future__ import annotations

import ctypes
import os
from typing import Dict, Iterator, Optional

import numpy as np

from dfm import _lib
from dfm.errors import TargetError, TargetRangeError, from_pure

F_SEQ_START = 8

Record = Dict[str, object]


class TargetRun:
    """A run's target shards, read by libdfm.

    Attributes: run_dir, n_chunks (records, ids 0..n_chunks-1), k (slots K), d (embedding width),
    dtype ("fp32" | "fp16" | "bf16": stored; arrays handed out are float32), store ("embeddings" | "ids"),
    slots ("neighbour" | "continuation" | "both": what the K slots hold, schemas/target_record.md; with "both"
    slots [0, K/2) are the neighbours and [K/2, K) their continuations; a valid id is the chunk whose
    embedding its slot holds), n_shards, span (chunk ids per shard), fingerprint, raw_bytes, stored_bytes, generation (of the targets
    opened: this handle reads them, whole, until closed, even while the run is rebuilt), tokens_generation
    (of the tokens run's chunk stage its upstream was checked against).
    """

    def __init__(self, run_dir: str, tokens_run: Optional[str] = None, k: Optional[int] = None,
                 d: Optional[int] = None, n_chunks: Optional[int] = None, prefetch: int = 0) -> None:
        """Open and check RUN's targets. tokens_run: the run whose tokens are trained on (its upstream
        stages must be those the targets were built from); k, d, n_chunks: expected shape (None = accept).
        prefetch: records decoded ahead by records()' thread (0 = 64, < 0 = no thread)."""
        self.run_dir = run_dir
        self._h = ctypes.c_void_p()
        self._pid = os.getpid()  # before the open: a failure after it still closes the handle (close, __del__)
        L = _lib.lib()
        self._L = L
        o = _lib.OpenOpts(tokens_run.encode() if tokens_run else None, k or 0, d or 0, n_chunks or 0, prefetch)
        _lib.check(L.dfm_target_reader_open(os.fsencode(run_dir), ctypes.byref(o), ctypes.byref(self._h)))
        inf = L.dfm_target_reader_info(self._h).contents
        self.n_chunks, self.k, self.d = int(inf.n_chunks), int(inf.k), int(inf.d)
        self.dtype = L.dfm_dtype_name(inf.dtype).decode()
        self.store = "ids" if inf.ids_only else "embeddings"
        self.slots = ("neighbour", "continuation", "both")[inf.slots]
        self.n_shards, self.span = int(inf.n_shards), int(inf.span)
        self.raw_bytes, self.stored_bytes = int(inf.raw_bytes), int(inf.stored_bytes)
        self.fingerprint = inf.fingerprint.decode()
        # the generations opened (schemas/manifest.md, "Readers"): the reader reads these until it is closed
        self.generation, self.tokens_generation = inf.generation.decode(), inf.tokens_generation.decode()
        # one reusable descriptor for the fast path (get_into): ids and scores land in these scratch arrays
        self._ids = np.empty(self.k, np.int64)
        self._scores = np.empty(self.k, np.float32)
        self._t = _lib.Trec(0, 0, 0, self._ids.ctypes.data, self._scores.ctypes.data, None)
        self._tref = ctypes.byref(self._t)
        self._get = L.dfm_target_reader_get

    # -- lifetime -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the reader (stops its prefetch thread). Idempotent."""
        if getattr(self, "_h", None) and self._h.value and self._pid == os.getpid():
            self._L.dfm_target_reader_close(self._h)
        if getattr(self, "_h", None):
            self._h = ctypes.c_void_p()

    def __enter__(self) -> "TargetRun":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except (AttributeError, TypeError):  # at interpreter exit, ctypes and module globals may already be gone
            pass

    def __len__(self) -> int:
        return self.n_chunks

    def __getstate__(self) -> None:
        raise TypeError("a TargetRun holds LMDB handles and cannot be pickled: open one per process")

    def _live(self) -> None:
        if not self._h.value:
            raise ValueError(f"TargetRun({self.run_dir!r}) is closed")
        if self._pid != os.getpid():
            raise RuntimeError("this TargetRun was opened in another process (LMDB handles do not survive fork): "
                               "open one per worker")

    # -- records ------------------------------------------------------------------------------------
    def get_into(self, chunk_id: int, emb: np.ndarray) -> int:
        """Decode chunk_id's record with its embeddings written into emb (a C-contiguous float32 array of
        K*d elements, e.g. a [K, d] view into a batch: no copy). Returns the slot mask as an int (bit i =
        slot i valid). The fast path of dfm.Batches."""
        if emb.dtype != np.float32 or emb.size != self.k * self.d or not emb.flags.c_contiguous:
            raise ValueError(f"emb must be C-contiguous float32 of {self.k}*{self.d} elements")
        return self.get_at(chunk_id, emb.ctypes.data)

    def get_at(self, chunk_id: int, address: int) -> int:
        """get_into with the destination as a raw address (K*d float32 there must be writable; unchecked:
        for callers that computed it from an array they own)."""
        t = self._t
        t.emb = address
        rc = self._get(self._h, chunk_id, self._tref)
        if rc:
            _lib.check(rc, f"{self.run_dir} chunk {chunk_id}")
        return t.mask

    def _record(self, t: "_lib.Trec", ids: np.ndarray, scores: np.ndarray, emb: np.ndarray) -> Record:
        m = int(t.mask)
        return dict(chunk_id=int(t.chunk_id), flags=int(t.flags), seq_start=bool(t.flags & F_SEQ_START),
                    mask=np.array([(m >> i) & 1 for i in range(self.k)], dtype=bool), ids=ids, scores=scores, emb=emb)

    def get(self, chunk_id: int) -> Record:
        """One chunk's record: dict of chunk_id (int), flags (int), seq_start (bool), mask [K] bool,
        ids [K] int64 (neighbour chunk ids, -1 where masked), scores [K] float32, emb [K, d] float32.
        Raises TargetRangeError (an IndexError) outside 0..n_chunks-1, TargetError on damage."""
        self._live()
        if not 0 <= chunk_id < self.n_chunks:
            raise TargetRangeError(f"chunk {chunk_id} outside the run's {self.n_chunks} chunks")
        ids, scores, emb = np.empty(self.k, np.int64), np.empty(self.k, np.float32), np.empty((self.k, self.d), np.float32)
        t = _lib.Trec(0, 0, 0, ids.ctypes.data, scores.ctypes.data, emb.ctypes.data)
        _lib.check(self._get(self._h, chunk_id, ctypes.byref(t)))
        return self._record(t, ids, scores, emb)

    def records(self, start: int = 0) -> Iterator[Record]:
        """Records in key (= training) order from chunk id start, as get() returns them. The C iterator
        also checks key order without gaps and, for each shard read from its first record, its record
        count and combined checksum against shard.json."""
        self._live()
        _lib.check(self._L.dfm_target_reader_seek(self._h, start))
        nxt = self._L.dfm_target_reader_next
        while True:
            ids, scores, emb = np.empty(self.k, np.int64), np.empty(self.k, np.float32), np.empty((self.k, self.d), np.float32)
            t = _lib.Trec(0, 0, 0, ids.ctypes.data, scores.ctypes.data, emb.ctypes.data)
            rc = nxt(self._h, ctypes.byref(t))
            if rc == _lib.DFM_TARGET_END:
                return
            _lib.check(rc)
            yield self._record(t, ids, scores, emb)

    __iter__ = records

    def sequences(self, start: int = 0) -> Iterator[Record]:
        """Records grouped by training sequence (a new one starts at each SEQ_START record), stacked:
        dict of chunk_ids [n] int64, mask [n, K] bool, ids [n, K] int64, scores [n, K] float32,
        emb [n, K, d] float32."""
        group: list = []
        for rec in self.records(start):
            if rec["seq_start"] and group:
                yield stack(group)
                group = []
            group.append(rec)
        if group:
            yield stack(group)

    def raw(self, chunk_id: int) -> bytes:
        """The stored bytes of chunk_id's record (schemas/target_record.md)."""
        self._live()
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        _lib.check(self._L.dfm_target_reader_raw(self._h, chunk_id, ctypes.byref(p), ctypes.byref(n)))
        return ctypes.string_at(p, n.value)


def stack(group: list) -> Record:
    """Records stacked along a new first axis (see TargetRun.sequences)."""
    return dict(chunk_ids=np.array([r["chunk_id"] for r in group], np.int64),
                mask=np.stack([r["mask"] for r in group]), ids=np.stack([r["ids"] for r in group]),
                scores=np.stack([r["scores"] for r in group]), emb=np.stack([r["emb"] for r in group]))


class PyTargetRun:
    """The same interface over the pure-Python reader (python/dfm_targets.py), its errors as dfm's."""

    def __init__(self, run_dir: str, tokens_run: Optional[str] = None, k: Optional[int] = None,
                 d: Optional[int] = None, n_chunks: Optional[int] = None, prefetch: int = 0) -> None:
        import dfm_targets  # imported here: it needs lmdb, zstandard and xxhash
        self._mod = dfm_targets
        try:
            self._r = dfm_targets.TargetRun(run_dir, tokens_run=tokens_run, k=k, d=d, n_chunks=n_chunks)
        except dfm_targets.TargetError as e:
            raise from_pure(e) from None
        r = self._r
        self.run_dir, self.n_chunks, self.k, self.d, self.dtype = run_dir, r.n_chunks, r.k, r.d, r.dtype
        self.store, self.n_shards, self.span, self.fingerprint = r.store, r.n_shards, r.span, r.fingerprint
        self.slots = r.slots
        self.generation, self.tokens_generation = r.generation, r.tokens_generation

    def _wrap(self, it: Iterator[Record]) -> Iterator[Record]:
        try:
            yield from it
        except self._mod.TargetError as e:
            raise from_pure(e) from None

    def get(self, chunk_id: int) -> Record:
        try:
            return self._r.get(chunk_id)
        except IndexError as e:
            raise TargetRangeError(str(e)) from None
        except self._mod.TargetError as e:
            raise from_pure(e) from None

    def get_into(self, chunk_id: int, emb: np.ndarray) -> int:
        rec = self.get(chunk_id)
        emb.reshape(self.k, self.d)[...] = rec["emb"]
        return sum(1 << i for i, v in enumerate(rec["mask"]) if v)

    def records(self, start: int = 0) -> Iterator[Record]:
        return self._wrap(self._r.records(start))

    __iter__ = records

    def sequences(self, start: int = 0) -> Iterator[Record]:
        return self._wrap(self._r.sequences(start))

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> "PyTargetRun":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.n_chunks


def open_run(run_dir: str, tokens_run: Optional[str] = None, k: Optional[int] = None, d: Optional[int] = None,
             n_chunks: Optional[int] = None, backend: str = "auto", prefetch: int = 0):
    """Open RUN's target shards: backend "c" (libdfm, the default when it is found), "python" (the pure
    reader) or "auto" (C, else Python). See TargetRun for the arguments and the interface."""
    if backend not in ("auto", "c", "python"):
        raise ValueError(f"backend {backend!r}: auto, c or python")
    if backend == "auto":
        try:
            _lib.lib()
            backend = "c"
        except ImportError:
            backend = "python"
    cls = TargetRun if backend == "c" else PyTargetRun
    return cls(run_dir, tokens_run=tokens_run, k=k, d=d, n_chunks=n_chunks, prefetch=prefetch)


__all__ = ["TargetRun", "PyTargetRun", "open_run", "TargetError"]
