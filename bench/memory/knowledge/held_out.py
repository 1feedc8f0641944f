#!/usr/bin/env python3
"""held_out.py — how many of a run's last sequences hold the unseen tail of facts.py --unseen: the --val-seqs that
keeps exactly those documents out of `dfm-train train` (DFM training) and out of `dfm-train train --objective
reconstruct` (the reading stage).

facts.py --unseen writes the unseen entities' documents after all others and records in DIR/unseen.json how many
come first ("head_documents": H). A `dfm chunk --doc-aligned` run of DIR/corpus.jsonl numbers its documents 0, 1, ...
in line order and starts each one at a chunk boundary (schemas/chunk_shard.md), so the tail starts at chunk c0, the
first chunk whose first token is of document H. From the chunk shards' records:

    DFM training   sequence i of dfm-train is tokens [iT, (i+1)T) of the run's chunks, n = (chunks x L - 1) // T
                   of them (trainer/data/data.c), the last --val-seqs held out: the tail starts in sequence
                   s0 = c0 x L // T, so --val-seqs n - s0. When c0 is not a sequence boundary, sequence s0 also holds
                   the last (c0 - s0 x T / L) chunks of the head, held out with it: every statement of a seen fact
                   has two more in other documents. The run's last, partial sequence belongs to no sequence of
                   dfm-train, so the tail there is neither trained nor evaluated.
    reading stage  one sequence per chunk that holds a token, in chunk order (trainer/data/reading.c): --val-seqs
                   is the number of such chunks from c0 on, which is exactly the tail's chunks.

dfm-train holds out at least one batch whatever --val-seqs says (trainer/run/train_opts.c): a smaller count than the
batch holds out head sequences too, never fewer of the tail's.

Checks before counting: the run is doc-aligned; its chunk stage counted as many documents as unseen.json and
corpus.jsonl (one per line, none empty), chunk c0 starts document H and no chunk before it holds a token of the
tail; with --tokenizer, chunk c0's tokens decode to the start of document H's text (a run built from another
corpus.jsonl is refused).

    python3 bench/memory/knowledge/held_out.py --run RUN --split DIR/unseen.json [--corpus DIR/corpus.jsonl]
        [--seq-len T (the run's)] [--tokenizer tokenizer.json]
prints "DFM_VAL_SEQS READING_VAL_SEQS" on stdout and what they hold on stderr.
"""
import argparse
import glob
import json
import os
import struct
import sys


def chunk_records(run):
    """(chunk_len, seq_len, doc_aligned, [(doc_first, doc_last, n_valid, tokens)] in chunk-id order) of a run's
    chunk shards (schemas/chunk_shard.md)."""
    recs, L, S, aligned = {}, None, None, True
    for path in sorted(glob.glob(os.path.join(run, "chunk", "chunks-*.bin"))):
        b = open(path, "rb").read()
        if b[:8] != b"DFMCHNK1":
            sys.exit("held_out: %s is not a chunk shard" % path)
        L, S, _, flags = struct.unpack_from("<IIII", b, 16)
        aligned &= bool(flags & 1)
        first, n = struct.unpack_from("<QQ", b, 32)
        rec = 24 + 4 * L
        for i in range(n):
            off = 128 + i * rec
            d0, d1, nv = struct.unpack_from("<QQH", b, off)
            recs[first + i] = (d0, d1, nv, struct.unpack_from("<%dI" % L, b, off + 24))
    if not recs or sorted(recs) != list(range(len(recs))):
        sys.exit("held_out: %s: no chunk shards, or their chunk ids leave gaps" % run)
    return L, S, aligned, [recs[i] for i in range(len(recs))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="the doc-aligned chunk run of DIR/corpus.jsonl")
    ap.add_argument("--split", required=True, help="DIR/unseen.json of facts.py --unseen")
    ap.add_argument("--corpus", help="DIR/corpus.jsonl (default: beside --split)")
    ap.add_argument("--seq-len", type=int, default=0, help="dfm-train's --seq-len (default: the run's)")
    ap.add_argument("--tokenizer", help="the run's tokenizer.json: check that chunk c0 is document H's start")
    a = ap.parse_args()
    split = json.load(open(a.split))
    H = split["head_documents"]
    docs = [json.loads(l) for l in open(a.corpus or os.path.join(os.path.dirname(a.split), "corpus.jsonl"))]
    counts = json.load(open(os.path.join(a.run, "manifest.json")))["stages"]["chunk"]["counts"]
    if not len(docs) == split["documents"] == counts["documents"] or counts.get("empty_documents", 0):
        sys.exit("held_out: %d documents in corpus.jsonl, %d in %s, %d (%d empty) in the run %s: not the run of that "
                 "corpus" % (len(docs), split["documents"], a.split, counts["documents"],
                             counts.get("empty_documents", 0), a.run))
    if docs[H]["id"] != split["first_unseen_document"]:
        sys.exit("held_out: document %d of corpus.jsonl is %s, unseen.json says %s" % (H, docs[H]["id"],
                                                                                      split["first_unseen_document"]))
    L, S, aligned, recs = chunk_records(a.run)
    T = a.seq_len or S
    if not aligned:
        sys.exit("held_out: %s is not doc-aligned: the tail need not start at a chunk boundary" % a.run)
    if T % L:
        sys.exit("held_out: --seq-len %d is not a multiple of the run's chunk length %d" % (T, L))
    c0 = next((c for c, r in enumerate(recs) if r[2] and r[0] >= H), None)
    if c0 is None or recs[c0][0] != H or any(r[2] and r[1] >= H for r in recs[:c0]):
        sys.exit("held_out: document %d does not start a chunk of %s after the head's chunks" % (H, a.run))
    if a.tokenizer:
        from tokenizers import Tokenizer
        d0, _, nv, tok = recs[c0]
        text = Tokenizer.from_file(a.tokenizer).decode(list(tok[:nv])).strip()[:40]
        if not docs[H]["text"].startswith(text):
            sys.exit("held_out: chunk %d of %s reads %r, not the start of document %d (%s): a run of another corpus"
                     % (c0, a.run, text, H, docs[H]["id"]))
    n_seq = (len(recs) * L - 1) // T
    s0 = c0 * L // T
    dfm_val = n_seq - s0
    if dfm_val < 1:
        sys.exit("held_out: the tail starts in sequence %d of %d: in the run's last, partial one, which dfm-train "
                 "never reads; more unseen entities make a tail worth holding out" % (s0, n_seq))
    read_val = sum(1 for r in recs[c0:] if r[2])
    print("held_out: the unseen tail (documents %d to %d, %s on) starts at chunk %d of %d: dfm-train --seq-len %d "
          "holds out sequences %d to %d (--val-seqs %d, with the head's last %d chunks); the reading stage holds out "
          "its last %d chunks (--val-seqs %d)" % (H, len(docs) - 1, split["first_unseen_document"], c0, len(recs), T,
                                                 s0, n_seq - 1, dfm_val, c0 - s0 * (T // L), read_val, read_val),
          file=sys.stderr)
    print(dfm_val, read_val)


if __name__ == "__main__":
    main()
