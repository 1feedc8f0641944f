#!/usr/bin/env python3
"""make_tokenizer_oracle.py — the oracle for every tokenizer.json component dfm accepts, made with HF `tokenizers`.

    $DFM_PYTHON tests/ref/make_tokenizer_oracle.py            # write tests/data/tokenizer/oracle/*.golden.jsonl
    $DFM_PYTHON tests/ref/make_tokenizer_oracle.py --check    # regenerate in memory, compare, exit 1 on drift
    $DFM_PYTHON tests/ref/make_tokenizer_oracle.py --rebuild-bases    # train the small base models again
    $(bash bench/peers.sh --python) tests/ref/make_tokenizer_oracle.py --rebuild-t5   # the SentencePiece ones

Bases (tests/data/tokenizer/oracle/<base>.tokenizer.json, committed: training is not promised to be
bit-identical across `tokenizers` versions), trained by `tokenizers` on the test corpus (gcide) plus a few
lines of other scripts:
  bl-bpe       byte-level BPE, 1500 tokens (the model under every normalizer and pre-tokenizer variant:
               Sequence[X, ByteLevel(use_regex=false)], so X's pieces decide the ids)
  bpe-suffix   BPE with continuing_subword_prefix "##" and end_of_word_suffix "</w>", an unknown token
  unigram      Unigram, 1200 pieces, <0xNN> byte pieces added (for byte_fallback)
  wordpiece    WordPiece, cased (BertNormalizer without lowercase), 1200 tokens
  wordlevel    WordLevel, 2000 words
  t5           SentencePiece Unigram with the nmt_nfkc charsmap, 2000 pieces, converted as transformers
               converts T5 (Precompiled + Strip + Replace, Metaspace, Unigram) — needs sentencepiece and
               transformers, hence the peers' Python and --rebuild-t5
and the real all-MiniLM-L6-v2 tokenizer.json (BERT uncased WordPiece) and the spm-llama2 BPE of
make_tokenizer_golden.py. Each golden set is a base with a patch (the header holds it; a {"$ref":
"FILE#/json/pointer"} value stands for that part of another file here; a model_patch's "$append" adds
vocabulary entries, merges at the end and first_merges at the start), so the C test
(tests/unit/test_tokenizer.c) builds the same tokenizer.json. Sets: every component alone and the
combinations the families use (Falcon, BLOOM, GPT-NeoX, T5/mT5, ALBERT, XLM-R, CLIP, BERT, ...).

Cases (oracle/cases.jsonl, shared): corpus snippets, the hard cases of make_tokenizer_golden.py (without
its 5000-character ones) and some more, and a fuzz set of random strings drawn from hard classes
(combining marks old and new, compatibility forms, CJK, kana, Hangul, emoji sequences, spaces, controls,
unassigned code points, fragments of special tokens). A set's line holds the case name, HF's ids
(encode, add_special_tokens=False, no truncation), decode and decode_skip (skip_special_tokens) when they
differ from the case text (always for invalid UTF-8), and, for hard cases, each id decoded alone. All sets go into one zstd-compressed
file, oracle/oracle.golden.jsonl.zst (each set: its header line, then its case lines; `zstdcat` reads it).
"""
import argparse
import base64
import copy
import hashlib
import json
import os
import random
import sys
import unicodedata

import zstandard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_golden import corpus_cases, hard_cases  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizer")
ORACLE = os.path.join(HERE, "oracle")
SEED = 20261202
N_CORPUS, N_FUZZ = 24, 100

BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
BL_DEC = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def seq_pre(*stages):
    return {"type": "Sequence", "pretokenizers": list(stages)}


def seq_norm(*stages):
    return {"type": "Sequence", "normalizers": list(stages)}


def split(regex=None, string=None, behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": {"Regex": regex} if regex is not None else {"String": string},
            "behavior": behavior, "invert": invert}


def replace(content, regex=None, string=None):
    return {"type": "Replace", "pattern": {"Regex": regex} if regex is not None else {"String": string},
            "content": content}


