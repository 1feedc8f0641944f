"""The information-theoretic frame of a keyed synthetic corpus (`dfm-train synth --mode keyed|keyed-random`).

From DIR/tokens.bin and DIR/keys.bin (the hidden key of every chunk) and the generator's parameters, this
computes held-out cross-entropies (nats per predicted token) of three ideal predictors, per position
inside a chunk (the position of the token being predicted) and on average:

  key known      p(token | its chunk's key): what fused target memory can reach at best;
  from context   Bayes over keys with the chain and every earlier token (chunk boundaries known): what a
                 perfect backbone reaches alone, and what predicted memory can reach at best;
  in-chunk only  Bayes over keys from the current chunk's own earlier tokens (uniform key at each chunk
                 start): a backbone that cannot use earlier chunks.

Key sets, chain successor and follow probability are estimated from the corpus (all chunks). Sequences are
the trainer's: sequence i is tokens [i*T, i*T+T), targets shifted by one, the last VAL sequences held out.
Prints one JSON object. numpy needed.

  python3 bench/memory/keyed_ideal.py DIR --seq-len 128 --chunk-len 16 --val-seqs 48 [--key-tokens 16 --key-share 0.8]
"""
import argparse
import json
import os

import numpy as np


def read_shard(path):
    h = np.fromfile(path, dtype=np.int32, count=256)
    # schemas/token_shard.md: 20240520/1 uint16 ids; 20240801/7 (and the older 20240520/2) uint32 ids
    wide = (h[0] == 20240801 and h[1] == 7) or (h[0] == 20240520 and h[1] == 2)
    assert wide or (h[0] == 20240520 and h[1] == 1), "%s: not an llm.c token shard" % path
    return np.fromfile(path, dtype=np.uint32 if wide else np.uint16, offset=1024, count=int(h[2])).astype(np.int64)


def chain_successors(keys, per_seq):
    """(each key's most frequent successor inside a sequence of per_seq chunks, the share of transitions
    that went to it) from the chunk keys of a keyed corpus."""
    n = int(keys.max()) + 1
    inside = (np.arange(1, len(keys)) % per_seq) != 0
    trans = np.zeros((n, n))
    np.add.at(trans, (keys[:-1][inside], keys[1:][inside]), 1)
    succ = trans.argmax(1)
    return succ, trans[np.arange(n), succ].sum() / max(trans.sum(), 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--chunk-len", type=int, required=True)
    ap.add_argument("--val-seqs", type=int, required=True)
    ap.add_argument("--key-tokens", type=int, default=16)
    ap.add_argument("--key-share", type=float, default=0.8)
    a = ap.parse_args()
    tok, keys = read_shard(os.path.join(a.dir, "tokens.bin")), read_shard(os.path.join(a.dir, "keys.bin"))
    T, L, M, share = a.seq_len, a.chunk_len, a.key_tokens, a.key_share
    N, V = int(keys.max()) + 1, int(tok.max()) + 1
    nc = len(keys)
    # the generator's p(token | key), sets estimated as each key's M most frequent tokens
    counts = np.zeros((N, V))
    np.add.at(counts, (np.repeat(keys, L), tok[: nc * L]), 1)
    p = np.full((N, V), (1 - share) / V)
    for k in range(N):
        p[k, np.argsort(-counts[k])[:M]] += share / M
    logp = np.log(p)
    per_seq = T // L
    succ, follow_hat = chain_successors(keys, per_seq)
    f = max(follow_hat - (1 - follow_hat) / (N - 1), 0.0)  # P(succ) = f + (1 - f) / N
    n_seq = (len(tok) - 1) // T
    first = n_seq - a.val_seqs
    ce = {m: np.zeros(L) for m in ("key_known", "from_context", "in_chunk")}
    n = np.zeros(L)
    uniform = np.full(N, 1.0 / N)
    for s in range(first, n_seq):
        # token s*T is context only; tokens s*T+1 .. s*T+T are predicted (the last one starts a new sequence)
        for pos in range(s * T, s * T + T + 1):
            c, j = divmod(pos, L)
            t = tok[pos]
            if j == 0:  # a new chunk: the generator draws a fresh key at a sequence start, else follows the chain
                if c % per_seq == 0:
                    post_ctx = uniform
                else:
                    prior = np.full(N, (1 - f) / N)
                    np.add.at(prior, succ, f * post_ctx)
                    post_ctx = prior
                post_in = uniform
            if pos > s * T:
                ce["key_known"][j] -= logp[keys[c], t]
                ce["from_context"][j] -= np.log(post_ctx @ p[:, t])
                ce["in_chunk"][j] -= np.log(post_in @ p[:, t])
                n[j] += 1
            post_ctx = post_ctx * p[:, t]
            post_ctx /= post_ctx.sum()
            post_in = post_in * p[:, t]
            post_in /= post_in.sum()
    out = {"keys": N, "vocab": V, "chunk_len": L, "follow_estimated": round(float(follow_hat), 4),
           "held_out_tokens": int(n.sum())}
    for m, v in ce.items():
        out[m] = round(float(v.sum() / n.sum()), 4)
        out[m + "_per_position"] = [round(float(x), 3) for x in v / n]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
