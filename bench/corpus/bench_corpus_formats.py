#!/usr/bin/env python3
"""Driver of bench/corpus/bench_corpus_formats.sh: the same texts as .jsonl, .jsonl.zst, .jsonl.gz and Parquet
(snappy, zstd), read by dfm's corpus reader (build/bench/bench_corpus_read) and, for Parquet, by
pyarrow.parquet (bench/corpus/corpus_read_peer.py, both its modes; the better of the two is the peer of a round);
then the whole chunk stage (`dfm chunk`, one rank) on each form. Rounds interleave every side in a rotating
order. Throughput is MB of text (the decompressed documents) per CPU-second (process CPU, all threads).
Checks, in the same run: every reader hands out the same documents (count, bytes, CRC-32 of the texts),
and the chunk shards of every form are byte-identical. Writes OUT.json (bench/README.md's result format)
and OUT.md."""
import argparse
import datetime
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"bench_corpus_formats: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return r.stdout


def child_cpu():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def prepare(a):
    w = a.work
    os.makedirs(w, exist_ok=True)
    mk = [sys.executable, f"{ROOT}/tests/ref/make_parquet.py", "fineweb", "--corpus", a.corpus, "--files", "1",
          "--copies", str(a.copies), "--rows-per-group", str(a.rows_per_group)]
    for comp in ("snappy", "zstd"):
        run(mk + ["--compression", comp, "--out", f"{w}/pq-{comp}", "--jsonl", f"{w}/js-{comp}"])
    js = f"{w}/corpus.jsonl"
    shutil.copy(f"{w}/js-snappy/000_00000.jsonl", js)
    run(["zstd", "-q", "-f", "-3", js, "-o", js + ".zst"])
    with open(js + ".gz", "wb") as f:
        subprocess.run(["gzip", "-6", "-c", js], stdout=f, check=True)
    return {"jsonl": js, "jsonl.zst": js + ".zst", "jsonl.gz": js + ".gz",
            "parquet-snappy": f"{w}/pq-snappy/data/CC-MAIN-2024-10/000_00000.parquet",
            "parquet-zstd": f"{w}/pq-zstd/data/CC-MAIN-2024-10/000_00000.parquet"}


