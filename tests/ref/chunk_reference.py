#!/usr/bin/env python3
"""Independent reference for `dfm chunk`: packs the same inputs with the Hugging Face tokenizer.

  make-bin --tokenizer T --out F --text S [--text S ...]   write an llm.c-style uint32 token shard
  check --tokenizer T --dump D --manifest M --seq-len S --chunk-len L [--doc-aligned] -- INPUT...
        compare `dfm chunk-dump` output D with the reference packing of INPUT...

The packing rules (docs/README, pipeline/chunk/pack.h): each text document's tokens then EOS;
pretokenized .bin tokens verbatim (a document starts at the file start and after each EOS);
--doc-aligned pads each document to a multiple of L; the last sequence is padded to S.
"""
import argparse
import json
import struct
import sys

import zstandard  # noqa: F401  (imported lazily below when needed)
from tokenizers import Tokenizer


def eos_id(tok):
    for t in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]"):
        i = tok.token_to_id(t)
        if i is not None:
            return i
    raise SystemExit("no EOS token")


def read_bytes(path):
    data = open(path, "rb").read()
    if path.endswith(".zst"):
        import zstandard
        data = zstandard.ZstdDecompressor().stream_reader(data).read()
        path = path[:-4]
    return path, data


def text_documents(ids, eos):
    """A text's ids split as a .bin's are: a document ends after every EOS (a literal special-token
    string in the text is that token, as HF matches it); the last piece gets EOS appended."""
    start = 0
    for i, t in enumerate(ids):
        if t == eos:
            yield "bin", ids[start:i + 1]
            start = i + 1
    yield "text", ids[start:]


def documents(paths, tok, eos):
    """Yield (kind, tokens) per document: kind 'text' gets EOS appended by the packer."""
    for p in paths:
        name, data = read_bytes(p)
        if name.endswith(".jsonl") or name.endswith(".json"):
            for line in data.decode().split("\n"):
                if not line.strip():
                    continue
                text = json.loads(line)["text"]
                if text:
                    yield from text_documents(tok.encode(text, add_special_tokens=False).ids, eos)
        elif name.endswith(".bin"):
            magic, version, count = struct.unpack("<3i", data[:12])
            width = 4 if magic == 20240801 else 2
            toks = list(struct.unpack(f"<{count}{'I' if width == 4 else 'H'}", data[1024:1024 + count * width]))
            cur = []
            for t in toks:
                cur.append(t)
                if t == eos:
                    yield "bin", cur
                    cur = []
            if cur:
                yield "bin-tail", cur
        else:
            text = data.decode()
            if text:
                yield from text_documents(tok.encode(text, add_special_tokens=False).ids, eos)


def reference(paths, tok, S, L, doc_aligned):
    eos = eos_id(tok)
    stream = []  # (token, is_pad, doc_start)
    for kind, ids in documents(paths, tok, eos):
        doc = [(t, False, i == 0) for i, t in enumerate(ids)]
        if kind == "text":
            doc.append((eos, False, len(ids) == 0))
        stream.extend(doc)
        if doc_aligned:
            while len(stream) % L:
                stream.append((eos, True, False))
    while len(stream) % S:
        stream.append((eos, True, False))
    chunks, doc = [], -1
    for c in range(len(stream) // L):
        part = stream[c * L:(c + 1) * L]
        first = last = None
        valid, dstart = 0, False
        for j, (t, pad, ds) in enumerate(part):
            if ds:
                doc += 1
                dstart = True
            if not pad:
                first = doc if first is None else first
                last = doc
                valid = j + 1
        if first is None:
            first = last = doc
        flags = ("S" if c % (S // L) == 0 else "-") + ("D" if dstart else "-")
        chunks.append(f"{c} seq={c // (S // L)} docs={first}-{last} valid={valid} flags={flags} : " +
                      " ".join(str(t) for t, _, _ in part))
    return chunks, doc + 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    mb = sub.add_parser("make-bin")
    mb.add_argument("--tokenizer", required=True)
    mb.add_argument("--out", required=True)
    mb.add_argument("--text", action="append", required=True)
    ck = sub.add_parser("check")
    ck.add_argument("--tokenizer", required=True)
    ck.add_argument("--dump", required=True)
    ck.add_argument("--manifest", required=True)
    ck.add_argument("--seq-len", type=int, required=True)
    ck.add_argument("--chunk-len", type=int, required=True)
    ck.add_argument("--doc-aligned", action="store_true")
    ck.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    if a.cmd == "make-bin":
        eos = eos_id(tok)
        ids = []
        for t in a.text:
            ids += tok.encode(t, add_special_tokens=False).ids + [eos]
        hdr = struct.pack("<256i", 20240801, 7, len(ids), *([0] * 253))
        open(a.out, "wb").write(hdr + struct.pack(f"<{len(ids)}I", *ids))
        return 0
    want, ndocs = reference(a.inputs, tok, a.seq_len, a.chunk_len, a.doc_aligned)
    got = open(a.dump).read().splitlines()
    if len(got) != len(want):
        print(f"chunk count: dfm {len(got)}, reference {len(want)}")
        return 1
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if bad:
        i = bad[0]
        print(f"{len(bad)} chunks differ; first at {i}:\n dfm: {got[i][:300]}\n ref: {want[i][:300]}")
        return 1
    counts = json.load(open(a.manifest))["stages"]["chunk"]["counts"]
    if counts["documents"] != ndocs or counts["chunks"] != len(want):
        print(f"manifest counts {counts} vs reference documents={ndocs} chunks={len(want)}")
        return 1
    print(f"{len(want)} chunks and {ndocs} documents equal the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
