"""data — dfm-train's batches from Python: tokens, next-token labels and target memory, in the order and
with the bytes of dfm-train's loader (trainer/data/data.c, trainer/data/prefetch.c).

    import dfm
    for b in dfm.Batches("RUN", seq_len=128, batch=8, rank=0, world=1, seed=1, epoch=0):
        b.tokens   # [B, T] int32      inputs: sequence i is tokens [i*T, i*T+T)
        b.labels   # [B, T] int32      next tokens [i*T+1, i*T+T+1); -1 = no target (padding)
        b.memory   # [B, NC, K, d] float32  target memory of the sequence's NC = T/L chunks (None: no targets)
        b.mask     # [B, NC, K] uint8  1 = slot valid; chunk 0 of every sequence is all 0 (no context)
        b.idx      # [B] int64         sequence indices

The data (dfm-train's --data and --targets): RUN is a run folder whose chunk stage gives the tokens and
whose targets stage gives the memory; `data=` (an llm.c token shard or a chunk run) and `targets=` (a
run folder with targets, or a simple targets file of `dfm-train synth`) override either.

The order (dfm-train train, trainer/run/train_loop.c): the last val_seqs sequences (0 = 5 %, at least one
batch) are held out; the training sequences are shuffled per epoch from (seed, epoch); every step
draws world*B sequences of that order and rank r keeps the r-th B. One epoch of full steps is
yielded (ntrain // (world*B) batches), or `steps` batches continuing into the next epochs exactly as
dfm-train does. split="heldout" gives dfm-train eval's batches instead (the held-out sequences in
order; with world > 1 rank r keeps batches r, r+W, ...).

Arrays are written in place by the C reader (no copies); as a torch IterableDataset (format="torch")
the same memory is wrapped as tensors (torch.frombuffer). Under a DataLoader with num_workers > 0,
worker w of n yields batches w, w+n, ... (the DataLoader interleaves them back into order) and opens
its own reader. threads=N reads batches in N threads of this process instead: libdfm decodes without
the GIL, and no batch crosses a process boundary, which DataLoader workers pay for with a shared-memory
hand-off per batch (bench/results/python_loader.md).

While the run is rebuilt (`dfm write-targets --force`, `dfm build --force`): the tokens are read from one
generation of the chunk stage, and every reader this object opens (per thread, per DataLoader worker)
must find the targets generation its first reader opened; an open reader keeps reading its generation
even as the files are replaced. A reader that would find a newer one raises TargetRebuiltError instead of
mixing it into the epoch: make a new Batches to train on the new targets (schemas/manifest.md, "Readers
during a rebuild"). Each reader holds one open file per target shard (see dfm.targets).
"""
from __future__ import annotations

import collections
import ctypes
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, NamedTuple, Optional, Tuple

import numpy as np

from dfm import _lib
from dfm.errors import (TargetError, TargetFormatError, TargetMismatchError, TargetRebuiltError, TargetTruncatedError,
                        TargetChecksumError)

try:  # a torch IterableDataset when torch is present
    from torch.utils.data import IterableDataset as _Base, get_worker_info as _worker_info
except ImportError:  # pragma: no cover - torch is optional
    _Base = object

    def _worker_info():
        return None

TGT_MAGIC, TGT_HEADER = b"DFMTGTS1", 64
BIN_MAGIC, BIN_MAGIC_U32, BIN_VERSION_U32 = 20240520, 20240801, 7


class Batch(NamedTuple):
    """One micro-batch (shapes in the module docstring); epoch, pos: the loader position after it, as a
    dfm-train checkpoint stores it (train split; 0 for heldout)."""
    idx: object
    tokens: object
    labels: object
    memory: object
    mask: object
    epoch: int
    pos: int