def stats(xs):
    return min(xs), statistics.median(xs), max(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=f"{ROOT}/build")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--rows-per-group", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk-rounds", type=int, default=2)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True, help="results path without extension")
    a = ap.parse_args()
    import pyarrow
    files = prepare(a)
    forms = list(files)
    sides = [("dfm", f) for f in forms] + [("pyarrow " + m, f) for m in ("iter_batches", "read_table")
                                           for f in forms if f.startswith("parquet")]
    reader = f"{a.build}/bench/bench_corpus_read"
    peer = [sys.executable, f"{HERE}/corpus_read_peer.py"]
    res = {s: [] for s in sides}
    for r in range(a.rounds):
        k = r % len(sides)
        for side in sides[k:] + sides[:k]:
            who, form = side
            cmd = [reader, files[form]] if who == "dfm" else peer + [who.split()[1], files[form]]
            res[side].append(json.loads(run(cmd)))
    tallies = {(d["docs"], d["bytes"], d["empty"], d["crc32"]) for v in res.values() for d in v}
    agree_read = len(tallies) == 1
    docs, text_bytes, empty, crc = next(iter(tallies))
    mb = text_bytes / 1e6
    # the chunk stage on each form, one rank, shards compared byte for byte
    chunk = {f: [] for f in forms}
    shard_hash = {}
    for r in range(a.chunk_rounds):
        k = r % len(forms)
        for form in forms[k:] + forms[:k]:
            rd = f"{a.work}/run-{form}"
            shutil.rmtree(rd, ignore_errors=True)
            c0 = child_cpu()
            import time
            w0 = time.perf_counter()
            run([f"{a.build}/dfm", "chunk", rd, files[form], "--tokenizer", a.tokenizer], env=dict(os.environ, DFM_PROGRESS="0"))
            chunk[form].append((child_cpu() - c0, time.perf_counter() - w0))
            h = hashlib.sha256()
            for name in sorted(os.listdir(f"{rd}/chunk")):
                if name.endswith(".bin"):
                    with open(f"{rd}/chunk/{name}", "rb") as f:
                        h.update(f.read())
            shard_hash.setdefault(form, set()).add(h.hexdigest())
    agree_chunk = len({x for v in shard_hash.values() for x in v}) == 1
    # tables
    sizes = {f: os.path.getsize(p) for f, p in files.items()}
    lines = [f"# Corpus formats: read and chunk throughput — {datetime.date.today()}", "",
             f"{docs} documents, {mb:.1f} MB of text (gcide.jsonl x {a.copies}; Parquet: FineWeb's columns, "
             f"{a.rows_per_group} rows a row group), {a.rounds} read rounds and {a.chunk_rounds} chunk rounds "
             f"interleaved; MB of text per CPU-second (min / median / max over rounds), one thread. "
             f"pyarrow {pyarrow.__version__}. Every reader handed out the same documents: "
             f"{'yes' if agree_read else 'NO'}; chunk shards byte-identical across forms: {'yes' if agree_chunk else 'NO'}.", "",
             "| form | file MB | reader | read MB/CPU-s | read wall s (median) | `dfm chunk` MB/CPU-s | chunk CPU-s (median) |",
             "|---|---:|---|---:|---:|---:|---:|"]
    rows = []
    for side in sides:
        who, form = side
        cpu = [d["cpu_s"] for d in res[side]]
        lo, med, hi = stats([mb / c for c in cpu])
        wall = statistics.median(d["wall_s"] for d in res[side])
        ch = ""
        if who == "dfm":
            cc = [c for c, _ in chunk[form]]
            clo, cmed, chi = stats([mb / c for c in cc])
            ch = f"{clo:.1f} / {cmed:.1f} / {chi:.1f} | {statistics.median(cc):.2f}"
        else:
            ch = "| "
        lines.append(f"| {form} | {sizes[form] / 1e6:.1f} | {who} | {lo:.0f} / {med:.0f} / {hi:.0f} | {wall:.3f} | {ch} |")
    # headline rows: dfm Parquet vs the better pyarrow mode, paired by round
    for form in ("parquet-snappy", "parquet-zstd"):
        d = [x["cpu_s"] for x in res[("dfm", form)]]
        p = [min(res[("pyarrow iter_batches", form)][i]["cpu_s"], res[("pyarrow read_table", form)][i]["cpu_s"]) for i in range(a.rounds)]
        ratios = [pi / di for pi, di in zip(p, d)]
        rows.append({"stage": "corpus_read", "setting": f"{form}, {mb:.0f} MB of text", "case": form, "threads": 1,
                     "peer": "pyarrow.parquet, the text column (better of iter_batches and read_table per round)",
                     "peer_version": f"pyarrow {pyarrow.__version__}",
                     "dfm_cpu_s": round(statistics.median(d), 4), "peer_cpu_s": round(statistics.median(p), 4),
                     "ratio": round(statistics.median(ratios), 3), "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)],
                     "agree": {"ok": agree_read and agree_chunk, "docs": docs, "bytes": text_bytes, "crc32": crc,
                               "chunk_shards_identical": agree_chunk},
                     "unit": f"CPU-seconds to read {mb:.1f} MB of text", "rounds": a.rounds})
    lines += ["", "Ratio pyarrow/dfm CPU-seconds on Parquet (above 1: dfm faster), per round: " +
              "; ".join(f"{r['case']} {r['ratio']} (min {r['ratio_min_max'][0]}, max {r['ratio_min_max'][1]})" for r in rows)]
    out = dict(rows[0])
    out["rows"] = rows
    out["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out["forms"] = {f"{who} {form}": [d["cpu_s"] for d in res[(who, form)]] for who, form in sides}
    out["chunk_cpu_s"] = {f: [c for c, _ in chunk[f]] for f in forms}
    with open(a.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not (agree_read and agree_chunk):
        sys.exit("bench_corpus_formats: the readers or the chunk shards disagree")


if __name__ == "__main__":
    main()