def metaspace(scheme="always", split_=True, rep="\u2581"):
    return {"type": "Metaspace", "replacement": rep, "prepend_scheme": scheme, "split": split_}


PROPS_RE = ("\\p{Han}+|\\p{Hiragana}+|\\p{Katakana}+|\\p{Hangul}+|\\p{Lu}|\\p{Ll}|\\p{Lo}|\\p{Lm}|\\p{M}|\\p{Nd}|"
            "\\p{No}|\\p{Nl}|\\p{P}|\\p{Sm}|\\p{Sc}|\\p{Sk}|\\p{So}|\\p{Z}|\\p{Cc}|\\p{Cf}|\\p{Co}|\\w+|\\d|\\s")
SCRIPTS_RE = "|".join("\\p{%s}+" % x for x in (
    "Han", "Hiragana", "Katakana", "Hangul", "Latin", "Greek", "Cyrillic", "Arabic", "Hebrew", "Thai", "Devanagari",
    "Bengali", "Tamil", "Armenian", "Georgian", "Ethiopic", "Khmer", "Lao", "Tibetan", "Inherited", "Common"))
CHARSMAP = {"$ref": "oracle/t5.tokenizer.json#/normalizer/normalizers/0"}
BLOOM_RE = " ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+"
CLIP_RE = ("<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+")


def pre_bl(x):  # a pre-tokenizer X in front of the byte-level base
    return {"pre_tokenizer": seq_pre(x, BL)}


def norm_bl(x):  # a normalizer in front of the byte-level base
    return {"normalizer": x, "pre_tokenizer": BL}


