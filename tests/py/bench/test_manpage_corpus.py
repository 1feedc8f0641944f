"""The manual-page corpus (scripts/make_manpage_corpus.py, run as a program), read back against the package's own
sources by an independent reader:
  1. two runs write the same bytes; ids are PREFIX-000000, -000001, ... in order;
  2. every document is a page manpages-dev installed in section 2 or 3: a regular file, not a symbolic link and not a
     `.so` page (another name for a page already there), taken in the order of the SHA-256 of the file's name, with no
     installed regular page skipped before the last one taken;
  3. each document starts with the page's NAME line as its source states it (.SH NAME, then the line, groff's "\\-"
     as "-"), so the text is that page's and not another's; no overstrike, escape or running-header residue; no
     hyphen left at a joined line break; at most --doc-bytes unless one paragraph alone is longer;
  4. an unknown package is refused with a message naming it, and nothing is written.
SKIP without manpages-dev or groff (scripts/deps.sh installs both). Exits non-zero on failure.
"""
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "make_manpage_corpus.py")
DOC_BYTES = 4000


def installed_pages():
    p = subprocess.run(["dpkg-query", "-L", "manpages-dev"], capture_output=True, text=True)
    if p.returncode or not shutil.which("groff"):
        return None
    return [f for f in p.stdout.splitlines() if re.search(r"/share/man/man[23]/", f) and os.path.isfile(f)]


def source(path):
    raw = open(path, "rb").read()
    return (gzip.decompress(raw) if path.endswith(".gz") else raw).decode("utf-8", errors="replace")


def name_line(src):
    """the line after .SH NAME in the page's source, as groff prints it (\\- a hyphen, font escapes dropped)"""
    lines = src.splitlines()
    for i, ln in enumerate(lines):
        if re.match(r'\.SH\s+"?NAME"?\s*$', ln):
            body = []
            for nxt in lines[i + 1:]:
                if nxt.startswith(".SH") or nxt.startswith(".SS"):
                    break
                if nxt.startswith(".") or nxt.startswith("'"):
                    if re.match(r"\.(ad|nh|hy|PP|LP|P)\b", nxt):
                        continue
                    break
                body.append(nxt)
            text = " ".join(body)
            text = text.replace("\\-", "-").replace("\\(em", "\u2014").replace("\\&", "")
            text = re.sub(r"\\f[BIRP]|\\f\(..|\\f\[[A-Z]*\]", "", text)
            return re.sub(r"\s+", " ", text).strip()
    return None


def main():
    pages = installed_pages()
    if pages is None:
        print("SKIP: manpages-dev or groff is not installed (scripts/deps.sh installs both)")
        return
    w = tempfile.mkdtemp(prefix="dfm-manpages-")
    try:
        outs = []
        for i in range(2):
            out = os.path.join(w, "c%d.jsonl" % i)
            p = subprocess.run([sys.executable, SCRIPT, "--max-bytes", "60000", "--doc-bytes", str(DOC_BYTES), "--out", out],
                               capture_output=True, text=True)
            check(p.returncode == 0, "run %d exits 0 (%s)" % (i, p.stderr.strip()[-200:]))
            outs.append(open(out, "rb").read())
        check(outs[0] == outs[1], "two runs write the same bytes")
        docs = [json.loads(l) for l in outs[0].decode().splitlines()]
        check(len(docs) >= 10, "%d documents in 60,000 bytes" % len(docs))
        check([d["id"] for d in docs] == ["manpages-%06d" % i for i in range(len(docs))], "ids in order from 000000")

        # 2. the order and the choice, from the package's file list
        regular = [f for f in pages if not os.path.islink(f) and not source(f).lstrip().startswith(".so ")]
        regular.sort(key=lambda f: (hashlib.sha256(os.path.basename(f).encode()).hexdigest(), f))
        base = lambda f: os.path.basename(f)[:-3] if f.endswith(".gz") else os.path.basename(f)
        want = [base(f) for f in regular[:len(docs)]]
        check([d["page"] for d in docs] == want, "the documents are the first %d regular pages in SHA-256 order of their "
                                                 "names (first: %s)" % (len(docs), want[:3]))
        links = [f for f in pages if os.path.islink(f)]
        check(not {base(f) for f in links} & {d["page"] for d in docs}, "no symbolic-link page taken (%d in the package)"
              % len(links))

        # 3. each text is its page's
        by_name = {base(f): f for f in regular}
        bad_name, residue = [], []
        for d in docs:
            nl = name_line(source(by_name[d["page"]]))
            if nl is None or not d["text"].startswith("NAME " + nl):
                bad_name.append((d["page"], nl, d["text"][:80]))
            t = d["text"]
            if "\x08" in t or "\x1b" in t or re.search(r"\u2010 [a-z]", t) or re.search(r"\b[A-Z_]+\([23][a-z]*\)\s.*\([23][a-z]*\)$",
                                                                                       t.splitlines()[0]):
                residue.append(d["page"])
        check(not bad_name, "every document starts with its page's NAME line as the source states it (%d differ: %s)"
              % (len(bad_name), bad_name[:2]))
        check(not residue, "no overstrike, escape, header or broken-hyphen residue (%s)" % residue[:3])
        long_docs = [d["page"] for d in docs if len(d["text"].encode()) > DOC_BYTES and "\n" in d["text"]]
        check(not long_docs, "documents of several paragraphs stay within --doc-bytes (%s)" % long_docs[:3])

        # 4. refusal
        out = os.path.join(w, "none.jsonl")
        p = subprocess.run([sys.executable, SCRIPT, "--package", "no-such-package-dfm", "--out", out],
                           capture_output=True, text=True)
        check(p.returncode != 0 and "no-such-package-dfm" in p.stderr and not os.path.exists(out),
              "an unknown package is refused, named, and nothing is written (%s)" % p.stderr.strip()[-120:])
    finally:
        shutil.rmtree(w, ignore_errors=True)
    finish("the manual-page corpus")


if __name__ == "__main__":
    main()
