"""make_seeds.py — write the seed corpora of tests/fuzz/ (tests/fuzz/seeds/<harness>/): small, valid
inputs of each format, so the fuzzers start from files the parsers accept and mutate from there.
Run with the project's Python (it needs xxhash, zstandard and pyarrow):  python3 tests/fuzz/make_seeds.py
The binary layouts are those of schemas/*.md; checksums are written right although the shard harnesses
reseal them anyway."""
import base64
import gzip
import json
import os
import struct

import xxhash
import zstandard

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")


def put(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def h64(b, seed=0):
    return xxhash.xxh3_64_intdigest(b, seed=seed)


def seal128(head120_without_sums, payload, payload_off):
    """A 128-byte header: fields, payload checksum at payload_off, header checksum at 120."""
    h = bytearray(head120_without_sums.ljust(120, b"\0"))
    h[payload_off:payload_off + 8] = struct.pack("<Q", h64(payload))
    return bytes(h) + struct.pack("<Q", h64(bytes(h))) + payload


def chunk_shard():
    L, n, vocab = 4, 3, 100
    recs = b""
    for i in range(n):
        recs += struct.pack("<QQHHI", i, i, L - (i == n - 1), 1 | 2 * (i == 0), 0)
        recs += struct.pack("<4I", *[(7 * i + j) % vocab for j in range(L)])
    head = b"DFMCHNK1" + struct.pack("<6I4Q2I2Q", 1, 128, L, 2 * L, 4, 0, 0, n, vocab, 0x1234, 99, 0,
                                     len(recs), 0)
    put("chunk_shard", "three_chunks", seal128(head, recs, 80))


def embedding_shard():
    for dtype, fmt, size in ((0, "<f", 4), (1, "<e", 2)):
        dim, n = 4, 2
        rows = b"".join(struct.pack(fmt, 0.25 * (r + 1) * (c - 1.5)) for r in range(n) for c in range(dim))
        head = b"DFMEMBD1" + struct.pack("<4I6Q", 1, 128, dim, dtype, 0, n, 0xAB, 0x1234, len(rows), 0)
        put("embedding_shard", f"two_rows_{size * 8}", seal128(head, rows, 64))


def hidden_states():
    """dim 4, three keys and their next-token values; payload hash at 72, header hash at 80 (field zero)."""
    dim, n = 4, 3
    payload = b"".join(struct.pack("<f", 0.5 * r - 0.25 * c) for r in range(n) for c in range(dim))
    payload += struct.pack("<3I", 7, 9, 0xFFFFFFFF)
    h = bytearray(b"DFMHIDN1" + struct.pack("<IIQII7Q", 1, 128, n, dim, 64, 64, 0, 0xAB, 0x1234, len(payload), h64(payload), 0))
    h = h.ljust(128, b"\0")
    h[80:88] = struct.pack("<Q", h64(bytes(h)))
    put("hidden_states", "three_keys", bytes(h) + payload)


def teacher_file():
    """one sequence of 2 rows, chunk 1, top 2, paste 1, vocab 50: row 0 a target only, row 1 a teacher row."""
    top, rb = 2, 8 * 2 + 16
    rows = struct.pack("<2I2f2f2I", 0, 0, 0.0, 0.0, 0.0, -3.5, 1, 0)
    rows += struct.pack("<2I2f2f2I", 7, 3, -0.5, -1.25, -1.25, -2.0, 3, 0)
    h = bytearray(b"DFMTCHR1" + struct.pack("<IIQIIIIIIQQQQQII", 1, 128, 1, 2, 1, top, 1, 50, rb, 0xAB, 0x1234,
                                             len(rows), h64(rows), 0, 0, 0))
    h = h.ljust(128, b"\0")
    h[80:88] = struct.pack("<Q", h64(bytes(h)))
    put("teacher_file", "two_rows", bytes(h) + rows)


def neighbor_shard():
    k, n, total = 3, 2, 10
    k2 = (k + 1) & ~1
    row_bytes = 8 * k + 4 * k2 + 8
    rows = b""
    for r in range(n):  # inner product: scores descending; the last slot empty
        rows += struct.pack("<3q", 5 + r, 2, -1) + struct.pack("<4f", 0.9, 0.5, 0.0, 0.0) + struct.pack("<Q", 3)
    head = b"DFMNBRS1" + struct.pack("<4I4Q2I3Q", 1, 128, k, 0, 4, n, row_bytes, total, 1, 1, len(rows), 0, 0)
    put("neighbor_shard", "two_rows_ip", seal128(head, rows, 72))


def target_record():
    for flags, dtype, raw in ((0, 1, False), (4, 2, True)):
        k, d = 2, 3
        payload = struct.pack("<Q", 1) + struct.pack("<2q", 7, -1) + struct.pack("<2f", 0.8, 0.0)
        if not flags & 4:
            payload += struct.pack("<6f", 1, 2, 3, 0, 0, 0)
        stored = payload if raw else zstandard.ZstdCompressor(level=3, write_content_size=True).compress(payload)
        f = flags | (2 if raw else 0)
        head = b"DFTR" + struct.pack("<HHQHBBIIIQ", 1, f, 42, k, dtype, 0, d, len(payload), len(stored),
                                     h64(payload))
        rec = head + struct.pack("<Q", h64(stored, seed=h64(head))) + stored
        put("target_record", f"k2_d3_{'raw_ids' if raw else 'zstd_emb'}", rec)


def safetensors():
    data = struct.pack("<6f", 1, 2, 3, 4, 5, 6) + struct.pack("<2e", 0.5, -2)
    hdr = json.dumps({"__metadata__": {"format": "pt"},
                      "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                      "b": {"dtype": "F16", "shape": [2], "data_offsets": [24, 28]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    put("safetensors", "two_tensors", struct.pack("<Q", len(hdr)) + hdr + data)


def token_bin():
    for version, fmt in ((1, "<H"), (2, "<I")):
        toks = [50256, 15496, 11, 995, 50256, 40, 716, 257, 1332, 13, 50256]
        head = struct.pack("<256i", 20240520, version, len(toks), *([0] * 253))
        put("token_bin", f"v{version}", head + b"".join(struct.pack(fmt, t) for t in toks))


def gzip_seeds():
    # mtime=0: the same bytes on every run; one member, three members, and a stored (level 0) member
    text = b'{"text": "Hello world."}\n{"id": 2, "text": "caf\\u00e9"}\n{"text": ""}\n'
    put("gzip", "one_member", gzip.compress(text, mtime=0))
    put("gzip", "three_members", b"".join(gzip.compress(text[i:i + 20], mtime=0) for i in range(0, len(text), 20)))
    put("gzip", "stored", gzip.compress(text, compresslevel=0, mtime=0))
    # refused: a reserved FLG bit (RFC 1952), and no member at all
    flg = bytearray(gzip.compress(text, mtime=0))
    flg[3] |= 0x20
    put("gzip", "reserved_flag", bytes(flg))
    put("gzip", "empty", b"")


def parquet_seeds():
    # small files across the writer options dfm must read (the harness reads column "text")
    import io
    import pyarrow as pa
    import pyarrow.parquet as pq
    texts = ["Hello world.", None, "caf\u00e9 \U0001f600", "", "Hello world.", "a longer line of text " * 3]
    table = pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": pa.array(texts, pa.string())})
    for name, kw in (("snappy_dict_v1", dict(compression="snappy")),
                     ("zstd_plain_v2", dict(compression="zstd", use_dictionary=False, data_page_version="2.0")),
                     ("gzip_groups", dict(compression="gzip", row_group_size=2, write_page_checksum=True)),
                     ("none_pages", dict(compression="none", data_page_size=16, use_dictionary=False))):
        buf = io.BytesIO()
        pq.write_table(table, buf, **kw)
        put("parquet", name, buf.getvalue())
    # a table of 0 rows (one row group of 0 rows, data page offset 0: valid) and two columns named "text"
    for name, t in (("zero_rows", pa.table({"text": pa.array([], pa.string())})),
                    ("two_text_columns", pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"]))):
        buf = io.BytesIO()
        pq.write_table(t, buf)
        put("parquet", name, buf.getvalue())


def text_seeds():
    put("jsonl", "three_lines", '{"text": "Hello world."}\n{"id": 2, "text": "caf\\u00e9 \\ud83d\\ude00"}\n'
        '{"text": ""}\n')
    put("vocab_txt", "bert_like", "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", ",",
                                             "!", "un", "##aff", "##able", "x", "caf", "##e"]) + "\n")
    put("encoder_config", "bert", json.dumps({
        "architectures": ["BertModel"], "model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 15, "max_position_embeddings": 64,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}, indent=1))
    put("backbone_config", "llama", json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True}, indent=1))
    put("backbone_config", "gpt2", json.dumps({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
        "vocab_size": 256, "n_positions": 128, "layer_norm_epsilon": 1e-5}, indent=1))
    vocab = {c: i for i, c in enumerate(["h", "e", "l", "o", "\u0120", "w", "r", "d", "he", "ll", "hell", "hello"])}
    put("tokenizer_json", "byte_level_bpe", json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": 12, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
                  "vocab": vocab, "merges": ["h e", "l l", "he ll", "hell o"]}}, indent=1))


def tiny_charsmap():
    """A SentencePiece precompiled charsmap with one rule, "A" -> "a": u32 trie size, 256 Darts units (the
    root's offset 1; the unit of byte 0x41 at 1 ^ 0x41 with its leaf flag and offset 2; the leaf's value,
    0, at 0x40 ^ 2), then the replacement strings. Every byte's unit lies inside the array, as in a real one."""
    units = [0] * 256
    units[0] = 1 << 10
    units[1 ^ 0x41] = (2 << 10) | (1 << 8) | 0x41
    units[(1 ^ 0x41) ^ 2] = 0
    trie = b"".join(struct.pack("<I", u) for u in units)
    return base64.b64encode(struct.pack("<I", len(trie)) + trie + b"a\0").decode()


def tokenizer_seeds():
    """One small tokenizer.json per model and most normalizers, pre-tokenizers and decoders, so the fuzzer
    starts from files each parser accepts."""
    added = lambda i, c: {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}
    meta = lambda rep, scheme="always": {"type": "Metaspace", "replacement": rep, "prepend_scheme": scheme, "split": True}
    pieces = [["<unk>", 0.0], ["\u2581", -1.0], ["\u2581he", -2.0], ["llo", -2.5], ["h", -3.0], ["e", -3.0],
              ["l", -3.0], ["o", -3.0], ["\u2581w", -4.0], ["or", -4.0], ["ld", -4.0]]
    pieces += [["<0x%02X>" % b, -9.0] for b in (0x41, 0xC3, 0xA9)]
    put("tokenizer_json", "t5_unigram", json.dumps({
        "version": "1.0", "added_tokens": [added(0, "<unk>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Precompiled", "precompiled_charsmap": tiny_charsmap()},
            {"type": "Strip", "strip_left": False, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": "\u2581"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, meta("\u2581", "first")]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "Unigram", "unk_id": 0, "vocab": pieces, "byte_fallback": True}}, indent=1))
    wp = {t: i for i, t in enumerate(["[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "he", "##llo", "!", "\u00e9"])}
    put("tokenizer_json", "bert_wordpiece", json.dumps({
        "version": "1.0", "added_tokens": [added(0, "[UNK]"), added(1, "[CLS]"), added(2, "[SEP]")],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": wp}}, indent=1))
    put("tokenizer_json", "wordlevel_ctc", json.dumps({
        "version": "1.0", "added_tokens": [added(0, "<pad>")],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Nmt"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, {"type": "UnicodeScripts"},
                                                                {"type": "FixedLength", "length": 4}]},
        "decoder": {"type": "CTC", "pad_token": "<pad>", "word_delimiter_token": "|", "cleanup": True},
        "model": {"type": "WordLevel", "unk_token": "<unk>",
                  "vocab": {t: i for i, t in enumerate(["<pad>", "<unk>", "hell", "o", "worl", "d", "|"])}}}, indent=1))
    bv = {t: i for i, t in enumerate(["<unk>", "h", "##e", "##l", "##o", "##o</w>", "w", "##r", "##d</w>", "he",
                                      "hel", "hell", "hello</w>", "<0x41>"])}
    put("tokenizer_json", "bpe_suffix_clip", json.dumps({
        "version": "1.0", "added_tokens": [],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}, {"type": "Lowercase"},
            {"type": "StripAccents"}, {"type": "Prepend", "prepend": "\u2581"}]},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+"},
                          "behavior": "Removed", "invert": True},
        "decoder": {"type": "BPEDecoder", "suffix": "</w>"},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": "##",
                  "end_of_word_suffix": "</w>", "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": bv, "merges": ["h ##e", "he ##l", "hel ##l", "hell ##o</w>"]}}, indent=1))
    t = json.load(open(os.path.join(OUT, "tokenizer_json", "byte_level_bpe")))
    t["normalizer"] = {"type": "NFKD"}
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Punctuation", "behavior": "Contiguous"},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        {"type": "Digits", "individual_digits": False},
        {"type": "Split", "pattern": {"Regex": "[0-9][0-9][0-9]"}, "behavior": "MergedWithNext", "invert": False},
        {"type": "CharDelimiterSplit", "delimiter": "o"}]}
    put("tokenizer_json", "falcon_like", json.dumps(t, indent=1))


def regression_seeds():
    """Inputs that once got through (sizes from claims, wrapped products, unchecked ranges): each parser
    must refuse or bound them; the harnesses assert it."""
    t = json.load(open(os.path.join(OUT, "tokenizer_json", "byte_level_bpe")))
    t["added_tokens"].append({"id": 2**31 - 1, "content": "<|huge|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
    put("tokenizer_json", "added_id_2p31", json.dumps(t))
    # a byte-level vocabulary without the space and most bytes, and no unk_token: pieces that make no ids at
    # all (the harness also encodes the input itself, whose first piece "{" has none), which the piece cache
    # stores (an empty id list once reached it through a null pointer: UBSan)
    t = json.load(open(os.path.join(OUT, "tokenizer_json", "byte_level_bpe")))
    put("tokenizer_json", "no_ids_piece", json.dumps(t).replace('"\\u0120"', '"\\u0121"'))
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [2**31, 2**31], "data_offsets": [0, 0]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    put("safetensors", "shape_product_wraps", struct.pack("<Q", len(hdr)) + hdr)
    c = json.load(open(os.path.join(OUT, "backbone_config", "llama")))
    c["hidden_size"] = 2**32 + 32
    put("backbone_config", "hidden_2p32_plus_32", json.dumps(c))
    c = json.load(open(os.path.join(OUT, "encoder_config", "bert")))
    c["layer_norm_eps"] = -1
    put("encoder_config", "negative_eps", json.dumps(c))


def gguf_bytes(kvs, tensors, alignment=32):
    """A GGUF v3 file: kvs [(key, vtype, value)], tensors [(name, ne fastest first, ggml type, data bytes)].
    Value types: 4 u32, 6 f32, 7 bool, 8 string, 9 (elem vtype, list) array."""
    def st(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def val(t, v):
        if t == 4:
            return struct.pack("<I", v)
        if t == 5:
            return struct.pack("<i", v)
        if t == 6:
            return struct.pack("<f", v)
        if t == 7:
            return struct.pack("<B", v)
        if t == 8:
            return st(v)
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(val(et, x) for x in items)
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += st(k) + struct.pack("<I", t) + val(t, v)
    off, blobs = 0, b""
    for name, ne, ty, data in tensors:
        out += st(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", ty, off)
        pad = -len(data) % alignment
        blobs += data + b"\0" * pad
        off += len(data) + pad
    out += b"\0" * (-len(out) % alignment)
    return out + blobs


def gguf():
    """A one-layer Llama with a byte-level tokenizer (pre smollm), and K-quant tensors alone. Regressions: an
    empty file (mapped to NULL), a merge whose result the vocabulary lacks (the builder wrote a
    tokenizer.json that dfm's tokenizer and `tokenizers` refuse), and a tensor whose byte count wrapped."""
    C, F, V = 32, 64, 12
    tokens = ["<|endoftext|>", "a", "b", "c", "ab", "\u0120", "\u0120a", "1", "2", "T", "h", "e"]
    kvs = [("general.architecture", 8, "llama"), ("llama.block_count", 4, 1), ("llama.embedding_length", 4, C),
           ("llama.feed_forward_length", 4, F), ("llama.attention.head_count", 4, 2),
           ("llama.attention.head_count_kv", 4, 1), ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
           ("llama.rope.freq_base", 6, 10000.0), ("tokenizer.ggml.model", 8, "gpt2"), ("tokenizer.ggml.pre", 8, "smollm"),
           ("tokenizer.ggml.tokens", 9, (8, tokens)), ("tokenizer.ggml.merges", 9, (8, ["a b", "\u0120 a"])),
           ("tokenizer.ggml.token_type", 9, (5, [3] + [1] * (V - 1))), ("tokenizer.ggml.eos_token_id", 4, 0),
           ("tokenizer.ggml.add_bos_token", 7, 0)]
    f16 = lambda n: struct.pack("<%de" % n, *[((i * 7) % 13 - 6) / 64 for i in range(n)])
    q8 = lambda n: b"".join(struct.pack("<e", 0.01) + bytes((i * 37 + j) % 256 for j in range(32)) for i in range(n // 32))
    q41 = lambda n: b"".join(struct.pack("<ee", 0.01, -0.05) + bytes((i * 11 + j) % 256 for j in range(16))
                             for i in range(n // 32))
    ones = struct.pack("<%df" % C, *[1.0] * C)
    ts = [("token_embd.weight", [C, V], 8, q8(C * V)), ("output_norm.weight", [C], 0, ones),
          ("blk.0.attn_norm.weight", [C], 0, ones), ("blk.0.ffn_norm.weight", [C], 0, ones),
          ("blk.0.attn_q.weight", [C, C], 1, f16(C * C)), ("blk.0.attn_k.weight", [C, 16], 1, f16(C * 16)),
          ("blk.0.attn_v.weight", [C, 16], 1, f16(C * 16)), ("blk.0.attn_output.weight", [C, C], 1, f16(C * C)),
          ("blk.0.ffn_gate.weight", [C, F], 3, q41(C * F)), ("blk.0.ffn_up.weight", [C, F], 3, q41(C * F)),
          ("blk.0.ffn_down.weight", [F, C], 3, q41(C * F))]
    put("gguf", "llama_smollm", gguf_bytes(kvs, ts))
    bad_merge = [kv if kv[0] != "tokenizer.ggml.merges" else (kv[0], 9, (8, ["a b", "c a"])) for kv in kvs]
    put("gguf", "merge_not_in_vocab", gguf_bytes(bad_merge, ts))
    put("gguf", "empty", b"")
    # 2^31 x 2^31 F32 elements at offset 0: 2^64 bytes, which wrapped to 0 and was accepted
    put("gguf", "bytes_wrap_2p62", gguf_bytes([("general.architecture", 8, "llama")],
                                              [("token_embd.weight", [1 << 31, 1 << 31], 0, b"\0" * 64)]))
    kq = [("q4_k", [256], 12, 144), ("q6_k", [256], 14, 210), ("q2_k", [256], 10, 84), ("q3_k", [256], 11, 110),
          ("q5_k", [256], 13, 176), ("q5_0", [32], 6, 22), ("bf16", [4], 30, 8)]
    put("gguf", "kquants", gguf_bytes([("general.alignment", 4, 64), ("nested", 9, (9, [(4, [1, 2]), (8, ["x"])]))],
                                      [(n, ne, ty, bytes((i * 29) % 251 for i in range(nb))) for n, ne, ty, nb in kq],
                                      alignment=64))


if __name__ == "__main__":
    chunk_shard()
    embedding_shard()
    hidden_states()
    teacher_file()
    neighbor_shard()
    target_record()
    safetensors()
    token_bin()
    text_seeds()
    gzip_seeds()
    parquet_seeds()
    tokenizer_seeds()
    regression_seeds()
    gguf()
