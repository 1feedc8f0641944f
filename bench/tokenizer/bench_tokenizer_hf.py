#!/usr/bin/env python3
"""bench_tokenizer_hf.py — the peers' side of bench/tokenizer/bench_tokenizer.sh: Hugging Face `tokenizers`, tiktoken
or SentencePiece on the same texts as bench_tokenizer.c, cold and warm.

    python bench/tokenizer/bench_tokenizer_hf.py PEER TOKENIZER CORPUS_JSONL MB THREADS [IDS_OUT]

PEER: "hf" (tokenizers.Tokenizer.from_file, encode_batch, add_special_tokens=False, RAYON_NUM_THREADS),
"tiktoken" (an Encoding made from the tokenizer.json: its vocabulary as mergeable ranks, its Split
regex, its added tokens as special tokens; encode_batch with allowed_special="all", num_threads) or "sp"
(sentencepiece.SentencePieceProcessor on TOKENIZER, a .model file; encode of the list, num_threads). The
tiktoken form is only valid for byte-level BPE whose ids follow merge order, as Qwen2.5's and
Llama-3's do; the ids comparison in bench_tokenizer.sh says whether it held.
Same text selection as bench_tokenizer.c (first MB megabytes of the "text" fields, the last one cut
at the byte limit, invalid UTF-8 replaced). One process is one measurement: construct the tokenizer
(timed), encode everything once from a fresh tokenizer ("cold") and then again ("warm"; HF keeps a
word cache, tiktoken has none). IDS_OUT: per document a u32 count then the u32 ids. Prints one line:
  PEER threads=T bytes=B docs=D tokens=N load_s=.. load_cpu=.. cold_s=.. cold_cpu=.. warm_s=.. warm_cpu=..
"""
import json
import os
import struct
import sys
import time

peer, path, corpus, mb, threads = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
ids_out = sys.argv[6] if len(sys.argv) > 6 else None
os.environ["RAYON_NUM_THREADS"] = str(threads)
os.environ["TOKENIZERS_PARALLELISM"] = "true"

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


def bytelevel_decoder():
    """GPT-2's byte alphabet, code point -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    k = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def make_tiktoken(tj):
    import tiktoken

    spec = json.load(open(tj, encoding="utf-8"))
    pre = spec["pre_tokenizer"]
    stages = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    split = [s for s in stages if s.get("type") == "Split"]
    if not split or "Regex" not in split[0]["pattern"]:
        sys.exit(f"tiktoken peer: {tj} has no Split regex pre-tokenizer; tiktoken cannot stand in for it")
    dec = bytelevel_decoder()
    ranks = {bytes(dec[c] for c in tokstr): i for tokstr, i in spec["model"]["vocab"].items()}
    special = {a["content"]: a["id"] for a in spec.get("added_tokens", []) if a["id"] not in ranks.values()}
    return tiktoken.Encoding(name="from-tokenizer-json", pat_str=split[0]["pattern"]["Regex"],
                             mergeable_ranks=ranks, special_tokens=special)


def version():
    if peer == "hf":
        import tokenizers
        return "tokenizers " + tokenizers.__version__
    if peer == "sp":
        import sentencepiece
        return "sentencepiece " + sentencepiece.__version__
    import tiktoken
    return "tiktoken " + tiktoken.__version__


l0, lc0 = time.perf_counter(), time.process_time()
if peer == "hf":
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.no_truncation()  # all-MiniLM-L6-v2's file truncates and pads to 128; dfm encodes every token
    tok.no_padding()

    def encode():
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
elif peer == "tiktoken":
    enc = make_tiktoken(path)

    def encode():
        return enc.encode_batch(texts, num_threads=threads, allowed_special="all")
elif peer == "sp":
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=path)

    def encode():
        return sp.encode(texts, num_threads=threads)
else:
    sys.exit(f"unknown peer {peer} (hf, tiktoken, sp)")
load_s, load_cpu = time.perf_counter() - l0, time.process_time() - lc0

t0, c0 = time.perf_counter(), time.process_time()
cold = encode()
cold_s, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
t0, c0 = time.perf_counter(), time.process_time()
warm = encode()
warm_s, warm_cpu = time.perf_counter() - t0, time.process_time() - c0
if cold != warm:
    sys.exit(f"{peer}: the warm pass gave other ids than the cold pass")
if ids_out:
    with open(ids_out, "wb") as o:
        for ids in cold:
            o.write(struct.pack(f"<I{len(ids)}I", len(ids), *ids))
tokens = sum(len(i) for i in cold)
print(f"{peer} threads={threads} bytes={nbytes} docs={len(texts)} tokens={tokens} load_s={load_s:.4f} "
      f"load_cpu={load_cpu:.4f} cold_s={cold_s:.3f} cold_cpu={cold_cpu:.3f} warm_s={warm_s:.3f} "
      f"warm_cpu={warm_cpu:.3f} version={version().replace(' ', '-')}")
