#!/usr/bin/env python3
"""make_tokenizer_golden.py — golden encode/decode cases for dfm's tokenizer, made with HF `tokenizers`.

    $DFM_PYTHON tests/ref/make_tokenizer_golden.py [--cache /var/cache/dfm] [--out tests/data/tokenizer]
    $DFM_PYTHON tests/ref/make_tokenizer_golden.py --check     # regenerate in memory, compare, exit 1 on drift

Writes one JSONL file per tokenizer (tests/data/tokenizer/<name>.golden.jsonl). Line 1 is a header:
    {"golden": 1, "tokenizer": "qwen2.5", "sha256": <tokenizer.json sha256>,
     "tokenizers_version": "0.23.3", "cases": N}
Every further line is one case:
    {"name": "...", "text": "..."}            or {"name": "...", "b64": "<raw bytes, may be invalid UTF-8>"}
    "n_replaced": number of U+FFFD that bytes.decode("utf-8", "replace") introduced (b64 cases),
    "ids":   HF encode(text, add_special_tokens=False).ids (raw bytes are decoded with errors="replace"
             before HF sees them: dfm must do the same replacement itself),
    "decode": HF decode(ids, skip_special_tokens=False),
    "decode_skip": HF decode(ids, skip_special_tokens=True), only when it differs from "decode",
    "pieces": [HF decode([id]) for each id]    (hard cases only: single-token decodes, U+FFFD rules),
    "nfc": true when the (replaced) text is already NFC, so decode(encode(x)) == x must hold.

Deterministic: the corpus snippets come from a fixed-seed PRNG over /var/cache/dfm/corpus/gcide.jsonl.
"""
import argparse
import base64
import hashlib
import json
import os
import random
import sys
import unicodedata

