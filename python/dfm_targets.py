"""dfm_targets — read a dfm run's target shards from Python (NumPy arrays, for PyTorch data loaders).

An independent implementation of schemas/target_record.md on `lmdb` + `zstandard` + `xxhash` + NumPy
(pip install lmdb zstandard xxhash numpy); it does not need the C library. It performs the same checks
as the C reader (shard/target_reader.h): manifest state and fingerprints, shard.json against the run,
data.mdb size, record count, every record's checksums, key order without gaps, and the per-shard
checksum over all records when a shard is read from its start. Errors are TargetError subclasses whose
message names the shard folder and the key.

    from dfm_targets import TargetRun
    with TargetRun("RUN") as run:
        print(run.n_chunks, run.k, run.d, run.dtype, run.store, run.slots)
        rec = run.get(1234)                 # dict: chunk_id, flags, seq_start, mask[K] bool, ids[K] int64,
                                            #       scores[K] float32, emb[K, d] float32
        for rec in run.records(start=0):    # key (= training) order
            ...
        for seq in run.sequences():         # stacked per training sequence: chunk_ids[n], mask[n, K], ...
            ...

What the slots hold (run.slots, schemas/target_record.md): "neighbour" (slot r = neighbour r), "continuation"
(slot r = the chunk after neighbour r in its own document, masked at a document end) or "both" (K = 2J: the J
neighbours, then their J continuations). A valid id is always the chunk whose embedding its slot holds.

A torch Dataset is a few lines: `__getitem__ = lambda i: torch.from_numpy(run.get(i)["emb"])`
(open the TargetRun inside each worker: LMDB handles do not survive fork).
"""

import contextlib
import json
import os
import time
import struct

import lmdb
import numpy as np
import xxhash
import zstandard

__all__ = ["TargetRun", "TargetError", "TargetChecksumError", "TargetVersionError", "TargetMismatchError",
           "TargetTruncatedError", "TargetFormatError", "decode_record"]

REC_MAGIC = b"DFTR"
REC_VERSION = 1
REC_HEADER = struct.Struct("<4sHHQHBBIIIQQ")  # 48 bytes, see schemas/target_record.h
TAB_HEADER = struct.Struct("<8sIIIIQQQQQ")    # 64 bytes, table.bin (store = ids)
F_SHUFFLE, F_RAW, F_IDS_ONLY, F_SEQ_START, F_EMPTY = 1, 2, 4, 8, 16
SLOTS = ("neighbour", "continuation", "both")  # header byte 19: what the slots hold (code = index)
DTYPES = {1: ("fp32", np.dtype("<f4")), 2: ("fp16", np.dtype("<f2")), 3: ("bf16", np.dtype("<u2"))}
DTYPE_CODES = {"fp32": 1, "fp16": 2, "bf16": 3}
UPSTREAM_STAGES = ("chunk", "encode", "index", "retrieve", "synthetic")


class TargetError(Exception):
    """Any problem with a run's targets; the message names the shard and key where there is one."""


class TargetFormatError(TargetError):
    pass


class TargetChecksumError(TargetError):
    pass


class TargetVersionError(TargetError):
    pass


class TargetMismatchError(TargetError):
    pass


class TargetTruncatedError(TargetError):
    pass


@contextlib.contextmanager
def _lmdb_errors(where):
    """LMDB's own errors (lmdb.InvalidError on a damaged meta page, lmdb.CorruptedError, ...) as TargetFormatError."""
    try:
        yield
    except lmdb.Error as e:
        raise TargetFormatError(f"{where}: LMDB cannot read the data.mdb ({type(e).__name__}: {e}); the file is damaged. "
                                "HINT: re-run 'dfm write-targets --force'") from None


def _to_f32(raw, dtype_code):
    if dtype_code == 1:
        return raw.view("<f4").astype(np.float32, copy=True)
    if dtype_code == 2:
        return raw.view("<f2").astype(np.float32)
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _payload_bytes(k, d, dtype_code, ids_only):
    return 8 + 12 * k + (0 if ids_only else k * d * DTYPES[dtype_code][1].itemsize)


