#!/usr/bin/env python3
"""The peer of bench/corpus/bench_corpus_read.c: pyarrow.parquet reading the text column of Parquet files.

  python corpus_read_peer.py MODE [--text-field F] FILE...
    MODE iter_batches: ParquetFile.iter_batches(columns=[F], use_threads=False), batches of 64 Ki rows
                       (streams, as dfm does)
    MODE read_table:   pyarrow.parquet.read_table(FILE, columns=[F], use_threads=False) (the whole column)

Timed: the reading alone (process CPU and wall), from opening the files to the last decoded batch.
Untimed, after: the same tally bench_corpus_read.c prints (non-empty documents, their UTF-8 bytes, empty
or null ones, zlib CRC-32 of the texts concatenated), from the batches kept, so both sides are checked."""
import argparse
import json
import time
import zlib

import pyarrow.parquet as pq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["iter_batches", "read_table"])
    ap.add_argument("--text-field", default="text")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    c0, w0 = time.process_time(), time.perf_counter()
    kept = []
    for f in a.files:
        if a.mode == "read_table":
            kept.append(pq.read_table(f, columns=[a.text_field], use_threads=False).column(0))
        else:
            for b in pq.ParquetFile(f).iter_batches(batch_size=65536, columns=[a.text_field], use_threads=False):
                kept.append(b.column(0))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    docs = nbytes = empty = crc = 0
    for arr in kept:
        for v in arr.to_pylist():
            if not v:
                empty += 1
                continue
            e = v.encode("utf-8")
            docs += 1
            nbytes += len(e)
            crc = zlib.crc32(e, crc)
    print(json.dumps({"docs": docs, "bytes": nbytes, "empty": empty, "crc32": crc, "cpu_s": round(cpu, 4),
                      "wall_s": round(wall, 4)}))


if __name__ == "__main__":
    main()