def _dist_rank() -> Tuple[int, int]:
    """(rank, world size) of an initialised torch.distributed process group, else (0, 1)."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return 0, 1


# ---- tokens --------------------------------------------------------------------------------------------
def _is_run(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "manifest.json"))


def generation(run: str, stage: str) -> str:
    """The generation of a run's complete stage (schemas/manifest.md, "Readers"); raises TargetStateError
    when it is not complete, naming the writer when one is rebuilding it."""
    buf = ctypes.create_string_buffer(17)
    _lib.check(_lib.lib().dfm_manifest_read_generation(os.fsencode(run), stage.encode(), buf), f"{run}")
    return buf.value.decode()


def _generation_is(run: str, stage: str, gen: str) -> bool:
    try:
        return generation(run, stage) == gen
    except TargetError:  # being rebuilt
        return False


def load_tokens(path: str) -> Tuple[np.ndarray, Optional[np.ndarray], int]:
    """Tokens of a chunk run (its shards in chunk-id order, via libdfm) or an llm.c token shard.
    Returns (tokens [N] int32, pad [N] uint8 or None (1 = filler after a document's end), chunk_len L or
    0 for a token shard). A run's tokens are of one generation of its chunk stage: read again when it was
    rebuilt meanwhile (5 attempts), then TargetRebuiltError."""
    return _load_tokens(path)[:3]


def _load_tokens(path: str) -> Tuple[np.ndarray, Optional[np.ndarray], int, str]:
    """load_tokens and the chunk stage's generation they were read from ("" for a token shard)."""
    if not _is_run(path):
        return (*_load_shard_tokens(path), "")
    for attempt in range(5):
        before = generation(path, "chunk")
        try:
            out = _load_run_tokens(path)
        except TargetError:
            if _generation_is(path, "chunk", before):
                raise  # its own error, not a rebuild's
            out = None
        if out is not None and _generation_is(path, "chunk", before):
            return (*out, before)
        time.sleep(0.05 * 2 ** attempt)
    raise TargetRebuiltError(f"the chunks of {path} were rebuilt while they were read, 5 times. HINT: read them "
                             "again when the rebuild is over")


def _load_run_tokens(path: str) -> Tuple[np.ndarray, Optional[np.ndarray], int]:
    L = _lib.lib()
    cs = ctypes.POINTER(_lib.ChunkSet)()
    _lib.check(L.dfm_chunk_set_open(os.fsencode(path), ctypes.byref(cs)), f"tokens of {path}")
    try:  # every shard was checked whole by dfm_chunk_set_open; its records are read from its mapping
        n, cl = int(cs.contents.n_chunks), int(cs.contents.chunk_len)
        tok = np.empty((n, cl), np.int32)
        pad = None
        for i in range(cs.contents.n_shards):
            sh = cs.contents.shards[i].contents
            hdr = bytes(sh.hdr)
            first, count = int.from_bytes(hdr[32:40], "little"), int.from_bytes(hdr[40:48], "little")
            rb = int(sh.record_bytes)
            if rb != 24 + 4 * cl or first + count > n or 128 + count * rb > sh.map_bytes:
                raise TargetFormatError(f"{path}: chunk shard {sh.path.decode()} does not fit the run")
            if not count:
                continue
            rec = np.ctypeslib.as_array((ctypes.c_uint8 * (count * rb)).from_address(sh.map + 128)).reshape(count, rb)
            tok[first:first + count] = rec[:, 24:].view("<u4")
            nv = rec[:, 16:18].view("<u2")[:, 0]
            short = np.nonzero(nv < cl)[0]
            if short.size:  # filler after a document's end (doc-aligned runs)
                if pad is None:
                    pad = np.zeros((n, cl), np.uint8)
                pad[first + short] = (np.arange(cl)[None, :] >= nv[short, None]).astype(np.uint8)
    finally:
        L.dfm_chunk_set_close(cs)
    if (tok < 0).any():
        raise TargetFormatError(f"{path}: a token id above 2^31")
    return tok.reshape(-1), None if pad is None else pad.reshape(-1), cl


def _load_shard_tokens(path: str) -> Tuple[np.ndarray, Optional[np.ndarray], int]:
    buf = np.fromfile(path, np.uint8)
    if buf.size < 1024:
        raise TargetTruncatedError(f"{path}: {buf.size} bytes, shorter than the 1024-byte token-shard header")
    h = buf[:1024].view("<i4")
    w = 2 if (h[0], h[1]) == (BIN_MAGIC, 1) else 4 if (h[0], h[1]) in ((BIN_MAGIC_U32, BIN_VERSION_U32), (BIN_MAGIC, 2)) else 0
    if not w:
        raise TargetFormatError(f"{path}: token shard magic {h[0]} version {h[1]} unknown (20240520/1 = uint16, "
                                "20240801/7 = uint32)")
    n = int(h[2]) & 0xFFFFFFFF
    if buf.size != 1024 + n * w:
        raise TargetTruncatedError(f"{path}: header says {n} tokens of {w} bytes but the file has {buf.size} bytes")
    raw = buf[1024:].view("<u2" if w == 2 else "<u4")
    if w == 4 and n and raw.max() > 0x7FFFFFFF:
        raise TargetFormatError(f"{path}: a token id above 2^31")
    return raw.astype(np.int32), None, 0


def _checksum64(buf: np.ndarray) -> int:
    """XXH3-64 of a uint8 array (common/fsutil.h dfm_checksum64): libdfm's, else the xxhash package's."""
    try:
        return int(_lib.lib().dfm_checksum64(buf.ctypes.data, buf.size))
    except ImportError:
        import xxhash
        return xxhash.xxh3_64_intdigest(buf.tobytes())


# ---- a simple targets file (schemas/targets_file.md) ---------------------------------------------------
class TargetsFile:
    """`dfm-train synth`'s targets file: mask [n_chunks, K] uint8 and emb [n_chunks, K, d] float32, checked
    as trainer/data/data.c checks it (magic, version, sizes, checksum, finite values)."""

    def __init__(self, path: str) -> None:
        buf = np.fromfile(path, np.uint8)
        if buf.size < TGT_HEADER or buf[:8].tobytes() != TGT_MAGIC:
            raise TargetFormatError(f"{path} is not a targets file (magic {TGT_MAGIC.decode()})")
        ver, k, d, cl = (int(x) for x in buf[8:24].view("<u4"))
        n, ck = (int(x) for x in buf[24:40].view("<u8"))
        if ver != 1:
            raise TargetFormatError(f"{path}: targets file version {ver} (1 known)")
        if not (0 < k <= 4096 and 0 < d <= 65536):
            raise TargetFormatError(f"{path}: k {k}, d {d} out of range")
        if n * k * (1 + 4 * d) != buf.size - TGT_HEADER:
            raise TargetTruncatedError(f"{path}: {buf.size} bytes, but its header's {n} chunks x {k} slots x d {d} "
                                       f"need {TGT_HEADER + n * k * (1 + 4 * d)}")
        pay = buf[TGT_HEADER:]
        if _checksum64(pay) != ck:
            raise TargetChecksumError(f"{path}: payload checksum mismatch (file corrupt)")
        self.mask = pay[:n * k].reshape(n, k)
        self.emb = pay[n * k:].copy().view("<f4").reshape(n, k, d)  # copied: the payload is not 4-aligned
        if not np.isfinite(self.emb).all():
            raise TargetFormatError(f"{path}: the target memory holds a non-finite value")
        self.path, self.k, self.d, self.chunk_len, self.n_chunks = path, k, d, cl, n


# ---- the loader's order (trainer/data/data.c make_order, trainer/kernels/rng.h) -------------------------------------
_M64 = (1 << 64) - 1


def permutation(first: int, count: int, seed: int, epoch: int) -> np.ndarray:
    """Sequence order of an epoch: dfm-train's Fisher-Yates over xorshift64* seeded with
    seed * 1000003 + epoch. Returns [count] int64."""
    order = list(range(first, first + count))
    s = ((((seed * 1000003 + epoch) & _M64) * 0x9E3779B97F4A7C15) + 1) & _M64
    for i in range(count, 1, -1):
        s ^= s >> 12
        s ^= (s << 25) & _M64
        s ^= s >> 27
        j = (((s * 0x2545F4914F6CDD1D) & _M64) >> 32) % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return np.array(order, np.int64)


class Batches(_Base):
    """dfm-train's micro-batches for one rank (see the module docstring).

    Arguments: run (a run folder, or None with data= and targets=), seq_len T, batch B, rank, world (None:
    torch.distributed's when it is initialised, else 0 and 1),
    seed (dfm-train --seed), epoch (first epoch); keywords: data, targets (override run), tokens_run
    (the token run the targets must belong to; default: data when it is a run), chunk_len L (default:
    the chunk run's, the targets file's, else 32 as dfm-train), val_seqs (dfm-train --val-seqs),
    split ("train" | "heldout"), steps (batches to yield; None = one epoch), eval_batches (heldout: at
    most this many, 0 = all), format ("numpy" | "torch"), with_targets (False: tokens only),
    backend ("auto" | "c" | "python": the target reader, see dfm.open_run; a chunk run's tokens are
    always read through libdfm), threads (batches read in parallel by this many threads
    of this process, each with its own reader: libdfm decodes without the GIL; yielded in order).

    len() is the number of batches this rank yields. Attributes after construction: n_seq, ntrain,
    nval, NC, K, d, L.
    """

    def __init__(self, run: Optional[str], seq_len: int, batch: int, rank: Optional[int] = None,
                 world: Optional[int] = None, seed: int = 1,
                 epoch: int = 0, *, data: Optional[str] = None, targets: Optional[str] = None,
                 tokens_run: Optional[str] = None, chunk_len: Optional[int] = None, val_seqs: int = 0,
                 split: str = "train", steps: Optional[int] = None, eval_batches: int = 0, format: str = "numpy",
                 with_targets: bool = True, backend: str = "auto", threads: int = 1) -> None:
        if rank is None or world is None:  # DDP: torch.distributed's rank and world size once it is initialised
            r, w = _dist_rank()
            rank, world = (r if rank is None else rank), (w if world is None else world)
        if not (0 <= rank < world):
            raise ValueError(f"rank {rank} of world {world}")
        if seq_len <= 0 or batch <= 0:
            raise ValueError(f"seq_len {seq_len} and batch {batch} must be positive")
        if split not in ("train", "heldout") or format not in ("numpy", "torch"):
            raise ValueError(f"split {split!r} (train|heldout), format {format!r} (numpy|torch)")
        self.data = data or run
        self.targets = targets if targets is not None else (run if with_targets else None)
        if self.data is None:
            raise ValueError("no tokens: give a run folder or data=")
        self.T, self.B, self.rank, self.world, self.seed, self.epoch0 = seq_len, batch, rank, world, seed, epoch
        self.split, self.steps, self.format, self.backend = split, steps, format, backend
        self.threads = max(1, int(threads))
        if backend == "auto":
            try:
                _lib.lib()
                self.backend = "c"
            except ImportError:
                self.backend = "python"
        if self.backend == "python" and self.threads > 1:
            raise ValueError("threads > 1 needs the C backend (the pure reader's LMDB opens a shard once per process)")
        self.tokens, self.pad, cl, tgen = _load_tokens(self.data)
        self.tokens_run = tokens_run or (self.data if _is_run(self.data) else None)
        n = self.tokens.size
        self.n_seq = (n - 1) // seq_len if n > 1 else 0
        if self.n_seq < 2:
            raise TargetError(f"{self.data}: {n} tokens make fewer than 2 sequences of {seq_len}")
        self._tfile: Optional[TargetsFile] = None
        self.K = self.d = 0
        if self.targets and not _is_run(self.targets):
            self._tfile = TargetsFile(self.targets)
        if chunk_len is None:
            chunk_len = cl or (self._tfile.chunk_len if self._tfile else 32)
        if cl and cl != chunk_len:
            raise TargetMismatchError(f"tokens are cut in chunks of {cl}, chunk_len is {chunk_len}")
        if self.targets and seq_len % chunk_len:
            raise ValueError(f"sequence length {seq_len} is not a multiple of the chunk length {chunk_len}")
        self.L, self.NC = chunk_len, seq_len // chunk_len
        self._gen: Optional[str] = None  # the targets generation every reader of this object reads (none mixes two)
        if self._tfile is not None:
            if self._tfile.chunk_len != chunk_len:
                raise TargetMismatchError(f"{self.targets}: targets were built for chunks of {self._tfile.chunk_len} "
                                          f"tokens, chunk_len is {chunk_len}")
            self.K, self.d, n_t = self._tfile.k, self._tfile.d, self._tfile.n_chunks
        elif self.targets:
            with self._open_reader() as r:  # checks the run in this process; workers reopen
                self.K, self.d, n_t = r.k, r.d, r.n_chunks
                if tgen and self.tokens_run == self.data and r.tokens_generation != tgen:
                    raise TargetRebuiltError(f"the chunks of {self.data} were rebuilt after their tokens were read "
                                             f"(generation {tgen}, now {r.tokens_generation}). HINT: make the Batches again")
        if self.targets and n_t * chunk_len < self.n_seq * seq_len:
            raise TargetMismatchError(f"{self.targets} has targets for {n_t} chunks, the tokens need "
                                      f"{self.n_seq * seq_len // chunk_len}")
        nval = val_seqs if val_seqs > 0 else self.n_seq // 20
        self.nval = max(nval, batch)
        if split == "train" and self.nval >= self.n_seq:
            raise ValueError(f"{self.n_seq} sequences leave nothing to train on after {self.nval} held out")
        self.nval = min(self.nval, self.n_seq)
        self.ntrain = self.n_seq - self.nval
        self.eval_batches = eval_batches
        self._readers: list = []  # this process's readers; a free one waits in _free
        self._free: "queue.SimpleQueue" = queue.SimpleQueue()
        self._readers_pid = -1
        self._orders: dict = {}

    # -- schedule -----------------------------------------------------------------------------------
    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: permutation(0, self.ntrain, self.seed, epoch)}
        return self._orders[epoch]

    def __len__(self) -> int:
        if self.split == "heldout":
            nb = self.nval // self.B
            if self.eval_batches > 0:
                nb = min(nb, self.eval_batches)
            return len(range(self.rank, nb, self.world))
        if self.steps is not None:
            return self.steps
        return self.ntrain // (self.B * self.world)

    def schedule(self) -> Iterator[Tuple[np.ndarray, int, int]]:
        """(sequence indices [B] int64, epoch, pos after) of every batch this rank yields, in order."""
        B = self.B
        if self.split == "heldout":
            first = self.n_seq - self.nval
            for i in range(self.rank, (min(self.nval // B, self.eval_batches) if self.eval_batches > 0
                                       else self.nval // B), self.world):
                yield np.arange(first + i * B, first + i * B + B, dtype=np.int64), 0, 0
            return
        epoch, pos = self.epoch0, 0
        for _ in range(len(self)):
            for w in range(self.world):  # every rank draws the shared order, keeps its slice (prefetch.c)
                take: List[np.ndarray] = []
                need = B
                while need:
                    if pos >= self.ntrain:
                        epoch, pos = epoch + 1, 0
                    o = self._order(epoch)
                    n = min(need, self.ntrain - pos)
                    if w == self.rank:
                        take.append(o[pos:pos + n])
                    pos += n
                    need -= n
                if w == self.rank:
                    idx = take[0] if len(take) == 1 else np.concatenate(take)
            yield idx, epoch, pos

    # -- reading ------------------------------------------------------------------------------------
    def _open_reader(self):
        """A reader of the targets generation this object first opened (each thread and DataLoader worker
        opens its own): a rebuild since is TargetRebuiltError, never batches of two generations."""
        from dfm.targets import open_run
        r = open_run(self.targets, tokens_run=self.tokens_run, backend=self.backend, prefetch=-1)
        g = getattr(r, "generation", "")
        if self._gen is None:
            self._gen = g
        elif g != self._gen:
            r.close()
            raise TargetRebuiltError(f"the targets of {self.targets} were rebuilt since this Batches opened them "
                                     f"(generation {self._gen}, now {g}); reading on would mix the two. HINT: make "
                                     "the Batches again (a new epoch) to read the new targets")
        return r

    def _acquire(self):
        """A reader of this process no other thread is using (LMDB handles do not survive fork; the C
        reader opens its shards MDB_NOTLS, so a reader may change threads between uses)."""
        if self._readers_pid != os.getpid():
            self._readers, self._free, self._readers_pid = [], queue.SimpleQueue(), os.getpid()
        try:
            return self._free.get_nowait()
        except queue.Empty:
            r = self._open_reader()
            self._readers.append(r)
            return r

    def read(self, idx: np.ndarray, epoch: int = 0, pos: int = 0) -> Batch:
        """The batch of sequences idx ([B] int64), NumPy arrays (as data_batch in trainer/data/data.c)."""
        T, B, NC, K, d = self.T, len(idx), self.NC, self.K, self.d
        rows = (idx[:, None] * T + np.arange(T + 1)[None, :])
        win = self.tokens[rows]
        # copies (not ascontiguousarray: for one row the slices already count as contiguous, and labels -1
        # written below would show in the tokens, one position on)
        tokens, labels = win[:, :T].copy(), win[:, 1:].copy()
        if self.pad is not None:
            pw = self.pad[rows]
            labels[(pw[:, :T] | pw[:, 1:]) != 0] = -1
        memory = mask = None
        if self.targets:
            chunks = (idx[:, None] * NC + np.arange(NC)[None, :]).reshape(-1)
            if self._tfile is not None:
                memory = self._tfile.emb[chunks].reshape(B, NC, K, d)
                mask = self._tfile.mask[chunks].reshape(B, NC, K).copy()
            else:
                if self.format == "torch":  # written in place into the tensor handed out (shared memory in a
                    memory = _torch_buffer((B, NC, K, d))  # DataLoader worker: sent to the parent uncopied)
                    bits = self._read_records(chunks, memory.data_ptr())
                else:
                    memory = np.empty((B, NC, K, d), np.float32)
                    bits = self._read_records(chunks, memory.ctypes.data)
                mask = ((bits[:, None] >> np.arange(K, dtype=np.uint64)[None, :]) & np.uint64(1)).astype(np.uint8)
                mask = mask.reshape(B, NC, K)
            mask[:, 0, :] = 0  # the first chunk of a sequence has no target
        return Batch(idx, tokens, labels, memory, mask, epoch, pos)

    def _read_records(self, chunks: np.ndarray, base: int) -> np.ndarray:
        """Records of chunks decoded straight into the float32 rows [n, K, d] at address base (memory this
        object allocated); their masks as [n] uint64."""
        r = self._acquire()
        try:
            return self._decode(r, chunks, base)
        finally:
            self._free.put(r)

    def _decode(self, r, chunks: np.ndarray, base: int) -> np.ndarray:
        bits = np.empty(len(chunks), np.uint64)
        stride = self.K * self.d * 4
        if not hasattr(r, "_t"):  # the pure-Python backend
            for i, c in enumerate(chunks.tolist()):
                rec = r.get(c)
                ctypes.memmove(base + i * stride, rec["emb"].ctypes.data, stride)
                bits[i] = sum(1 << j for j, v in enumerate(rec["mask"]) if v)
            return bits
        t, get, h, tref = r._t, r._get, r._h, r._tref  # the C fast path: one ctypes call per record
        for i, c in enumerate(chunks.tolist()):
            t.emb = base + i * stride
            rc = get(h, c, tref)
            if rc:
                _lib.check(rc, f"{self.targets} chunk {c}")
            bits[i] = t.mask
        return bits

    def __iter__(self) -> Iterator[Batch]:
        wi = _worker_info()
        wid, nw = (wi.id, wi.num_workers) if wi is not None else (0, 1)
        conv = to_torch if self.format == "torch" else (lambda b: b)
        mine = (job for i, job in enumerate(self.schedule()) if i % nw == wid)
        if self.threads == 1:
            for idx, epoch, pos in mine:
                yield conv(self.read(idx, epoch, pos))
            return
        with ThreadPoolExecutor(self.threads) as ex:  # 2 batches per thread in flight, handed out in order
            pending: collections.deque = collections.deque()
            for idx, epoch, pos in mine:
                pending.append(ex.submit(self.read, idx, epoch, pos))
                if len(pending) >= 2 * self.threads:
                    yield conv(pending.popleft().result())
            while pending:
                yield conv(pending.popleft().result())

    def close(self) -> None:
        """Close this process's target readers (reopened on the next read)."""
        if self._readers_pid == os.getpid():
            for r in self._readers:
                r.close()
        self._readers, self._free, self._readers_pid = [], queue.SimpleQueue(), -1

    def __getstate__(self) -> dict:  # to spawned workers: without the readers
        st = dict(self.__dict__)
        st["_readers"], st["_free"], st["_readers_pid"] = [], None, -1
        return st

    def __setstate__(self, st: dict) -> None:
        self.__dict__.update(st)
        self._free = queue.SimpleQueue()


def _torch_buffer(shape: tuple):
    """An uninitialised float32 tensor, in shared memory inside a DataLoader worker."""
    import torch
    t = torch.empty(shape, dtype=torch.float32)
    return t.share_memory_() if _worker_info() is not None else t


def to_torch(b: Batch) -> Batch:
    """The batch as torch tensors over the same memory (torch.frombuffer: no copy, and no dependence on
    torch's NumPy bridge, which torch builds for NumPy 1 lack under NumPy 2): tokens/labels int32,
    memory float32, mask bool, idx int64."""
    import torch

    def wrap(a, dt):
        if a is None or isinstance(a, torch.Tensor):
            return a
        a = np.ascontiguousarray(a)
        if a.size == 0:
            return torch.zeros(a.shape, dtype=dt)
        return torch.frombuffer(a, dtype=dt).view(a.shape)

    m = wrap(b.mask, torch.uint8)
    return Batch(wrap(b.idx, torch.int64), wrap(b.tokens, torch.int32), wrap(b.labels, torch.int32),
                 wrap(b.memory, torch.float32), None if m is None else m.bool(), b.epoch, b.pos)


def read_dump(path: str) -> List[Batch]:
    """The batches of a `dfm-train dump-batches` file (layout: schemas/batch_dump.md), checked
    (magic, version, sizes, payload checksum): NumPy arrays as Batches yields them (idx int64, tokens and
    labels int32, mask uint8, memory float32)."""
    b = np.fromfile(path, np.uint8)
    if b.size < 64 or b[:8].tobytes() != b"DFMBTCH1":
        raise TargetFormatError(f"{path} is not a dump-batches file (magic DFMBTCH1)")
    ver, flags, B, T, NC, K, d, _ = (int(x) for x in b[8:40].view("<u4"))
    nb, pbytes, ck = (int(x) for x in b[40:64].view("<u8"))
    if ver != 1:
        raise TargetFormatError(f"{path}: dump version {ver} (1 known)")
    S = B * NC * K
    per = 16 + 8 * B + 8 * B * T + ((S + 4 * S * d) if flags & 1 else 0)
    if pbytes != b.size - 64 or nb * per != pbytes:
        raise TargetTruncatedError(f"{path}: {b.size - 64} payload bytes; the header says {pbytes} = {nb} x {per}")
    if _lib.lib().dfm_checksum64(b[64:].ctypes.data, pbytes) != ck:
        raise TargetChecksumError(f"{path}: payload checksum mismatch")
    out, o = [], 64

    def take(n: int, dt: str, shape: tuple) -> np.ndarray:
        nonlocal o
        a = b[o:o + n].view(dt).reshape(shape)
        o += n
        return a

    for _ in range(nb):
        ep, pos = (int(x) for x in take(16, "<u8", (2,)))
        idx = take(8 * B, "<i8", (B,))
        tok, lab = take(4 * B * T, "<i4", (B, T)), take(4 * B * T, "<i4", (B, T))
        mk = mem = None
        if flags & 1:
            mk, mem = take(S, "u1", (B, NC, K)), take(4 * S * d, "<f4", (B, NC, K, d))
        out.append(Batch(idx, tok, lab, mem, mk, ep, pos))
    return out
