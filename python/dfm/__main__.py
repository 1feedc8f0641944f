"""python -m dfm — command-line tools of the package.

    python -m dfm inspect RUN --chunk ID [--values N] [--tokenizer FILE] [--backend c|python]
        one target record, printed as `dfm inspect` prints it (shard/target_check.c print_record): flags,
        neighbours' ids, scores and mask in rank order, the first values of each embedding, and, when
        the run has chunks and a tokenizer, the texts of the query chunk, the chunk before it and the
        valid neighbours.
    python -m dfm version
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from typing import Optional

import dfm
from dfm import _lib

F_SEQ_START, F_EMPTY, F_SHUFFLE = 8, 16, 1


class _Texts:
    """Chunk texts through libdfm's tokenizer and chunk shards (None when the run has none)."""

    def __init__(self, run: str, tokenizer: Optional[str]) -> None:
        self.cs = self.tok = None
        man = os.path.join(run, "manifest.json")
        with open(man) as f:
            chunk = json.load(f).get("stages", {}).get("chunk")
        if not chunk:
            return
        tp = tokenizer or (chunk.get("tokenizer") or {}).get("path")
        try:
            L = _lib.lib()
        except ImportError:  # the pure-Python backend without libdfm: no texts
            if tokenizer:
                raise
            return
        tok = ctypes.c_void_p()
        rc = L.dfm_tokenizer_load(tp.encode(), ctypes.byref(tok)) if tp else -15
        if rc:
            if tokenizer:  # a tokenizer asked for must load
                _lib.check(rc, f"tokenizer {tokenizer}")
            L.dfm_error_clear()  # texts are a bonus: a run whose tokenizer is gone prints none
            return
        cs = ctypes.POINTER(_lib.ChunkSet)()
        _lib.check(L.dfm_chunk_set_open(os.fsencode(run), ctypes.byref(cs)), f"inspect {run}: the chunk texts")
        self.L, self.tok, self.cs = L, tok, cs
        self.libc = ctypes.CDLL(None)

    def text(self, chunk_id: int) -> Optional[str]:
        if not self.cs:
            return None
        meta, ids = ctypes.POINTER(_lib.ChunkMeta)(), ctypes.POINTER(ctypes.c_uint32)()
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        if self.L.dfm_chunk_set_get(self.cs, chunk_id, ctypes.byref(meta), ctypes.byref(ids)) or \
                self.L.dfm_tokenizer_decode(self.tok, ids, meta.contents.n_valid, 0, ctypes.byref(p), ctypes.byref(n)):
            self.L.dfm_error_clear()
            return None
        s = ctypes.string_at(p, n.value).decode("utf-8", errors="replace")
        self.libc.free(p)
        return s.replace("\n", " ").replace("\t", " ")

    def close(self) -> None:
        if self.cs:
            self.L.dfm_chunk_set_close(self.cs)
            self.L.dfm_tokenizer_free(self.tok)


def _f(x: float, width: int) -> str:
    return "%+.*f" % (width, x)


def inspect(run_dir: str, chunk: int, nvals: int = 4, tokenizer: Optional[str] = None, backend: str = "c") -> None:
    """Print chunk's record of RUN as `dfm inspect RUN --chunk ID` does."""
    with dfm.open_run(run_dir, backend=backend, prefetch=-1) as run:
        rec = run.get(chunk)
        texts = _Texts(run_dir, tokenizer)
        try:
            mask = sum(1 << i for i, v in enumerate(rec["mask"]) if v)
            fl = rec["flags"]
            print("chunk %d  K %d  d %d  dtype %s  store %s%s  flags%s%s%s  mask 0x%016x (%d valid)" % (
                rec["chunk_id"], run.k, run.d, run.dtype, "ids" if run.store == "ids" else "embeddings",
                "" if run.slots == "neighbour" else "  slots " + run.slots,
                " SEQ_START" if fl & F_SEQ_START else "", " EMPTY" if fl & F_EMPTY else "",
                " SHUFFLE" if fl & F_SHUFFLE else "", mask, bin(mask).count("1")))
            q = texts.text(chunk)
            if q is not None:
                print("query chunk text: %s" % q)
            if chunk > 0:
                prev = texts.text(chunk - 1)
                if prev is not None:
                    print("preceding chunk (the query's context): %s" % prev)
            # continuation slots (schemas/target_record.md, "What the slots hold"): all, or the second half with both
            first_cont = {"neighbour": run.k, "continuation": 0, "both": run.k // 2}[run.slots]
            for i in range(run.k):
                valid, cont = bool(rec["mask"][i]), i >= first_cont
                vals = ", ".join(_f(float(v), 5) for v in rec["emb"][i][:max(nvals, 0)])
                print("  %s %2d  %s  id %10d  score %s  emb [%s%s]" % (
                    "cont" if cont else "rank", i - first_cont if cont else i, "valid " if valid else "masked",
                    int(rec["ids"][i]), _f(float(rec["scores"][i]), 6), vals, ", ..." if nvals < run.d else ""))
                if valid:
                    t = texts.text(int(rec["ids"][i]))
                    if t is not None and cont:
                        print("           continuation (chunk after neighbour %d) text: %s" % (int(rec["ids"][i]) - 1, t))
                    elif t is not None:
                        print("           text: %s" % t)
        finally:
            texts.close()


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dfm", description="tools of the dfm Python package")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("inspect", help="print one target record as `dfm inspect` does")
    p.add_argument("run")
    p.add_argument("--chunk", type=int, required=True, help="chunk id whose target record to print")
    p.add_argument("--values", type=int, default=4, help="first N values of each embedding (default 4)")
    p.add_argument("--tokenizer", help="LM tokenizer.json for the texts (default: the chunk stage's)")
    p.add_argument("--backend", choices=("c", "python"), default="c", help="target reader (default c: libdfm)")
    sub.add_parser("version", help="print the package (= C library) version")
    a = ap.parse_args(argv)
    if a.cmd == "version":
        print("dfm %s" % dfm.__version__)
        return 0
    try:
        inspect(a.run, a.chunk, a.values, a.tokenizer, a.backend)
    except (dfm.TargetError, ValueError, OSError) as e:
        print("python -m dfm inspect: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
