"""What a run's target memory is made of: for every chunk with a target, where its K neighbours come from
and how much of them re-describes what the model already sees.

Chunk c's query is the embedding of the W chunks before it (the run's query window), and the model
predicting chunk c sees every earlier chunk of its training sequence. For each real neighbour n of c this
counts:

  same document      n shares a document with c's query chunks or with c (retrieval excluded only its
                     own training sequence, so these come from the document's other sequences);
  visible context    n is one of the chunks the model already sees (same sequence, before c);
  near-duplicate of the query   token-set Jaccard(n, query chunk) >= 0.5: it re-describes the chunk the
                     model has just read;
  near-duplicate of the context Jaccard >= 0.5 with any chunk the model sees;
  overlaps the target chunk     Jaccard(n, c) >= 0.5: it tells what comes next (the useful kind);
  closer to the query than to the target   Jaccard(n, query chunk) > Jaccard(n, c);
and the mean cosine score, the mean Jaccard with the query chunk and with c, next to two references: the
Jaccard of the query chunk with c itself, and with a chunk drawn at random.

Reads RUN/chunk (chunk shards) and RUN/retrieve (neighbour blocks) as documented in schemas/.
Pure Python. Prints a small table (and --json for one JSON object).

  python3 bench/memory/target_composition.py RUN [--json]
"""
import glob
import json
import os
import struct
import sys


def read_chunks(run):
    toks, docs, seq_of = [], [], []
    for path in sorted(glob.glob(os.path.join(run, "chunk", "chunks-*.bin"))):
        b = open(path, "rb").read()
        assert b[:8] == b"DFMCHNK1", path
        L, S = struct.unpack_from("<II", b, 16)
        first, n = struct.unpack_from("<QQ", b, 32)
        pad_id = struct.unpack_from("<I", b, 68)[0]
        rec = 24 + 4 * L
        for i in range(n):
            off = 128 + i * rec
            d0, d1, nv = struct.unpack_from("<QQH", b, off)
            t = struct.unpack_from("<%dI" % L, b, off + 24)[:nv]
            toks.append(frozenset(x for x in t if x != pad_id))
            docs.append((d0, d1))
            seq_of.append((first + i) // (S // L))
    return toks, docs, seq_of


def read_neighbours(run):
    rows = {}
    window = 1
    for path in sorted(glob.glob(os.path.join(run, "retrieve", "nbr-*.bin"))):
        b = open(path, "rb").read()
        assert b[:8] == b"DFMNBRS1", path
        K = struct.unpack_from("<I", b, 16)[0]
        first, n, row_bytes = struct.unpack_from("<QQQ", b, 24)
        window = struct.unpack_from("<I", b, 60)[0]
        K2 = K + (K & 1)
        for i in range(n):
            off = 128 + i * row_bytes
            ids = struct.unpack_from("<%dq" % K, b, off)
            scores = struct.unpack_from("<%df" % K, b, off + 8 * K)
            mask = struct.unpack_from("<Q", b, off + 8 * K + 4 * K2)[0]
            real = [(ids[j], scores[j]) for j in range(K) if mask >> j & 1]
            if real:
                rows[first + i] = real
    return rows, window


def jaccard(a, b):
    return len(a & b) / len(a | b) if a or b else 0.0


def main():
    run = sys.argv[1]
    toks, docs, seq_of = read_chunks(run)
    rows, W = read_neighbours(run)
    keys = ["same document", "visible context", "near-duplicate of the query", "near-duplicate of the context",
            "overlaps the target chunk", "closer to the query than to the target"]
    count = dict.fromkeys(keys, 0)
    total, cos, jq, jt, jqt, jrand = 0, 0.0, 0.0, 0.0, 0.0, 0.0
    for c, nbrs in rows.items():
        query = [q for q in range(c - W, c) if q >= 0]
        seen = [q for q in range(c - 1, -1, -1) if seq_of[q] == seq_of[c]]
        qdocs = set()
        for q in query + [c]:
            qdocs.update(range(docs[q][0], docs[q][1] + 1))
        qtok = frozenset().union(*(toks[q] for q in query)) if query else frozenset()
        jqt += jaccard(qtok, toks[c])
        jrand += jaccard(qtok, toks[(c * 7919 + 17) % len(toks)])
        for n, s in nbrs:
            total += 1
            cos += s
            a, b = jaccard(toks[n], qtok), jaccard(toks[n], toks[c])
            jq += a
            jt += b
            count["same document"] += any(d in qdocs for d in range(docs[n][0], docs[n][1] + 1))
            count["visible context"] += n in seen
            count["near-duplicate of the query"] += a >= 0.5
            count["near-duplicate of the context"] += a >= 0.5 or any(jaccard(toks[n], toks[q]) >= 0.5 for q in seen)
            count["overlaps the target chunk"] += b >= 0.5
            count["closer to the query than to the target"] += a > b
    out = {"chunks_with_targets": len(rows), "neighbours": total, "query_window": W,
           "mean_cosine": round(cos / max(total, 1), 4), "mean_jaccard_query": round(jq / max(total, 1), 4),
           "mean_jaccard_target": round(jt / max(total, 1), 4),
           "jaccard_query_vs_target": round(jqt / max(len(rows), 1), 4),
           "jaccard_query_vs_random": round(jrand / max(len(rows), 1), 4)}
    out.update({k: round(v / max(total, 1), 4) for k, v in count.items()})
    if "--json" in sys.argv:
        print(json.dumps(out))
        return
    print("target memory of %s: %d chunks with targets, %d neighbours (query window %d)" %
          (run, len(rows), total, W))
    print("| neighbours that ... | share |\n|---|---:|")
    for k in keys:
        print("| %s | %.1f %% |" % (k, 100 * out[k]))
    print("| mean cosine to the query / token Jaccard with the query chunk / with the target chunk | %.3f / %.3f / %.3f |"
          % (out["mean_cosine"], out["mean_jaccard_query"], out["mean_jaccard_target"]))
    print("| reference: token Jaccard of the query chunk with the target chunk / with a random chunk | %.3f / %.3f |"
          % (out["jaccard_query_vs_target"], out["jaccard_query_vs_random"]))


if __name__ == "__main__":
    main()
