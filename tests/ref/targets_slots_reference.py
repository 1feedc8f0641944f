#!/usr/bin/env python3
"""targets_slots_reference.py — an independent check of what `dfm write-targets --slots-hold` puts in the slots.

Reads the run's files with its own parsers (tests/ref/retrieval_reference.py: chunk shards, embedding blocks,
neighbour blocks; no dfm code) and the target records with the pure-Python reader (python/dfm_targets.py, not
libdfm), and recomputes every record from the rule of schemas/target_record.md ("What the slots hold"):

  continues(j)   j + 1 < N_rows and n_valid(j) > 0 and n_valid(j + 1) > 0 and doc_first(j + 1) == doc_last(j)
                 (chunk metadata of the run the neighbour ids index: this run, or its --datastore run)
  neighbour      slot r = neighbour r (id, score, embedding row id)
  continuation   slot r = (id + 1, neighbour r's score, row id + 1) where continues(id), else masked
  both           2K slots: the K neighbour slots, then the K continuation slots
A first chunk of a training sequence (id % (S/L) == 0) has every slot masked. Embeddings are compared exactly
after rounding the fp32 rows to the stored dtype (fp32 or fp16).

  targets_slots_reference.py RUN [--plant-offset O] [--min-cases]
    --plant-offset O  compute continuations as id + O instead of id + 1 (O = 0: the off-by-one "neighbour
                      itself"); the check must then FAIL, which shows it can see that bug
    --min-cases       also require the data to exercise the rule: slots masked at a document end, continuations
                      across a training-sequence boundary, and out of a chunk where a document ends inside it
Exit 1 on any difference, printing the first differing records.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from retrieval_reference import load_chunks, load_embeddings, load_neighbours  # noqa: E402
import dfm_targets  # noqa: E402


def expected_slots(slots, nb_ids, nb_scores, nb_mask, seq_start, cont_ok, offset):
    """Per record: (ids[KS], scores[KS], mask bool[KS]) of the rule above (offset 1 = the rule)."""
    n, k = nb_ids.shape
    valid = ((nb_mask[:, None].astype(np.uint64) >> np.arange(k, dtype=np.uint64)) & np.uint64(1)).astype(bool)
    valid &= ~seq_start[:, None]
    n_ids = np.where(valid, nb_ids, -1)
    n_sc = np.where(valid, nb_scores, 0).astype(np.float32)
    safe = np.where(valid, nb_ids, 0)
    c_valid = valid & cont_ok[safe]
    c_ids = np.where(c_valid, safe + offset, -1)
    c_sc = np.where(c_valid, nb_scores, 0).astype(np.float32)
    if slots == "neighbour":
        return n_ids, n_sc, valid
    if slots == "continuation":
        return c_ids, c_sc, c_valid
    return np.concatenate([n_ids, c_ids], 1), np.concatenate([n_sc, c_sc], 1), np.concatenate([valid, c_valid], 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--plant-offset", type=int, default=1)
    ap.add_argument("--min-cases", action="store_true")
    args = ap.parse_args()
    man = json.load(open(os.path.join(args.run, "manifest.json")))
    _, _, _, _, cps = load_chunks(args.run, man)
    nb_ids, nb_scores, nb_mask, _ = load_neighbours(args.run, man)
    ds = man["stages"]["retrieve"].get("datastore")
    rows_run = ds["run"] if ds else args.run
    rman = json.load(open(os.path.join(rows_run, "manifest.json"))) if ds else man
    doc_first, doc_last, n_valid, _, _ = load_chunks(rows_run, rman)
    x = load_embeddings(rows_run, rman)
    n_rows = x.shape[0]
    cont_ok = np.zeros(n_rows, bool)
    cont_ok[:-1] = (n_valid[:-1] > 0) & (n_valid[1:] > 0) & (doc_first[1:] == doc_last[:-1])

    run = dfm_targets.TargetRun(args.run)
    slots, n = run.slots, nb_ids.shape[0]
    seq_start = np.arange(n) % cps == 0
    ids, scores, mask = expected_slots(slots, nb_ids, nb_scores, nb_mask, seq_start, cont_ok, args.plant_offset)
    if run.dtype == "fp16":
        rows = x.astype(np.float16).astype(np.float32)
    elif run.dtype == "fp32":
        rows = x
    else:
        sys.exit(f"this reference compares fp32 and fp16 targets, not {run.dtype}")
    bad = 0
    for i, rec in enumerate(run.records()):
        want_emb = np.where(mask[i][:, None], rows[np.clip(ids[i], 0, n_rows - 1)], 0).astype(np.float32)
        same = rec["chunk_id"] == i and np.array_equal(rec["mask"], mask[i]) and np.array_equal(rec["ids"], ids[i]) and \
            np.array_equal(rec["scores"], scores[i]) and np.array_equal(rec["emb"], want_emb)
        if not same:
            bad += 1
            if bad <= 3:
                print(f"chunk {i}: dfm ids {rec['ids'].tolist()} mask {rec['mask'].astype(int).tolist()}\n"
                      f"      reference ids {ids[i].tolist()} mask {mask[i].astype(int).tolist()}")
    if bad == 0 and i + 1 != n:
        bad = 1
        print(f"{i + 1} records for {n} chunks")
    # what the data exercised: valid neighbours whose continuation is masked (document end), continuations
    # that cross a training-sequence boundary, and continuations out of a chunk a document ends inside
    k = nb_ids.shape[1]
    nvalid = ((nb_mask[:, None].astype(np.uint64) >> np.arange(k, dtype=np.uint64)) & np.uint64(1)).astype(bool) & ~seq_start[:, None]
    nid = nb_ids[nvalid]
    ends = int((~cont_ok[nid]).sum())
    rcps = load_chunks(rows_run, rman)[4]  # the rows run's chunks per sequence
    across = int((cont_ok[nid] & ((nid + 1) % rcps == 0)).sum())
    inside = int((cont_ok[nid] & (doc_first[nid] != doc_last[nid])).sum())
    tag = (f"slots {slots}, K {run.k}, {n} records{' against a datastore of %d' % n_rows if ds else ''}: {len(nid)} valid "
           f"neighbours, {ends} masked at a document end, {across} continued across a sequence boundary, "
           f"{inside} continued out of a chunk a document ends inside")
    if args.min_cases and slots != "neighbour" and not (ends and across and inside):
        print(f"FAIL the data does not exercise the rule ({tag})")
        return 1
    print(f"{'FAIL' if bad else 'OK'} {bad} differing records ({tag}){'' if args.plant_offset == 1 else ', planted offset %d' % args.plant_offset}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