_dctx = zstandard.ZstdDecompressor()


def decode_record(buf, k=None, d=None, dtype_code=None, ids_only=None, slots=None):
    """Decode and validate one stored record (bytes). Returns (header dict, mask, ids, scores, emb-or-None,
    payload checksum). slots: the expected slots code (index in SLOTS). Raises TargetVersionError /
    TargetChecksumError / TargetFormatError / TargetMismatchError."""
    buf = bytes(buf)
    if len(buf) < REC_HEADER.size:
        raise TargetTruncatedError(f"record of {len(buf)} bytes is shorter than its {REC_HEADER.size}-byte header")
    (magic, version, flags, chunk_id, hk, hdtype, hslots, hd, payload_bytes, stored_bytes, psum,
     hsum) = REC_HEADER.unpack_from(buf)
    if magic != REC_MAGIC:
        raise TargetFormatError(f"not a target record (magic {magic!r})")
    if version != REC_VERSION:
        raise TargetVersionError(f"target record format version {version}; this reader reads version {REC_VERSION}")
    if stored_bytes != len(buf) - REC_HEADER.size:
        raise TargetFormatError(f"chunk {chunk_id}: record of {len(buf)} bytes, header says {stored_bytes} stored bytes")
    stored = buf[REC_HEADER.size:]
    seed = xxhash.xxh3_64_intdigest(buf[:40])
    if xxhash.xxh3_64_intdigest(stored, seed=seed) != hsum:
        raise TargetChecksumError(f"target record checksum mismatch (chunk id field {chunk_id}): the stored record is damaged")
    if hdtype not in DTYPES or not 1 <= hk <= 64 or hd < 1 or hslots >= len(SLOTS) or (hslots == 2 and hk % 2) or flags & ~31:
        raise TargetFormatError(f"chunk {chunk_id}: impossible header (K {hk}, d {hd}, dtype {hdtype}, slots {hslots}, "
                                f"flags {flags:#x})")
    rec_ids_only = bool(flags & F_IDS_ONLY)
    if payload_bytes != _payload_bytes(hk, hd, hdtype, rec_ids_only):
        raise TargetFormatError(f"chunk {chunk_id}: payload_bytes {payload_bytes} does not fit K {hk}, d {hd}")
    if (k is not None and hk != k) or (d is not None and hd != d) or (dtype_code is not None and hdtype != dtype_code) or \
            (ids_only is not None and rec_ids_only != ids_only) or (slots is not None and hslots != slots):
        raise TargetMismatchError(f"chunk {chunk_id}: record has K {hk}, d {hd}, dtype {hdtype}, slots {SLOTS[hslots]}; the run "
                                  f"says K {k}, d {d}, dtype {dtype_code}, slots {slots if slots is None else SLOTS[slots]}")
    if flags & F_RAW:
        if stored_bytes != payload_bytes:
            raise TargetFormatError(f"chunk {chunk_id}: raw record size {stored_bytes} != payload {payload_bytes}")
        payload = stored
    else:
        try:
            payload = _dctx.decompress(stored, max_output_size=payload_bytes)
        except zstandard.ZstdError as e:
            raise TargetFormatError(f"chunk {chunk_id}: zstd frame does not decode: {e}") from None
        if len(payload) != payload_bytes:
            raise TargetFormatError(f"chunk {chunk_id}: decompressed to {len(payload)} bytes, header says {payload_bytes}")
    off = 8 + 12 * hk
    es = DTYPES[hdtype][1].itemsize
    if flags & F_SHUFFLE:
        n = hk * hd
        emb_b = np.frombuffer(payload, np.uint8, offset=off).reshape(es, n).T.tobytes()
        payload = payload[:off] + emb_b
    if xxhash.xxh3_64_intdigest(payload) != psum:
        raise TargetChecksumError(f"chunk {chunk_id}: payload checksum mismatch")
    mask = struct.unpack_from("<Q", payload, 0)[0]
    ids = np.frombuffer(payload, "<i8", count=hk, offset=8).copy()
    scores = np.frombuffer(payload, "<f4", count=hk, offset=8 + 8 * hk).copy()
    valid = np.array([(mask >> i) & 1 for i in range(hk)], dtype=bool)
    if hk < 64 and mask >> hk:
        raise TargetFormatError(f"chunk {chunk_id}: mask {mask:#x} has bits at or above K = {hk}")
    if bool(flags & F_EMPTY) != (mask == 0) or (flags & F_SEQ_START and mask):
        raise TargetFormatError(f"chunk {chunk_id}: flags {flags:#x} disagree with mask {mask:#x}")
    if np.any(ids[valid] < 0) or np.any(ids[~valid] != -1):
        raise TargetFormatError(f"chunk {chunk_id}: ids disagree with the mask (valid slots need ids >= 0, masked ones -1)")
    if hslots == 2:  # both: continuation slot J + r only with neighbour slot r, holding its id + 1
        j = hk // 2
        cont = valid[j:]
        if np.any(cont & ~valid[:j]) or np.any(ids[j:][cont] != ids[:j][cont] + 1):
            raise TargetFormatError(f"chunk {chunk_id}: slots 'both' with a continuation slot that does not follow its "
                                    f"neighbour slot (mask {mask:#x})")
    emb = None
    if not rec_ids_only:
        emb = _to_f32(np.frombuffer(payload, np.uint8, offset=off), hdtype).reshape(hk, hd)
    header = dict(chunk_id=chunk_id, flags=flags, k=hk, d=hd, dtype=hdtype, slots=SLOTS[hslots], payload_bytes=payload_bytes,
                  stored_bytes=stored_bytes)
    return header, valid, ids, scores, emb, psum


