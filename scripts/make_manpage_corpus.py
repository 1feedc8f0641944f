#!/usr/bin/env python3
"""Turn Debian's Linux programmer's manual (manpages-dev: sections 2 and 3) into a JSONL corpus.

This is the real-text benchmark's corpus *with* cross-document redundancy. A dictionary (GCIDE, FOLDOC) says
each thing once; the manual says many things many times: related calls share their errors, return-value
paragraphs, attribute tables and standards sections, and whole families (the pthread_*, str*, *printf pages)
describe each other. What one page will say next is often already written in another page.

Each page is rendered to plain text by groff (man macros, tables, no overstrike), cleaned of layout
indentation and hyphenation, and cut at --doc-bytes on a paragraph boundary. Pages that are only a `.so` or symbolic link to
another page are skipped, so no document is a verbatim copy of another. Pages are taken in the order of a hash of
their name (a spread over both sections, not the alphabet's first letters) until --max-bytes. Output is
deterministic: same package, same groff, same file.

Each line: {"id": "manpages-000123", "page": "pthread_mutex_lock.3", "text": "..."}
"""
import argparse
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys


def read_source(path):
    raw = open(path, "rb").read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    return raw


def render(src, path):
    """The page as plain text: groff's man macros and tbl, ASCII-compatible UTF-8, no overstrike or SGR codes."""
    p = subprocess.run(["groff", "-t", "-man", "-Tutf8", "-P-c", "-P-b", "-P-o", "-P-u", "-rLL=100n", "-rLT=100n", "-rHY=0"],
                       input=src, capture_output=True)
    if p.returncode != 0:
        sys.exit(f"make_manpage_corpus: groff failed on {path}: {p.stderr.decode(errors='replace')[:300]}")
    return p.stdout.decode("utf-8", errors="replace")


def join_lines(lines):
    """One paragraph; a word the page itself broke with a hyphen (U+2010) at a line's end is joined again."""
    out = ""
    for ln in lines:
        if out.endswith("\u2010") and out[-2:-1].isalpha():
            out = out[:-1] + ln
        else:
            out = out + " " + ln if out else ln
    return out


def clean(text):
    """Paragraphs of single-spaced lines; the running header and footer lines of the page are dropped."""
    lines = text.splitlines()
    # groff's first and last non-empty lines are the page header (NAME(3) ... NAME(3)) and footer (package, date)
    body = [ln for ln in lines if ln.strip()]
    if len(body) >= 2:
        first, last = body[0], body[-1]
        lines = [ln for ln in lines if ln not in (first, last)]
    paras, cur = [], []
    for ln in lines:
        ln = re.sub(r"\s+", " ", ln).strip()
        if not ln:
            if cur:
                paras.append(join_lines(cur))
                cur = []
        else:
            cur.append(ln)
    if cur:
        paras.append(join_lines(cur))
    return paras


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--package", default="manpages-dev",
                    help="take only the pages this Debian package installed (dpkg-query -L), so that other packages' "
                         "pages on the machine do not change the corpus")
    ap.add_argument("--sections", default="2,3")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=1_000_000, help="stop after this much text")
    ap.add_argument("--doc-bytes", type=int, default=8000, help="cut a page after this many bytes (paragraph boundary)")
    ap.add_argument("--prefix", default="manpages", help="document ids are PREFIX-NNNNNN")
    a = ap.parse_args()

    p = subprocess.run(["dpkg-query", "-L", a.package], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"make_manpage_corpus: dpkg-query -L {a.package} failed (is {a.package} installed? "
                 f"apt-get install {a.package}): {p.stderr.strip()[:200]}")
    dirs = tuple(f"/man{sec}/" for sec in a.sections.split(","))
    # a symbolic link is another name for a page already there: skipped like a .so page
    pages = [f for f in p.stdout.splitlines()
             if "/share/man/" in f and any(d in f for d in dirs) and os.path.isfile(f) and not os.path.islink(f)]
    if not pages:
        sys.exit(f"make_manpage_corpus: {a.package} installed no pages in sections {a.sections}")
    pages.sort(key=lambda p: (hashlib.sha256(os.path.basename(p).encode()).hexdigest(), p))

    total, ndocs, skipped = 0, 0, 0
    with open(a.out, "w", encoding="utf-8") as out:
        for path in pages:
            if total >= a.max_bytes:
                break
            src = read_source(path)
            if src.lstrip().startswith(b".so "):
                skipped += 1
                continue
            doc, size = [], 0
            for para in clean(render(src, path)):
                n = len(para.encode()) + 1
                if size and size + n > a.doc_bytes + 1:
                    break
                doc.append(para)
                size += n
            if not doc:
                continue
            text = "\n".join(doc)
            name = os.path.basename(path)
            name = name[:-3] if name.endswith(".gz") else name
            out.write(json.dumps({"id": f"{a.prefix}-{ndocs:06d}", "page": name, "text": text}, ensure_ascii=False) + "\n")
            ndocs += 1
            total += len(text.encode())
    print(f"wrote {ndocs} documents, {total} bytes to {a.out} ({skipped} .so pages skipped)", file=sys.stderr)


if __name__ == "__main__":
    main()