TOKENIZERS = {  # name -> path under $DFM_CACHE, or under the output folder for the constructed ones
    "qwen2.5": "tokenizers/qwen2.5/tokenizer.json",
    "llama-3.2": "tokenizers/llama-3.2/tokenizer.json",
    # SmolLM2-135M's, as `dfm-train import-gguf` builds it from the GGUF (make lm): Digits + ByteLevel
    "smollm2": "models/smollm2-135m/tokenizer.json",
    "spm-llama2": "@spm-llama2.tokenizer.json",
    "spm-metaspace": "@spm-metaspace.tokenizer.json",
}
# Variants, to check code paths the real files do not take. The golden header holds the base file
# ("@name" = in the output folder) and the patch; the C test applies the same patch before loading.
VARIANTS = {
    # GPT-2 layout: no normalizer, a lone ByteLevel pre-tokenizer with the GPT-2 regex and a prefix space
    "qwen2.5-gpt2": ("qwen2.5", {"normalizer": None, "pre_tokenizer": {
        "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}, {}),
    # ignore_merges = true: a pre-token found whole in the vocabulary is emitted as it is
    "llama-3.2-ignore-merges": ("llama-3.2", {}, {"ignore_merges": True}),
    # added-token flags the real files do not use: lstrip, rstrip, single_word, normalized (NFD content)
    "qwen2.5-added-flags": ("qwen2.5", "ADDED_FLAGS", {}),
    # Digits with individual_digits = false: a run of digits is one piece (Falcon-style contiguous digits)
    "smollm2-digits-contiguous": ("smollm2", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}}, {}),
    # no byte fallback: unknown characters become <unk>, runs of them fused (fuse_unk = true)
    "spm-llama2-unk": ("spm-llama2", {}, {"byte_fallback": False}),
}


def added_flags_patch(base_json):
    flags = {"<|im_start|>": {"lstrip": True}, "<|im_end|>": {"rstrip": True}, "</think>": {"single_word": True},
             "<think>": {"lstrip": True, "rstrip": True}, "<tool_call>": {"single_word": True, "lstrip": True}}
    added = []
    for a in base_json["added_tokens"]:
        a = dict(a)
        a.update(flags.get(a["content"], {}))
        added.append(a)
    top = max(a["id"] for a in added)
    for k, content in enumerate(["cafe\u0301", "xyzzy"]):  # normalized: matched in the NFC text
        added.append({"id": top + 1 + k, "content": content, "single_word": content == "xyzzy", "lstrip": False,
                      "rstrip": False, "normalized": True, "special": False})
    return {"added_tokens": added}
N_CORPUS_VARIANT = 30
N_CORPUS = 300
N_CORPUS_SPM = 60  # constructed tokenizers: fewer corpus cases, all hard cases
SEED = 20261129


def corpus_cases(corpus_path):
    docs = []
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            docs.append(json.loads(line)["text"])
    rng = random.Random(SEED)
    cases = []
    for i in range(N_CORPUS):
        doc = docs[rng.randrange(len(docs))]
        # lengths spread over 1 .. ~2000 characters, log-uniform
        n = int(round(2 ** rng.uniform(0, 11)))
        n = min(n, len(doc))
        start = rng.randrange(len(doc) - n + 1)
        cases.append((f"corpus/{i:03d}", doc[start:start + n]))
    return cases


def hard_cases():
    c = []
    add = lambda name, text: c.append((name, text))
    # whitespace
    for i, ws in enumerate([" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ",
                            " \t \n \r\n  ", "a  b", "a   b", "a\t\tb", "a \n b", "a\r\nb", "a\n\n\nb",
                            "trailing   ", "trailing \n", "   leading", "\u00a0nbsp\u00a0 x", "a\u3000b",
                            "x\u2028y\u2029z", "a\u0085b", "a\u180eb", "a\u200bb", "end\n", " \t", "x \t y"]):
        add(f"ws/{i:02d}", ws)
    add("ws/long_spaces", " " * 300 + "x" + " " * 37)
    add("ws/mixed_run", "a" + " \t\r\n\u00a0" * 20 + "b")
    # digits 1..20 and in context
    for n in range(1, 21):
        add(f"digits/{n:02d}", "98765432101234567890"[:n])
    add("digits/ctx", "In 1913, about 12345 words; pi=3.14159265358979, x1y22z333 and ١٢٣ ٤٥٦ (Arabic-Indic) ½ ²")
    add("digits/spaced", "1 22 333 4444 55555 666666")
    # emoji
    add("emoji/simple", "I love 😀 and 🎉!")
    add("emoji/zwj", "family 👨‍👩‍👧‍👦 and 👩🏽‍💻 coder")
    add("emoji/skin", "👍🏻👍🏼👍🏽👍🏾👍🏿")
    add("emoji/flags", "🇫🇷🇯🇵🇺🇸 flags")
    add("emoji/keycap", "1️⃣ #️⃣ ❤️ ☺︎")
    # scripts
    add("cjk/zh", "我们今天去北京大学学习中文。汉字很有意思！")
    add("cjk/ja", "東京は日本の首都です。ひらがなとカタカナ、漢字。")
    add("cjk/ko", "안녕하세요, 세계! 한국어 텍스트입니다.")
    add("cjk/mixed", "Hello世界123テスト")
    add("arabic", "مرحبا بالعالم! هذه جملة عربية مع أرقام 123.")
    add("hindi", "नमस्ते दुनिया। यह हिंदी में एक वाक्य है।")
    add("thai", "สวัสดีครับ ภาษาไทยไม่มีช่องว่าง")
    add("greek_cyrillic", "Καλημέρα κόσμε — Привет, мир! ΣΊΣΥΦΟΣ")
    add("hebrew", "שלום עולם")
    # letters and digits new in Unicode 15 (Kawi, Nag Mundari, CJK Ext. H): \p{L} / \p{N} tables must agree
    add("unicode15", "a\U00031350b \U00011F04\U00011F05 \U0001E4D0\U0001E4D1 1\U0001E4F0\U0001E4F1 2 k\u0CF3 x\U00010EFD y")
    # combining accents: NFC vs NFD (NFC normalizer makes them differ for Qwen)
    add("accents/nfc", unicodedata.normalize("NFC", "café naïve résumé Ångström Ελληνικά ệ ǖ"))
    add("accents/nfd", unicodedata.normalize("NFD", "café naïve résumé Ångström Ελληνικά ệ ǖ"))
    add("accents/stacked", "e\u0301\u0323 a\u0308\u0301 Z\u0335\u0321\u0317a\u0334l\u0336g\u0337o\u0338")
    add("accents/hangul_jamo", "\u1100\u1161\u11a8 \u1112\u1161\u11ab")
    add("accents/compat", "ﬁ ﬀ Ⅻ ㎏ ＡＢＣ")  # NFC keeps compatibility characters
    # invalid UTF-8 (raw bytes)
    raws = [b"abc\xffdef", b"\x80", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xf0\x9f\x98",
            b"\xf0\x9f\x98\x80\xf0\x9f", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf5\x80\x80\x80", b"\xf4\x90\x80\x80",
            b"\xe0\x80\x80", b"a\xfe\xfeb", b"\xef\xbb\xbfBOM", b"ok \xe6\x97\xa5\xe6\x9c text \xff\xfe \xc2",
            bytes(range(0x80, 0x100)), b"x\x00y"]
    for i, r in enumerate(raws):
        c.append((f"invalid/{i:02d}", r))
    # long words
    add("long/a5000", "a" * 5000)
    add("long/word5000", ("antidisestablishmentarianism" * 200)[:5000])
    add("long/cjk1000", "漢字" * 500)
    add("long/punct3000", "-=" * 1500)
    # contractions, cases
    add("contractions", "I'm you're he's she'll we've they'd it's can't won't")
    add("contractions/upper", "I'M YOU'RE HE'S SHE'LL WE'VE THEY'D IT'S CAN'T 'S 'LL 'Re 'rE 'Ve 'D")
    add("contractions/edge", "'s's 'll'll ''s x' 's' rock'n'roll o'clock ’s")
    # special tokens inside text
    add("special/eot", "before<|endoftext|>after")
    add("special/eot_spaces", "a <|endoftext|> b  <|endoftext|>\n<|endoftext|>")
    add("special/llama", "<|begin_of_text|>Hi<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nyo<|end_of_text|>")
    add("special/qwen", "<|im_start|>user\nhi<|im_end|>\n<think>\nok\n</think> done <tool_call>x</tool_call>")
    add("special/spm", "<s>Hello</s> world<unk>x </s>")  # SentencePiece specials; Metaspace "first" after <s>
    add("special/partial", "<|endoftext| <|endoftext <|endoftext|>|> <<|endoftext|>>")
    # empty, single chars
    add("empty", "")
    for i, ch in enumerate(["a", "Z", " ", ".", "é", "中", "😀", "\u0301", "\n", "'", "0", "\ufffd", "\x7f", "\x01"]):
        add(f"single/{i:02d}", ch)
    # punctuation runs
    add("punct/run", "!!!??? ... ,,, ;;; ::: --- ___ *** ### @@@ $$$ %%% ^^^ &&& (((( )))) [[[ ]]] {{{ }}}")
    add("punct/mixed", "Wait... what?! \"Quoted\" 'single' «guillemets» „German“ — dash – en … ellipsis")
    add("punct/newlines", "end.\n\n\n!!!\r\n\r\n??\n")
    # code
    add("code/c", "int main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) {\n\tprintf(\"%s\\n\", argv[i]);\n    }\n    return 0;\n}\n")
    add("code/python", "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\nclass A:\n    pass\n")
    add("code/json", '{"key": "value", "n": 12345, "arr": [true, false, null], "nested": {"x": -1.5e10}}')
    add("code/url", "https://example.com/path?q=1&r=two#frag mailto:user@example.org C:\\Windows\\System32")
    # added-token flags (exercised by the qwen2.5-added-flags variant)
    add("added/flags", "a  <|im_start|>  b<|im_end|>   c \t<think>\t d</think>e f </think> g x<tool_call> "
        "<tool_call>y café cafe\u0301 xyzzy axyzzy xyzzy_ xyzzy.")
    # words that Llama-3's vocabulary holds whole but its merges would split: ids differ with ignore_merges
    add("ignore_merges/vi", "Việt Nam có nhiều việc hợp điều ngoài nhiên; jeho ایران ektedir")
    add("mixed/everything", "Hello, WORLD! It's 2026-11-29T18:00Z. 東京 café 😀👍🏽 <|endoftext|>\t\tfin\r\n")
    return c


def build_spm_tokenizers(cache, out_dir, rebuild):
    """No real SentencePiece-BPE tokenizer.json (Llama-2 / Mistral) is installable here, so we construct
    two small ones with HF `tokenizers` itself, trained on the corpus: the Llama-2 layout (normalizer
    Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, <0xNN> byte fallback, decoder Replace +
    ByteFallback + Fuse + Strip) and the newer Metaspace layout (pre-tokenizer Metaspace(prepend_scheme
    "first"), decoder Metaspace). They are written once and committed (training is not guaranteed to be
    bit-identical across tokenizers versions); --rebuild-spm makes them again."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    paths = {n: os.path.join(out_dir, f"{n}.tokenizer.json") for n in ("spm-llama2", "spm-metaspace")}
    if not rebuild and all(os.path.exists(p) for p in paths.values()):
        return
    docs = []
    with open(os.path.join(cache, "corpus", "gcide.jsonl"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 300:
                break
            docs.append(json.loads(line)["text"])
    docs += ["café naïve résumé déjà vu über straße", "我们今天去北京大学学习中文", "Привет мир"] * 20
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    t.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>"],
                                                    limit_alphabet=120, show_progress=False))
    trained = json.loads(t.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for tok_str, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if tok_str not in vocab:
            vocab[tok_str] = len(vocab)
    merges = trained["merges"]
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, s in enumerate(specials)]
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
             "vocab": vocab, "merges": merges}
    spm_decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    llama2 = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
              "normalizer": {"type": "Sequence", "normalizers": [
                  {"type": "Prepend", "prepend": "\u2581"},
                  {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
              "pre_tokenizer": None, "post_processor": None, "decoder": spm_decoder, "model": model}
    meta = dict(llama2, normalizer=None,
                pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
                decoder={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True})
    for name, j in (("spm-llama2", llama2), ("spm-metaspace", meta)):
        txt = json.dumps(j, ensure_ascii=False, indent=1)
        Tokenizer.from_str(txt)  # HF must accept it
        os.makedirs(out_dir, exist_ok=True)
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write(txt + "\n")
        print(f"constructed {paths[name]}: {len(vocab)} ids, {len(merges)} merges")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=os.environ.get("DFM_CACHE", "/var/cache/dfm"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                                   "tokenizer"))
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    ap.add_argument("--rebuild-spm", action="store_true", help="construct the SentencePiece-style tokenizers again")
    args = ap.parse_args()
    import tokenizers
    from tokenizers import Tokenizer

    if not args.check:
        build_spm_tokenizers(args.cache, args.out, args.rebuild_spm)
    corpus = corpus_cases(os.path.join(args.cache, "corpus", "gcide.jsonl"))
    drift = 0
    jobs = []
    for name, rel in TOKENIZERS.items():
        path = os.path.join(args.out, rel[1:]) if rel.startswith("@") else os.path.join(args.cache, rel)
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        header = {"golden": 1, "tokenizer": name, "sha256": sha}
        cases = (corpus[:N_CORPUS_SPM] if rel.startswith("@") else corpus) + hard_cases()
        jobs.append((name, header, Tokenizer.from_file(path), cases, True))
    for name, (base, patch, model_patch) in VARIANTS.items():
        rel = TOKENIZERS[base]
        with open(os.path.join(args.out, rel[1:]) if rel.startswith("@") else os.path.join(args.cache, rel), "rb") as f:
            raw = f.read()
        j = json.loads(raw)
        if patch == "ADDED_FLAGS":
            patch = added_flags_patch(j)
        j.update(patch)
        j["model"].update(model_patch)
        header = {"golden": 1, "tokenizer": name, "base": rel, "sha256": hashlib.sha256(raw).hexdigest(),
                  "patch": patch, "model_patch": model_patch}
        jobs.append((name, header, Tokenizer.from_str(json.dumps(j)), corpus[:N_CORPUS_VARIANT] + hard_cases(), False))
    for name, header, tok, cases, with_pieces in jobs:
        header.update(tokenizers_version=tokenizers.__version__, cases=len(cases))
        lines = [json.dumps(header)]
        for cname, text in cases:
            rec = {"name": cname}
            if isinstance(text, bytes):
                rec["b64"] = base64.b64encode(text).decode()
                s = text.decode("utf-8", "replace")
                rec["n_replaced"] = s.count("\ufffd")
            else:
                rec["text"] = text
                s = text
            ids = tok.encode(s, add_special_tokens=False).ids
            rec["ids"] = ids
            rec["decode"] = tok.decode(ids, skip_special_tokens=False)
            skip = tok.decode(ids, skip_special_tokens=True)
            if skip != rec["decode"]:  # stored only when it differs (keeps the files small)
                rec["decode_skip"] = skip
            if with_pieces and not cname.startswith("corpus/") and not cname.startswith("long/"):
                rec["pieces"] = [tok.decode([i], skip_special_tokens=False) for i in ids]
            rec["nfc"] = unicodedata.normalize("NFC", s) == s
            lines.append(json.dumps(rec, ensure_ascii=False))
        out = os.path.join(args.out, f"{name}.golden.jsonl")
        data = "\n".join(lines) + "\n"
        if args.check:
            with open(out, encoding="utf-8") as f:
                old = f.read()
            if old != data:
                print(f"DRIFT: {out} differs from a fresh generation (tokenizers {tokenizers.__version__})")
                drift += 1
            else:
                print(f"ok: {out} ({len(cases)} cases)")
        else:
            os.makedirs(args.out, exist_ok=True)
            with open(out + ".tmp", "w", encoding="utf-8") as f:
                f.write(data)
            os.replace(out + ".tmp", out)
            print(f"wrote {out}: {len(cases)} cases, {len(data)} bytes")
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