def _key(chunk_id):
    return struct.pack(">Q", chunk_id)


def _hash_compact(obj):
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "%016x" % xxhash.xxh3_64_intdigest(text.encode())


def upstream_of(manifest):
    """Fingerprints of a manifest's upstream stages (as dfm_target_upstream in C; configs holding
    floats may format differently from jansson's and then compare unequal)."""
    out = {}
    stages = manifest.get("stages", {})
    for name in UPSTREAM_STAGES:
        st = stages.get(name)
        if st is None:
            continue
        out[name] = _hash_compact({"config": st.get("config"), "inputs": st.get("inputs")})
    return out


def _fingerprint(upstream, fmt):
    up = json.dumps(upstream, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    text = "%s|k=%u|d=%u|dtype=%d|ids=%d|shuffle=%d|level=%d|shards=%u|n=%u|v=%u" % (
        up, fmt["k"], fmt["d"], DTYPE_CODES[fmt["dtype"]], fmt["store"] == "ids", bool(fmt["shuffle"]), fmt["zstd_level"],
        fmt["n_shards"], fmt["n_chunks"], REC_VERSION)
    if fmt.get("n_ids"):  # shard/target_layout.c: these two only when present
        text += "|n_ids=%u" % fmt["n_ids"]
    if fmt.get("slots", "neighbour") != "neighbour":
        text += "|slots=%s" % fmt["slots"]
    return "%016x" % xxhash.xxh3_64_intdigest(text.encode())


class _Shard:
    def __init__(self, run, s, fmt):
        self.dir = os.path.join(run, "targets", "shard-%05d" % s)
        side = os.path.join(self.dir, "shard.json")
        if not os.path.exists(side):
            raise TargetError(f"{side} does not exist: the shard is incomplete. HINT: re-run 'dfm write-targets'")
        with open(side) as f:
            m = json.load(f)
        self.meta = m
        if m.get("format") != "dfm-target-shard" or m.get("version") != 1:
            raise TargetVersionError(f"{side}: format {m.get('format')} version {m.get('version')} is not dfm-target-shard 1")
        span = fmt["span"]
        first = min(s * span, fmt["n_chunks"])
        n = min(first + span, fmt["n_chunks"]) - first
        want = dict(shard=s, n_shards=fmt["n_shards"], n_chunks_total=fmt["n_chunks"], first_chunk=first, n_chunks=n,
                    k=fmt["k"], d=fmt["d"], dtype=fmt["dtype"], store=fmt["store"], shuffle=fmt["shuffle"],
                    zstd_level=fmt["zstd_level"], slots=fmt.get("slots", "neighbour"))
        for key, val in want.items():
            if m.get(key, "neighbour" if key == "slots" else None) != val:
                raise TargetMismatchError(f"{self.dir}: {key} is {m.get(key)}, the run expects {val}. HINT: these targets "
                                          "belong to another run or configuration; re-run 'dfm write-targets'")
        if m["fingerprint"] != fmt["fingerprint"]:
            raise TargetMismatchError(f"{self.dir}: run fingerprint {m['fingerprint']}, the run expects {fmt['fingerprint']}")
        if m["records"] != n:
            raise TargetFormatError(f"{self.dir}: shard.json says {m['records']} records for {n} chunks")
        data = os.path.join(self.dir, "data.mdb")
        size = os.path.getsize(data)
        if size != m["data_bytes"]:
            raise TargetTruncatedError(f"{data} is {size} bytes, shard.json says {m['data_bytes']} (truncated or modified)")
        self.first, self.n = first, n
        with _lmdb_errors(f"shard {self.dir}"):
            self.env = lmdb.open(self.dir, readonly=True, lock=False, subdir=True, create=False)
            entries = self.env.stat()["entries"]
        if entries != m["records"]:
            raise TargetFormatError(f"{self.dir}: data.mdb holds {entries} records, shard.json says {m['records']}")
        self.table = None
        if fmt["store"] == "ids":
            self._open_table(fmt)

    def _open_table(self, fmt):
        path = os.path.join(self.dir, "table.bin")
        buf = np.fromfile(path, dtype=np.uint8)
        if buf.size != self.meta["table_bytes"] or buf.size < TAB_HEADER.size:
            raise TargetTruncatedError(f"{path} is {buf.size} bytes, shard.json says {self.meta['table_bytes']}")
        hb = buf[:TAB_HEADER.size].tobytes()
        magic, version, dtype, d, _, first, n_rows, pbytes, psum, hsum = TAB_HEADER.unpack(hb)
        if magic != b"DFMTTAB1" or version != 1:
            raise TargetFormatError(f"{path}: not a version-1 target table")
        if xxhash.xxh3_64_intdigest(hb[:56]) != hsum:
            raise TargetChecksumError(f"{path}: header checksum mismatch")
        if dtype != DTYPE_CODES[fmt["dtype"]] or d != fmt["d"] or first != self.first or n_rows != self.n or \
                pbytes != buf.size - TAB_HEADER.size:
            raise TargetFormatError(f"{path}: header disagrees with shard.json")
        rows = buf[TAB_HEADER.size:]
        if xxhash.xxh3_64_intdigest(rows.tobytes()) != psum:
            raise TargetChecksumError(f"{path}: rows checksum mismatch (damaged file)")
        self.table = rows.view(DTYPES[dtype][1]).reshape(n_rows, d) if n_rows else rows.view(DTYPES[dtype][1]).reshape(0, d)

    def close(self):
        self.env.close()


def _generations(run_dir, tokens_run):
    """(targets stage generation, tokens run's chunk stage generation, targets complete) from the manifests."""
    def load(run):
        try:
            with open(os.path.join(run, "manifest.json")) as f:
                return json.load(f).get("stages", {})
        except (OSError, ValueError):
            return {}
    st = load(run_dir)
    tst = load(tokens_run) if tokens_run else st
    t = st.get("targets") or {}
    return t.get("generation", ""), (tst.get("chunk") or {}).get("generation", ""), t.get("state") == "complete"


class TargetRun:
    """A run's target shards. See the module docstring. Like the C reader, it opens one generation whole
    (the manifests read again after every shard is open; a rebuild meanwhile opens again, 5 attempts, then
    TargetError) and reads it until closed: generation and tokens_generation say which."""

    def __init__(self, run_dir, tokens_run=None, k=None, d=None, n_chunks=None):
        for attempt in range(5):
            before = _generations(run_dir, tokens_run)
            try:
                self._open(run_dir, tokens_run, k, d, n_chunks)
            except TargetError:
                if _generations(run_dir, tokens_run) == before:
                    raise  # its own error, not a rebuild's
                self.shards = self.shards if hasattr(self, "shards") else []
                self.close()
            else:
                now = _generations(run_dir, tokens_run)
                if now == before and now[2]:
                    self.generation, self.tokens_generation = now[0], now[1]
                    return
                self.close()
            time.sleep(0.05 * 2 ** attempt)
        raise TargetError(f"the targets of {run_dir} were rebuilt while they were opened, 5 times. HINT: open them again "
                          "when the rebuild ('dfm write-targets --force', 'dfm build --force') is over")

    def _open(self, run_dir, tokens_run, k, d, n_chunks):
        self.run_dir = run_dir
        self.shards = []
        man_path = os.path.join(run_dir, "manifest.json")
        if not os.path.exists(man_path):
            raise TargetError(f"{man_path} does not exist")
        with open(man_path) as f:
            man = json.load(f)
        st = man.get("stages", {}).get("targets")
        if not st or st.get("state") != "complete":
            holder = ""
            try:
                with open(os.path.join(run_dir, ".lock")) as f:
                    holder = f.readline().strip()
            except OSError:
                pass
            if holder:
                raise TargetError(f"the 'targets' stage of run {run_dir} is being rebuilt by {holder}. HINT: open it "
                                  "again when that finishes")
            raise TargetError(f"targets of {run_dir} are not complete. HINT: run 'dfm write-targets {run_dir}'")
        fmt = st.get("format")
        if not fmt or fmt.get("record_version") != REC_VERSION:
            raise TargetVersionError(f"{man_path}: targets format {fmt and fmt.get('record_version')}; this reader reads {REC_VERSION}")
        if _fingerprint(fmt["upstream"], fmt) != fmt["fingerprint"]:
            raise TargetMismatchError(f"{man_path}: targets fingerprint does not match its own format (edited manifest)")
        if tokens_run is not None:
            with open(os.path.join(tokens_run, "manifest.json")) as f:
                cur = upstream_of(json.load(f))
            for name in UPSTREAM_STAGES:
                a, b = fmt["upstream"].get(name), cur.get(name)
                if a != b:
                    raise TargetMismatchError(f"the targets of {run_dir} were built from a '{name}' stage with fingerprint {a}, "
                                              f"but {tokens_run}'s manifest now has {b}")
        self.fmt = fmt
        self.n_chunks, self.k, self.d = fmt["n_chunks"], fmt["k"], fmt["d"]
        self.dtype, self.store, self.n_shards, self.span = fmt["dtype"], fmt["store"], fmt["n_shards"], fmt["span"]
        self.fingerprint = fmt["fingerprint"]
        self._dtype_code = DTYPE_CODES[self.dtype]
        self._ids_only = self.store == "ids"
        self.slots = fmt.get("slots", "neighbour")
        if self.slots not in SLOTS or (self.slots == "both" and self.k % 2):
            raise TargetFormatError(f"{man_path}: targets format slots {self.slots!r} with K {self.k}")
        self._slots_code = SLOTS.index(self.slots)
        self._n_ids = fmt.get("n_ids") or fmt["n_chunks"]
        if (k is not None and k != self.k) or (d is not None and d != self.d) or (n_chunks is not None and n_chunks != self.n_chunks):
            raise TargetMismatchError(f"targets of {run_dir} have K {self.k}, d {self.d}, {self.n_chunks} chunks; "
                                      f"the caller expects K {k}, d {d}, {n_chunks} chunks")
        self.shards = []
        try:
            for s in range(self.n_shards):
                self.shards.append(_Shard(run_dir, s, fmt))
        except BaseException:  # whatever stopped the opening: close the shards already open, then let it through
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for s in self.shards:
            s.close()
        self.shards = []

    def __len__(self):
        return self.n_chunks

    def _where(self, shard, chunk_id):
        return f"shard {shard.dir} key {chunk_id:016x} (chunk {chunk_id})"

    def _decode(self, shard, chunk_id, value):
        try:
            hdr, mask, ids, scores, emb, psum = decode_record(value, self.k, self.d, self._dtype_code, self._ids_only,
                                                              self._slots_code)
            if hdr["chunk_id"] != chunk_id:
                raise TargetFormatError(f"record header says chunk {hdr['chunk_id']}")
            if np.any(ids[mask] >= self._n_ids):
                raise TargetFormatError(f"neighbour ids outside the {self._n_ids} chunks they index")
            if emb is None:
                emb = np.zeros((self.k, self.d), np.float32)
                for slot in np.nonzero(mask)[0]:
                    nid = int(ids[slot])
                    sh = self.shards[nid // self.span]
                    emb[slot] = _to_f32(sh.table[nid - sh.first].view(np.uint8), self._dtype_code)
        except TargetError as e:
            raise type(e)(f"{self._where(shard, chunk_id)}: {e}") from None
        rec = dict(chunk_id=chunk_id, flags=hdr["flags"], seq_start=bool(hdr["flags"] & F_SEQ_START), mask=mask, ids=ids,
                   scores=scores, emb=emb)
        return rec, psum

    def get(self, chunk_id):
        """The record of one chunk id (random access)."""
        if not 0 <= chunk_id < self.n_chunks:
            raise IndexError(f"chunk {chunk_id} outside the run's {self.n_chunks} chunks")
        shard = self.shards[chunk_id // self.span]
        with _lmdb_errors(self._where(shard, chunk_id)), shard.env.begin() as txn:
            value = txn.get(_key(chunk_id))
            if value is None:
                raise TargetError(f"{self._where(shard, chunk_id)}: no record")
            return self._decode(shard, chunk_id, value)[0]

    def records(self, start=0):
        """Records in key order from chunk id start, checking order, gaps and per-shard checksums."""
        nxt = start
        for si in range(start // self.span if self.n_chunks else self.n_shards, self.n_shards):
            shard = self.shards[si]
            whole = nxt == shard.first
            h = xxhash.xxh3_64()
            seen = 0
            with _lmdb_errors(f"shard {shard.dir}"), shard.env.begin() as txn:
                cur = txn.cursor()
                ok = cur.set_range(_key(nxt))
                while ok:
                    key, value = cur.item()
                    (cid,) = struct.unpack(">Q", key)
                    if cid != nxt:
                        raise TargetFormatError(f"{self._where(shard, cid)}: expected key of chunk {nxt} (gap, duplicate or disorder)")
                    rec, psum = self._decode(shard, cid, value)
                    h.update(key)
                    h.update(struct.pack("<Q", psum))
                    seen += 1
                    nxt += 1
                    yield rec
                    ok = cur.next()
            if nxt != shard.first + shard.n:
                raise TargetFormatError(f"{self._where(shard, nxt)}: records end before the shard's range does (gap)")
            if whole and (seen != shard.meta["records"] or "%016x" % h.intdigest() != shard.meta["records_checksum"]):
                raise TargetChecksumError(f"shard {shard.dir}: {seen} records with combined checksum {h.intdigest():016x}; "
                                          f"shard.json says {shard.meta['records']} and {shard.meta['records_checksum']}")

    __iter__ = records

    def sequences(self, start=0):
        """Records grouped by training sequence (a new one starts at each SEQ_START record), stacked:
        dict of chunk_ids[n], mask[n, K], ids[n, K], scores[n, K], emb[n, K, d]."""
        group = []
        for rec in self.records(start):
            if rec["seq_start"] and group:
                yield self._stack(group)
                group = []
            group.append(rec)
        if group:
            yield self._stack(group)

    @staticmethod
    def _stack(group):
        return dict(chunk_ids=np.array([r["chunk_id"] for r in group], np.int64),
                    mask=np.stack([r["mask"] for r in group]), ids=np.stack([r["ids"] for r in group]),
                    scores=np.stack([r["scores"] for r in group]), emb=np.stack([r["emb"] for r in group]))
