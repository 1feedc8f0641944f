#!/usr/bin/env python3
"""bench_tokenizer_hf.py — HF `tokenizers` throughput on the same texts as bench_tokenizer.c.

    RAYON_NUM_THREADS=T python bench/bench_tokenizer_hf.py TOKENIZER_JSON CORPUS_JSONL MB T [REPS]

Same text selection (first MB megabytes of the "text" fields, the last one cut), encode_batch with
add_special_tokens=False, one untimed warm-up pass, best of REPS. Prints the same line format."""
import json
import os
import sys
import time

path, corpus, mb, threads = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
os.environ["RAYON_NUM_THREADS"] = str(threads)
os.environ["TOKENIZERS_PARALLELISM"] = "true"
from tokenizers import Tokenizer  # noqa: E402  (after the environment is set)

tok = Tokenizer.from_file(path)
limit = int(mb * 1e6)
texts, nbytes = [], 0
with open(corpus, "rb") as f:
    for line in f:
        if nbytes >= limit:
            break
        b = json.loads(line)["text"].encode("utf-8")
        b = b[: limit - nbytes] if nbytes + len(b) > limit else b
        texts.append(b.decode("utf-8", "replace"))
        nbytes += len(b)
best, best_cpu, tokens = 1e30, 1e30, 0
for r in range(-1, reps):
    t0, c0 = time.perf_counter(), time.process_time()
    enc = tok.encode_batch(texts, add_special_tokens=False)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(e.ids) for e in enc)
    if r >= 0:
        best, best_cpu = min(best, dt), min(best_cpu, dc)
        print(f"hf pass {r} threads={threads} seconds={dt:.3f} cpu_seconds={dc:.3f}")
print(f"hf threads={threads} bytes={nbytes} docs={len(texts)} tokens={tokens} seconds={best:.3f} "
      f"MB/s={nbytes / best / 1e6:.2f} tokens/s={tokens / best:.0f} cpu_seconds={best_cpu:.3f} "
      f"MB/cpu-s={nbytes / best_cpu / 1e6:.2f}")