# name -> (base, patch, model_patch)
SETS = {
    # ---- pre-tokenizers (each alone, with the byte-level model behind it)
    **{"pre-split-%s%s" % (b.lower(), "-invert" if inv else ""): ("@oracle/bl-bpe.tokenizer.json",
                                                                 pre_bl(split(regex="\\s+|[,.;:!?]", behavior=b, invert=inv)), {})
       for b in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous") for inv in (False, True)},
    "pre-split-string": ("@oracle/bl-bpe.tokenizer.json", pre_bl(split(string="e", behavior="MergedWithNext")), {}),
    "pre-split-empty-match": ("@oracle/bl-bpe.tokenizer.json", pre_bl(split(regex="x*", behavior="Contiguous")), {}),
    "pre-split-props": ("@oracle/bl-bpe.tokenizer.json", pre_bl(split(regex=PROPS_RE)), {}),
    "pre-split-scripts": ("@oracle/bl-bpe.tokenizer.json", pre_bl(split(regex=SCRIPTS_RE)), {}),
    **{"pre-punctuation-%s" % b.lower(): ("@oracle/bl-bpe.tokenizer.json", pre_bl({"type": "Punctuation", "behavior": b}), {})
       for b in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")},
    "pre-digits": ("@oracle/bl-bpe.tokenizer.json", pre_bl({"type": "Digits", "individual_digits": True}), {}),
    "pre-whitespace": ("@oracle/bl-bpe.tokenizer.json", pre_bl({"type": "Whitespace"}), {}),
    "pre-whitespacesplit": ("@oracle/bl-bpe.tokenizer.json", pre_bl({"type": "WhitespaceSplit"}), {}),
    "pre-bert": ("@oracle/bl-bpe.tokenizer.json", pre_bl({"type": "BertPreTokenizer"}), {}),
    "pre-chardelimiter": ("@oracle/bl-bpe.tokenizer.json", pre_bl({"type": "CharDelimiterSplit", "delimiter": "a"}), {}),
    "pre-unicodescripts": ("@oracle/bl-bpe.tokenizer.json", pre_bl({"type": "UnicodeScripts"}), {}),
    "pre-fixedlength": ("@oracle/bl-bpe.tokenizer.json", pre_bl({"type": "FixedLength", "length": 3}), {}),
    **{"pre-bytelevel-%s-%s" % ("regex" if r else "noregex", "prefix" if p else "noprefix"): (
        "@oracle/bl-bpe.tokenizer.json",
        {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": p, "trim_offsets": True, "use_regex": r}}, {})
       for r in (True, False) for p in (True, False)},
    "pre-bytelevel-then-digits": ("@oracle/bl-bpe.tokenizer.json", {"pre_tokenizer": seq_pre(
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        {"type": "Digits", "individual_digits": True})}, {}),
    **{"pre-metaspace-%s%s" % (s, "" if sp else "-nosplit"): (
        "@spm-llama2.tokenizer.json", {"normalizer": None, "pre_tokenizer": metaspace(s, sp),
                                       "decoder": metaspace(s, sp)}, {})
       for s in ("always", "first", "never") for sp in (True, False)},
    "pre-metaspace-replacement": ("@spm-llama2.tokenizer.json", {"normalizer": None, "pre_tokenizer": metaspace(
        "always", True, "_"), "decoder": metaspace("always", True, "_")}, {}),
    "pre-metaspace-first-strip": ("@spm-llama2.tokenizer.json", {
        "normalizer": {"type": "Strip", "strip_left": True, "strip_right": False},
        "pre_tokenizer": metaspace("first"), "decoder": metaspace("first")}, {}),
    "pre-metaspace-first-lowercase-nfkd": ("@spm-llama2.tokenizer.json", {
        "normalizer": seq_norm({"type": "NFKD"}, {"type": "Lowercase"}),
        "pre_tokenizer": seq_pre({"type": "WhitespaceSplit"}, metaspace("first")), "decoder": metaspace("first")}, {}),
    # ---- normalizers (each alone, in front of the byte-level model)
    **{"norm-%s" % t.lower(): ("@oracle/bl-bpe.tokenizer.json", norm_bl({"type": t}), {})
       for t in ("NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "Nmt")},
    "norm-nfd-stripaccents": ("@oracle/bl-bpe.tokenizer.json", norm_bl(seq_norm({"type": "NFD"}, {"type": "StripAccents"})), {}),
    **{"norm-strip-%s" % w: ("@oracle/bl-bpe.tokenizer.json", norm_bl(
        {"type": "Strip", "strip_left": w != "right", "strip_right": w != "left"}), {}) for w in ("left", "right", "both")},
    "norm-replace-string": ("@oracle/bl-bpe.tokenizer.json", norm_bl(replace("<dot>", string=".")), {}),
    "norm-replace-regex": ("@oracle/bl-bpe.tokenizer.json", norm_bl(replace(" ", regex="\\s+")), {}),
    "norm-prepend": ("@oracle/bl-bpe.tokenizer.json", norm_bl({"type": "Prepend", "prepend": "\u2581"}), {}),
    **{"norm-bert-%s" % k: ("@oracle/bl-bpe.tokenizer.json", norm_bl(dict(
        {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None,
         "lowercase": True}, **v)), {}) for k, v in (
        ("default", {}), ("cased", {"lowercase": False}), ("noclean", {"clean_text": False}),
        ("nochinese", {"handle_chinese_chars": False}), ("keepaccents", {"strip_accents": False}),
        ("stripcased", {"strip_accents": True, "lowercase": False}))},
    "norm-precompiled": ("@oracle/bl-bpe.tokenizer.json", norm_bl(CHARSMAP), {}),
    # ---- models
    "bpe-suffix": ("@oracle/bpe-suffix.tokenizer.json", {}, {}),
    "bpe-suffix-bytefallback": ("@oracle/bpe-suffix.tokenizer.json", {}, {"byte_fallback": True}),
    "bpe-nounk": ("@spm-llama2.tokenizer.json", {}, {"byte_fallback": False, "unk_token": None}),
    "bpe-unk-unfused": ("@spm-llama2.tokenizer.json", {}, {"byte_fallback": False, "fuse_unk": False}),
    "bpe-ignore-merges": ("@spm-llama2.tokenizer.json", {}, {"ignore_merges": True}),
    # runs of "\u2581" merge (Llama-2's "\u2581\u2581\u2581\u2581"): dfm still encodes word by word
    "bpe-meta-runs": ("@spm-llama2.tokenizer.json", {}, {"$append": {
        "vocab": {"\u2581\u2581": 1456, "\u2581\u2581\u2581\u2581": 1457},
        "merges": [["\u2581", "\u2581"], ["\u2581\u2581", "\u2581\u2581"]]}}),
    # a merge that puts "\u2581" after a letter: dfm must encode the whole text as one piece
    "bpe-meta-inner": ("@spm-llama2.tokenizer.json", {}, {"$append": {
        "vocab": {"e\u2581": 1456, "\u2581\u2581": 1457}, "first_merges": [["\u2581", "\u2581"], ["e", "\u2581"]]}}),
    "unigram": ("@oracle/unigram.tokenizer.json", {}, {}),
    "unigram-bytefallback": ("@oracle/unigram.tokenizer.json", {}, {"byte_fallback": True}),
    "unigram-scripts": ("@oracle/unigram.tokenizer.json", {"pre_tokenizer": seq_pre(
        {"type": "UnicodeScripts"}, metaspace("always"))}, {}),
    "wordpiece": ("@oracle/wordpiece.tokenizer.json", {}, {}),
    "wordpiece-short": ("@oracle/wordpiece.tokenizer.json", {}, {"max_input_chars_per_word": 8}),
    "wordlevel": ("@oracle/wordlevel.tokenizer.json", {}, {}),
    "wordlevel-ctc": ("@oracle/wordlevel.tokenizer.json", {"pre_tokenizer": {"type": "WhitespaceSplit"}, "decoder": {
        "type": "CTC", "pad_token": "[UNK]", "word_delimiter_token": "the", "cleanup": True}}, {}),
    # ---- families
    "family-bert-uncased": ("models/all-MiniLM-L6-v2/tokenizer.json", {}, {}),
    "family-t5": ("@oracle/t5.tokenizer.json", {}, {}),
    "family-t5-spm": ("@oracle/t5.tokenizer.json", {
        "normalizer": seq_norm(CHARSMAP, replace("", regex="\\A +| +\\z"), replace(" ", regex=" {2,}"),
                               replace("\u2581", string=" "), replace("\u2581\u2581", regex="\\A\u2581")),
        "pre_tokenizer": seq_pre(metaspace("always", False)),
        "decoder": {"type": "Sequence", "decoders": [replace(" ", string="\u2581"), {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}, {}),
    "family-albert": ("@oracle/t5.tokenizer.json", {
        "normalizer": seq_norm(replace("\"", string="``"), replace("\"", string="''"), {"type": "NFKD"},
                               {"type": "StripAccents"}, {"type": "Lowercase"}, CHARSMAP, replace(" ", regex=" {2,}")),
        "pre_tokenizer": seq_pre({"type": "WhitespaceSplit"}, metaspace("always"))}, {}),
    "family-xlmr": ("@oracle/t5.tokenizer.json", {"normalizer": CHARSMAP, "pre_tokenizer": seq_pre(
        {"type": "WhitespaceSplit"}, metaspace("always"))}, {}),
    "family-falcon": ("@oracle/bl-bpe.tokenizer.json", {"pre_tokenizer": seq_pre(
        {"type": "Punctuation", "behavior": "Contiguous"},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        {"type": "Digits", "individual_digits": False}, split(regex="[0-9][0-9][0-9]", behavior="Isolated"))}, {}),
    "family-bloom": ("@oracle/bl-bpe.tokenizer.json", {"pre_tokenizer": seq_pre(split(regex=BLOOM_RE), BL)}, {}),
    "family-neox": ("@oracle/bl-bpe.tokenizer.json", {"normalizer": {"type": "NFC"}, "pre_tokenizer": {
        "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}}, {}),
    "family-clip": ("@oracle/bpe-suffix.tokenizer.json", {
        "normalizer": seq_norm({"type": "NFC"}, replace(" ", regex="\\s+"), {"type": "Lowercase"}),
        "pre_tokenizer": split(regex=CLIP_RE, behavior="Removed", invert=True)}, {}),
}


# ---------------------------------------------------------------- cases

def extra_hard_cases():
    c = []
    add = lambda name, text: c.append((name, text))
    add("x/leading_trailing", "  hello  world  ")
    add("x/compat", "\ufb01 \ufb02 \u3231 \u2460 \u00b2 \u00bd \u216b \uff21\uff22\uff23 \uff76\uff80\uff76\uff85 \u33a1")
    add("x/keep_marks", "a\u1abfb e\u1df6 x\u0898y \U00011935\U00011930 \U00011938 o\u0301\u1ac0 \u32ff")
    add("x/hangul", "\ud55c\uad6d\uc5b4 \u1112\u1161\u11ab\u1100\u116e\u11a8 \u3131\u314f")
    add("x/cjk_compat", "\uf900\uf901\ufa0e \U0002f800\U0002f801 \u4e00\u4e8c")
    add("x/controls", "\x00a\x01b\u200bc\ufeffd\u00ade\ufffdf\u200dg\x7fh\x0bi\x0cj")
    add("x/lowercase", "\u0130STANBUL \u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3 \u01c5 \u1e9e \u13a0 \u2c2f \U00010400")
    add("x/scripts", "Hello\u4e16\u754c\u3072\u3089\u304c\u306a\u30ab\u30bf\u30ab\u30ca\u30fc\ud55c\uad6d\uc5b4\u0420\u0443\u0441 123 \u0627\u0644")
    add("x/spaces", "a  b   c\t\td \u00a0 e\u3000\u3000f  ")
    add("x/graphemes", "e\u0301 \ufb01\u0301 \r\n x\u200d y \U0001f469\u200d\U0001f4bb \u0915\u094d\u0937 \U0001f1ef\U0001f1f5 a\u0308\u0301")
    add("x/metaspace", " leading space \u2581already a\u2581b _under_ score")
    add("x/longword", "supercalifragilisticexpialidocious" * 4)
    add("x/bytes", "<0x41><0xE2><0x82> <0xAC> <0x+A> <unk>")
    add("x/suffix", "word</w> ##piece ##")
    add("x/ctc", "aa  bb|cc<pad>dd the the x")
    add("x/digits_scripts", "\u0661\u0662\u0663 \u0967\u0968 \uff11\uff12 \u2460\u2461 \U0001d7ce\U0001d7cf 1\u00bd")
    add("x/punct_scripts", "\u00bf\u00a1 \u3002\u3001 \u060c\u061f \u2014\u2013 \u00ab\u00bb \u300c\u300d \u2026")
    add("x/special_like", "[CLS] hi [SEP] [MASK] <s> </s> <pad> <|endoftext|> <mask>")
    return c


def fuzz_cases(rng, words):
    pools = {
        "ascii": [chr(c) for c in range(0x20, 0x7f)],
        "space": [" ", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\u200b", "\u1680", "\u2009"],
        "latin": [chr(c) for c in range(0xc0, 0x250)],
        "marks": [chr(c) for c in list(range(0x300, 0x370)) + [0x1ab0, 0x1abf, 0x1ac0, 0x1dc0, 0x1df6, 0x20d0, 0x0898]],
        "compat": [chr(c) for c in [0xfb01, 0xfb02, 0x2460, 0x00b2, 0x00bd, 0x216b, 0xff21, 0xff41, 0xff76, 0x33a1, 0x3231,
                                    0x1d400, 0x2126, 0x212b, 0x0149, 0x01c4, 0x1e9b]],
        "cjk": [chr(c) for c in list(range(0x4e00, 0x4e40)) + list(range(0xf900, 0xf910)) + [0x20000, 0x2f800]],
        "kana": [chr(c) for c in list(range(0x3041, 0x3060)) + list(range(0x30a1, 0x30c0)) + [0x30fc, 0xff70]],
        "hangul": [chr(c) for c in list(range(0xac00, 0xac20)) + list(range(0x1100, 0x1108)) + list(range(0x1161, 0x1168))
                   + list(range(0x11a8, 0x11ae))],
        "scripts": [chr(c) for c in list(range(0x391, 0x3a9)) + list(range(0x410, 0x430)) + list(range(0x627, 0x640))
                    + list(range(0x905, 0x915)) + [0x94d, 0x93f, 0xe01, 0xe31, 0x5d0, 0x10a0, 0x13a0]],
        "digits": [chr(c) for c in [0x30, 0x31, 0x39, 0x661, 0x967, 0xff11, 0x2460, 0x1d7ce, 0x10d40, 0x116d0, 0xbc, 0x2155]],
        "punct": [chr(c) for c in [0x21, 0x2c, 0x2e, 0x3f, 0xbf, 0xa1, 0x3002, 0x3001, 0x60c, 0x2014, 0x2026, 0xab, 0x300c,
                                    0x2e3b, 0x1f8, 0x5f, 0x2d, 0x27, 0x22, 0x24, 0x2b, 0x3c, 0x7e, 0x5e, 0x60, 0x7c]],
        "emoji": ["\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f469\u200d\U0001f4bb", "\U0001f1ef\U0001f1f5", "\u2764\ufe0f",
                  "1\ufe0f\u20e3", "\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1"],
        "control": [chr(c) for c in [0, 1, 7, 8, 0xb, 0xc, 0x1b, 0x7f, 0x85, 0x8f, 0x9f, 0xad, 0x200d, 0x200e, 0xfeff,
                                     0xfffd, 0xe000, 0xf8ff, 0x2581, 0x9]],
        "unassigned": [chr(c) for c in [0x378, 0x380, 0x5ff, 0x2fff, 0xfdd0, 0x1fffe, 0x30000, 0xe0001, 0x10fffd, 0x31350]],
        "special": ["<s>", "</s>", "<unk>", "[CLS]", "[SEP]", "[MASK]", "<|endoftext|>", "<0x41>", "<0xE2>", "\u2581", "##",
                    "</w>", "<pad>", "''", "``"],
        "word": words,
    }
    names = sorted(pools)
    cases = []
    for i in range(N_FUZZ):
        n = rng.randint(1, 40)
        parts = []
        for _ in range(n):
            parts.append(rng.choice(pools[rng.choice(names)]))
            if rng.random() < 0.3:
                parts.append(" ")
        cases.append(("fuzz/%03d" % i, "".join(parts)))
    return cases


def all_cases(cache):
    rng = random.Random(SEED)
    corpus = corpus_cases(os.path.join(cache, "corpus", "gcide.jsonl"))
    short = [(n, t) for n, t in corpus if len(t) <= 300]
    picked = [("corpus/%02d" % i, t) for i, (_, t) in enumerate(short[:N_CORPUS])]
    hard = [(n, t) for n, t in hard_cases() if not n.startswith("long/")] + extra_hard_cases()
    words = sorted({w for _, t in short for w in t.split() if w.isalpha()})[:400]
    return picked + hard + fuzz_cases(rng, words)


# ---------------------------------------------------------------- tokenizers

def resolve_refs(v):
    if isinstance(v, dict) and set(v) == {"$ref"}:
        path, ptr = v["$ref"].split("#", 1)
        with open(os.path.join(HERE, path), encoding="utf-8") as f:
            node = json.load(f)
        for key in ptr.strip("/").split("/"):
            node = node[int(key)] if isinstance(node, list) else node[key]
        return node
    if isinstance(v, dict):
        return {k: resolve_refs(x) for k, x in v.items()}
    if isinstance(v, list):
        return [resolve_refs(x) for x in v]
    return v


def base_path(cache, base):
    return os.path.join(HERE, base[1:]) if base.startswith("@") else os.path.join(cache, base)


def build(cache, base, patch, model_patch):
    from tokenizers import Tokenizer
    with open(base_path(cache, base), "rb") as f:
        raw = f.read()
    j = json.loads(raw)
    j.update(resolve_refs(copy.deepcopy(patch)))
    model_patch = dict(model_patch)
    append = model_patch.pop("$append", {})  # entries added to model.vocab and merges appended
    j["model"].update(model_patch)
    if append:
        j["model"]["vocab"].update(append.get("vocab", {}))
        j["model"]["merges"] = append.get("first_merges", []) + j["model"]["merges"] + append.get("merges", [])
    t = Tokenizer.from_str(json.dumps(j))
    t.no_truncation()
    t.no_padding()
    return t, hashlib.sha256(raw).hexdigest()


def training_docs(cache, n=300):
    docs = []
    with open(os.path.join(cache, "corpus", "gcide.jsonl"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            docs.append(json.loads(line)["text"])
    docs += ["caf\u00e9 na\u00efve r\u00e9sum\u00e9 d\u00e9j\u00e0 vu \u00fcber stra\u00dfe", "\u6211\u4eec\u4eca\u5929\u53bb\u5317\u4eac",
             "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "\u3072\u3089\u304c\u306a \u30ab\u30bf\u30ab\u30ca",
             "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645"] * 20
    return docs


def write_json(name, tok):
    os.makedirs(ORACLE, exist_ok=True)
    txt = json.dumps(json.loads(tok.to_str()), ensure_ascii=False, indent=1)
    with open(os.path.join(ORACLE, name + ".tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(txt + "\n")
    print("wrote", name, len(txt), "bytes")


def rebuild_bases(cache):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    docs = training_docs(cache)
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=1500, show_progress=False, special_tokens=["<|endoftext|>"],
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    write_json("bl-bpe", t)

    t = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.decoder = decoders.BPEDecoder(suffix="</w>")
    t.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=1200, show_progress=False, special_tokens=["<unk>"],
                                                    limit_alphabet=150, continuing_subword_prefix="##",
                                                    end_of_word_suffix="</w>"))
    j = json.loads(t.to_str())
    for b in range(256):  # byte pieces, for the byte_fallback variant
        j["model"]["vocab"].setdefault("<0x%02X>" % b, len(j["model"]["vocab"]))
    write_json("bpe-suffix", Tokenizer.from_str(json.dumps(j)))

    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.decoder = decoders.Metaspace()
    t.train_from_iterator(docs, trainers.UnigramTrainer(vocab_size=1200, show_progress=False, unk_token="<unk>",
                                                        special_tokens=["<unk>", "<s>", "</s>"]))
    j = json.loads(t.to_str())
    low = min(s for _, s in j["model"]["vocab"])
    j["model"]["vocab"] += [["<0x%02X>" % b, low - 1.0] for b in range(256)]
    j["decoder"] = {"type": "Sequence", "decoders": [j["decoder"], {"type": "ByteFallback"}]}
    write_json("unigram", Tokenizer.from_str(json.dumps(j)))

    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.decoder = decoders.WordPiece()
    t.train_from_iterator(docs, trainers.WordPieceTrainer(vocab_size=1200, show_progress=False, limit_alphabet=150,
                                                          special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]))
    write_json("wordpiece", t)

    t = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator(docs, trainers.WordLevelTrainer(vocab_size=2000, show_progress=False, special_tokens=["[UNK]"]))
    write_json("wordlevel", t)


def rebuild_t5(cache):
    """SentencePiece Unigram with the nmt_nfkc charsmap, converted as transformers converts T5 (needs
    sentencepiece, transformers and protobuf: the peers' venv)."""
    import tempfile
    import types

    import sentencepiece as spm
    from transformers.convert_slow_tokenizer import T5Converter
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "corpus.txt"), "w", encoding="utf-8") as f:
            for doc in training_docs(cache, 2000):
                f.write(doc.replace("\n", " ") + "\n")
        spm.SentencePieceTrainer.train(input=os.path.join(d, "corpus.txt"), model_prefix=os.path.join(d, "t5"),
                                       vocab_size=2000, model_type="unigram", normalization_rule_name="nmt_nfkc",
                                       character_coverage=0.9995, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                       minloglevel=2, num_threads=1)
        o = types.SimpleNamespace(vocab_file=os.path.join(d, "t5.model"), _extra_ids=3, legacy=True,
                                  add_prefix_space=True, convert_tokens_to_ids=lambda t: 1)
        write_json("t5", T5Converter(o).converted())


# ---------------------------------------------------------------- golden sets

def write_cases(cases):
    lines = []
    for name, text in cases:
        rec = {"name": name}
        if isinstance(text, bytes):
            rec["b64"] = base64.b64encode(text).decode()
            s = text.decode("utf-8", "replace")
            rec["n_replaced"] = s.count("\ufffd")
        else:
            s = text
            rec["text"] = text
        rec["nfc"] = unicodedata.normalize("NFC", s) == s
        lines.append(json.dumps(rec, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def golden(name, tok, header, cases):
    import tokenizers
    header = dict(header, tokenizers_version=tokenizers.__version__, n=len(cases), cases="oracle/cases.jsonl")
    lines = [json.dumps(header, ensure_ascii=False)]
    texts = [t.decode("utf-8", "replace") if isinstance(t, bytes) else t for _, t in cases]
    encs = tok.encode_batch(texts, add_special_tokens=False)
    for (cname, _), s, e in zip(cases, texts, encs):
        rec = {"name": cname, "ids": e.ids}
        d = tok.decode(e.ids, skip_special_tokens=False)
        skip = tok.decode(e.ids, skip_special_tokens=True)
        if d != s or cname.startswith("invalid/"):
            rec["decode"] = d
        if skip != d:
            rec["decode_skip"] = skip
        if not cname.startswith(("corpus/", "fuzz/")):
            rec["pieces"] = [tok.decode([i], skip_special_tokens=False) for i in e.ids]
        lines.append(json.dumps(rec, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=os.environ.get("DFM_CACHE", "/var/cache/dfm"))
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    ap.add_argument("--rebuild-bases", action="store_true")
    ap.add_argument("--rebuild-t5", action="store_true")
    ap.add_argument("--only", help="only the sets whose name contains this")
    args = ap.parse_args()
    if args.rebuild_bases:
        rebuild_bases(args.cache)
    if args.rebuild_t5:
        rebuild_t5(args.cache)
        return 0
    cases = all_cases(args.cache)
    sets = []
    for name, (base, patch, model_patch) in SETS.items():
        if args.only and args.only not in name:
            continue
        tok, sha = build(args.cache, base, patch, model_patch)
        header = {"golden": 1, "tokenizer": name, "base": base, "sha256": sha, "patch": patch, "model_patch": model_patch}
        sets.append(golden(name, tok, header, cases))
    outputs = {"cases.jsonl": write_cases(cases), "oracle.golden.jsonl.zst": "".join(sets)}
    if args.only:
        outputs.pop("oracle.golden.jsonl.zst")
        print("".join(sets)[:2000])
    drift = 0
    for fn, data in outputs.items():
        path = os.path.join(ORACLE, fn)
        zst = fn.endswith(".zst")
        if args.check:
            old = None
            if os.path.exists(path):
                with open(path, "rb") as f:
                    old = f.read()
                old = (zstandard.ZstdDecompressor().decompress(old) if zst else old).decode("utf-8")
            if old != data:
                print("DRIFT:", path)
                drift += 1
        else:
            os.makedirs(ORACLE, exist_ok=True)
            with open(path + ".tmp", "wb") as f:
                f.write(zstandard.ZstdCompressor(level=19).compress(data.encode()) if zst else data.encode())
            os.replace(path + ".tmp", path)
    print("%s %d files (%d sets, %d cases)" % ("checked" if args.check else "wrote", len(outputs), len(sets), len(cases)))
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
