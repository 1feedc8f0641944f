#!/usr/bin/env python3
"""Turn a Debian dictd dictionary (dict-gcide: the embedded default corpus; dict-foldoc: the second corpus of
the real-text benchmark) into a JSONL corpus.

The GNU Collaborative International Dictionary of English (Webster 1913 plus WordNet) is real
English prose: definitions, usage notes and quotations. Entries are read in the order they are
stored in gcide.dict.dz (alphabetical), cleaned of the dictionary's layout indentation, and grouped
into documents of about --doc-bytes bytes (one "page" of consecutive entries), so that documents are
long enough to hold several 32-token chunks. Output is deterministic: same package, same file.

Each line: {"id": "gcide-000123", "text": "..."}
"""
import argparse
import base64
import gzip
import json
import re
import sys

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64num(s):
    """dictd's index stores offsets and lengths as base64 digits, most significant first."""
    n = 0
    for ch in s:
        n = n * 64 + B64.index(ch)
    return n


def clean(entry):
    lines = [re.sub(r"\s+", " ", ln).strip() for ln in entry.splitlines()]
    paras, cur = [], []
    for ln in lines:
        if not ln:
            if cur:
                paras.append(" ".join(cur))
                cur = []
        else:
            cur.append(ln)
    if cur:
        paras.append(" ".join(cur))
    return "\n".join(paras)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dict", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=4_000_000, help="stop after this much text")
    ap.add_argument("--doc-bytes", type=int, default=3000, help="target size of one document")
    ap.add_argument("--skip-bytes", type=int, default=2_000_000,
                    help="skip the first entries (numbers and symbols) to start in real prose")
    ap.add_argument("--prefix", default="gcide", help="document ids are PREFIX-NNNNNN")
    a = ap.parse_args()

    data = gzip.open(a.dict).read()
    spans = set()
    with open(a.index, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3 or parts[0].startswith("00-"):
                continue
            spans.add((b64num(parts[1]), b64num(parts[2])))
    total, ndocs, page = 0, 0, []
    with open(a.out, "w", encoding="utf-8") as out:
        def flush():
            nonlocal ndocs, total, page
            if page:
                text = "\n\n".join(page)
                out.write(json.dumps({"id": f"{a.prefix}-{ndocs:06d}", "text": text}, ensure_ascii=False) + "\n")
                ndocs += 1
                total += len(text.encode())
                page = []
        size = 0
        for off, ln in sorted(spans):
            if off < a.skip_bytes:
                continue
            entry = clean(data[off:off + ln].decode("utf-8", errors="replace"))
            if not entry:
                continue
            page.append(entry)
            size += len(entry) + 2
            if size >= a.doc_bytes:
                flush()
                size = 0
                if total >= a.max_bytes:
                    break
        flush()
    print(f"wrote {ndocs} documents, {total} bytes to {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
