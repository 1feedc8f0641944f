#!/usr/bin/env python3
"""tiny_bert.py SRC_MODEL OUT [--hidden H --layers L --heads A --inter F --seed S]

Writes OUT: a small random BERT model folder that `dfm encode` loads like a real one, so that tests can
run the whole pipeline at many ranks on a 2-core machine without paying for a real encoder's weights
(each rank loads its own copy) and forward passes. The tokenizer files (tokenizer.json, vocab.txt, ...)
are copied from SRC_MODEL (e.g. all-MiniLM-L6-v2), whose vocabulary the random embedding table covers;
config.json and the sentence-transformers side files are rewritten for the new sizes, and
model.safetensors holds seeded random float32 weights (LayerNorm weights 1, biases small), written
with the standard library only (8-byte header length, JSON header, little-endian data).
The embeddings mean nothing; what the pipeline makes of them is still deterministic, which is all a
test that compares runs at different rank counts needs."""
import argparse
import json
import os
import random
import shutil
import struct


def tensors(cfg, rng):
    """(name, shape, values) in file order, float32 values from a seeded generator"""
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]

    def rand(*shape):
        n = 1
        for s in shape:
            n *= s
        return list(shape), [rng.gauss(0.0, 0.05) for _ in range(n)]

    def const(n, v):
        return [n], [v] * n

    out = [("embeddings.word_embeddings.weight", *rand(V, H)),
           ("embeddings.position_embeddings.weight", *rand(cfg["max_position_embeddings"], H)),
           ("embeddings.token_type_embeddings.weight", *rand(cfg["type_vocab_size"], H)),
           ("embeddings.LayerNorm.weight", *const(H, 1.0)), ("embeddings.LayerNorm.bias", *const(H, 0.0))]
    for l in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{l}."
        for name in ("query", "key", "value"):
            out += [(p + f"attention.self.{name}.weight", *rand(H, H)), (p + f"attention.self.{name}.bias", *rand(H))]
        out += [(p + "attention.output.dense.weight", *rand(H, H)), (p + "attention.output.dense.bias", *rand(H)),
                (p + "attention.output.LayerNorm.weight", *const(H, 1.0)),
                (p + "attention.output.LayerNorm.bias", *const(H, 0.0)),
                (p + "intermediate.dense.weight", *rand(F, H)), (p + "intermediate.dense.bias", *rand(F)),
                (p + "output.dense.weight", *rand(H, F)), (p + "output.dense.bias", *rand(H)),
                (p + "output.LayerNorm.weight", *const(H, 1.0)), (p + "output.LayerNorm.bias", *const(H, 0.0))]
    return out


def write_safetensors(path, items):
    header, blobs, off = {}, [], 0
    for name, shape, values in items:
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--inter", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with open(os.path.join(a.src, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
               intermediate_size=a.inter)
    os.makedirs(os.path.join(a.out, "1_Pooling"), exist_ok=True)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                 "modules.json", "sentence_bert_config.json"):
        if os.path.exists(os.path.join(a.src, name)):
            shutil.copyfile(os.path.join(a.src, name), os.path.join(a.out, name))
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(a.out, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": a.hidden, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                   "pooling_mode_mean_sqrt_len_tokens": False}, f, indent=1)
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors(cfg, random.Random(a.seed)))


if __name__ == "__main__":
    main()
