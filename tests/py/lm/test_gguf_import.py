"""dfm-train import-gguf against llama.cpp's own GGUF reader (the `gguf` package) and `tokenizers`.

1. Dequantization, every type dfm converts: a small Llama GGUF written with gguf.GGUFWriter whose tensors use
   F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K with random blocks (random
   fp16 scales, subnormal and negative ones among them). model.safetensors must equal gguf.quants.dequantize
   bit for bit, q/k rows un-permuted independently here; config.json must say what the metadata says.
2. Tokenizers: GGUF tokenizer metadata made from real tokenizer.json files as llama.cpp's converter makes it
   (Llama-3.2 as "llama-bpe", Qwen2.5 as "qwen2", a GPT-2 layout as "gpt-2", SmolLM2-style "smollm"); the
   tokenizer.json import-gguf builds must give the golden ids of the original (made by `tokenizers`), through
   `tokenizers` and through `dfm tokenize`.
3. Refusals: damaged, hostile and unsupported files (huge or u64 counts, a wrapping tensor size, a FIFO, a
   file cut short during the import) each exit non-zero within 10 s naming the problem, and leave no output
   folder; --force over a file or a folder of folders tells the truth in its exit status.
4. The real SmolLM2-135M of the cache (make lm): every tensor equals the gguf package's dequantization, and
   dfm-train's forward (hidden states through the tied head) equals a float64 NumPy forward of the GGUF
   (tests/ref/llama_numpy.py) within 1e-3 on real text.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import DFM_TRAIN, ROOT, check, finish  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
CACHE = os.environ.get("DFM_CACHE", "/var/cache/dfm")
GOLDEN = os.path.join(ROOT, "tests", "data", "tokenizer")
RNG = np.random.default_rng(20261202)

# byte offsets of the fp16 scale fields inside one block of each type (ggml-common.h layouts)
SCALES = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0], Q.Q2_K: [80, 82],
          Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def st_read(path):
    """name -> float32 array of a safetensors file (parsed here, not with dfm's reader)."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    hdr = json.loads(buf[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    out = {}
    for k, t in hdr.items():
        assert t["dtype"] == "F32", (k, t["dtype"])
        b, e = t["data_offsets"]
        out[k] = np.frombuffer(buf[8 + n + b:8 + n + e], np.float32).reshape(t["shape"])
    return out, meta


def random_blocks(qtype, rows, cols):
    """Random quantized bytes for a [rows, cols] tensor of qtype, with finite random fp16 scales."""
    if qtype == Q.F32:
        return RNG.standard_normal((rows, cols)).astype(np.float32), None
    if qtype == Q.F16:
        return (RNG.standard_normal((rows, cols)) * 0.1).astype(np.float16), None
    if qtype == Q.BF16:
        x = (RNG.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, cols * 2), qtype
    be, bb = gguf.constants.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // be
    raw = RNG.integers(0, 256, (nb, bb), dtype=np.uint8)
    for off in SCALES[qtype]:
        s = RNG.standard_normal(nb) * 0.01
        s[::17] = 3e-6 * np.sign(s[::17])  # subnormal fp16 scales
        raw[:, off:off + 2] = s.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, cols // be * bb), qtype


def unpermute(w, heads):
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_gguf(path, arch_kv, tensors, tok=None, extra=None):
    """tensors: list of (name, array, raw_dtype). tok: (model, pre, tokens, merges, types)."""
    w = gguf.GGUFWriter(path, "llama")
    for k, (kind, v) in arch_kv.items():
        getattr(w, "add_" + kind)(k, v)
    if tok:
        model, pre, tokens, merges, types = tok
        w.add_tokenizer_model(model)
        if pre is not None:
            w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types(types)
    for k, v in (extra or {}).items():
        w.add_key_value(k, v[1], v[0])
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hparams(C, ffn, nl, nh, nkv, ctx=2048):
    return {"llama.block_count": ("uint32", nl), "llama.embedding_length": ("uint32", C),
            "llama.feed_forward_length": ("uint32", ffn), "llama.attention.head_count": ("uint32", nh),
            "llama.attention.head_count_kv": ("uint32", nkv), "llama.context_length": ("uint32", ctx),
            "llama.rope.freq_base": ("float32", 50000.0), "llama.attention.layer_norm_rms_epsilon": ("float32", 1e-5),
            "llama.rope.dimension_count": ("uint32", C // nh)}


def byte_tokens():
    """A byte-level vocabulary: the 256 byte symbols, a few merges, one control token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    with open(os.path.join(CACHE, "corpus", "gcide-1mb.jsonl")) as f:
        docs = [json.loads(l)["text"] for _, l in zip(range(400), f)]
    t.train_from_iterator(docs, tr)
    j = json.loads(t.to_str())
    vocab = j["model"]["vocab"]
    tokens = [None] * len(vocab)
    for k, i in vocab.items():
        tokens[i] = k
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    types = [3 if s == "<|endoftext|>" else 1 for s in tokens]
    return t, tokens, merges, types


def import_gguf(path, out, *extra, ok=True, timeout=300):
    try:
        p = subprocess.run([DFM_TRAIN, "import-gguf", path, "--out", out, *extra], capture_output=True, text=True,
                           errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        p = subprocess.CompletedProcess([path], 124, "", f"(killed: still running after {timeout} s)")
    if ok and p.returncode:
        print(p.stdout, p.stderr)
        raise SystemExit(f"import-gguf {path} failed")
    return p


def dfm_ids(tokenizer, text):
    p = subprocess.run([DFM, "tokenize", "--tokenizer", tokenizer, "-"], input=text.encode(), capture_output=True)
    if p.returncode:
        raise SystemExit(f"dfm tokenize failed: {p.stderr.decode()[-500:]}")
    return [int(x) for x in p.stdout.split()]


# ---- 1. every type dfm dequantizes ----------------------------------------------------------------------
def test_types(w):
    C, ffn, nl, nh, nkv = 256, 512, 2, 4, 2
    hd = C // nh
    tok, tokens, merges, types = byte_tokens()
    V = len(tokens)
    plan = {  # (GGUF name, HF name, rows, cols, type)
        0: [("attn_q", Q.Q4_0), ("attn_k", Q.Q4_1), ("attn_v", Q.Q5_0), ("attn_output", Q.Q5_1),
            ("ffn_gate", Q.Q8_0), ("ffn_up", Q.Q2_K), ("ffn_down", Q.Q3_K)],
        1: [("attn_q", Q.Q4_K), ("attn_k", Q.Q5_K), ("attn_v", Q.Q6_K), ("attn_output", Q.F16),
            ("ffn_gate", Q.BF16), ("ffn_up", Q.F32), ("ffn_down", Q.Q6_K)],
    }
    shape = {"attn_q": (nh * hd, C), "attn_k": (nkv * hd, C), "attn_v": (nkv * hd, C), "attn_output": (C, nh * hd),
             "ffn_gate": (ffn, C), "ffn_up": (ffn, C), "ffn_down": (C, ffn)}
    tensors = [("token_embd.weight",) + random_blocks(Q.Q8_0, V, C), ("output.weight",) + random_blocks(Q.Q4_K, V, C),
               ("output_norm.weight", (1 + 0.1 * RNG.standard_normal(C)).astype(np.float32), None)]
    for l in range(nl):
        for nm, qt in plan[l]:
            tensors.append((f"blk.{l}.{nm}.weight",) + random_blocks(qt, *shape[nm]))
        for nm in ("attn_norm", "ffn_norm"):
            tensors.append((f"blk.{l}.{nm}.weight", (1 + 0.1 * RNG.standard_normal(C)).astype(np.float32), None))
    path = os.path.join(w, "types.gguf")
    write_gguf(path, hparams(C, ffn, nl, nh, nkv), tensors, ("gpt2", "gpt-2", tokens, merges, types))
    out = os.path.join(w, "types-hf")
    import_gguf(path, out)
    got, meta = st_read(os.path.join(out, "model.safetensors"))
    r = gguf.GGUFReader(path)
    hfname = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm",
              "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    seen = set()
    for t in r.tensors:
        parts = t.name.split(".")
        hf = (f"model.layers.{parts[1]}.{hfname[parts[2]]}.weight" if parts[0] == "blk"
              else hfname[parts[0]] + ".weight")
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(v) for v in reversed(t.shape)])
        if parts[-2] == "attn_q":
            ref = unpermute(ref, nh)
        elif parts[-2] == "attn_k":
            ref = unpermute(ref, nkv)
        same = hf in got and got[hf].shape == ref.shape and np.array_equal(
            got[hf].view(np.uint32), ref.astype(np.float32).view(np.uint32))
        if not same:
            check(False, f"{t.name} ({t.tensor_type.name}) -> {hf} equals gguf.quants.dequantize bit for bit")
        seen.add(t.tensor_type.name)
    want = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
    check(want <= seen, f"the file holds every dequantizable type ({sorted(seen)})")
    check(len(got) == len(r.tensors), f"{len(got)} tensors written for {len(r.tensors)} in the file")
    cfg = json.load(open(os.path.join(out, "config.json")))
    want_cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": V, "hidden_size": C, "intermediate_size": ffn,
                "num_hidden_layers": nl, "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
                "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 2048,
                "tie_word_embeddings": False}
    wrong = [f"{k}={cfg.get(k)} (want {v})" for k, v in want_cfg.items() if cfg.get(k) != v]
    check(not wrong, f"config.json says what the metadata says ({', '.join(wrong)})")
    check(meta.get("dfm_source") == "types.gguf" and len(meta.get("dfm_source_xxh3_128", "")) == 32,
          "model.safetensors records its source file and hash")
    # the built tokenizer is the one the vocabulary came from
    texts = [json.loads(l).get("text", "") for l in open(os.path.join(GOLDEN, "qwen2.5.golden.jsonl"))][1:60]
    texts = [t for t in texts if t]
    tj = os.path.join(out, "tokenizer.json")
    from tokenizers import Tokenizer
    built = Tokenizer.from_file(tj)
    bad = [t for t in texts if built.encode(t).ids != tok.encode(t).ids or dfm_ids(tj, t) != tok.encode(t).ids]
    check(not bad, f"gpt-2 layout: the built tokenizer.json gives the trained tokenizer's ids on {len(texts)} texts "
                   f"through tokenizers and dfm ({len(bad)} differ)")
    # a second import over it is refused without --force, and replaces it with --force
    p = import_gguf(path, out, ok=False)
    check(p.returncode != 0 and "--force" in p.stderr, "an existing --out is refused, naming --force")
    p = import_gguf(path, out, "--force", ok=False)
    check(p.returncode == 0 and not os.path.exists(out + ".old") and not os.path.exists(out + ".partial"),
          "--force replaces the folder and leaves no .old or .partial")
    return path, tensors, tokens, merges, types


# ---- 2. tokenizers of real LMs through GGUF metadata ----------------------------------------------------
def tokenizer_as_gguf(w, name, tj_path, pre, patch=None):
    """A 1-layer F16 model carrying the tokenizer of tj_path as llama.cpp writes it; the built tokenizer.json."""
    j = json.load(open(tj_path))
    vocab = dict(j["model"]["vocab"])
    special = set()
    for a in j.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
        if a.get("special"):
            special.add(a["id"])
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    for k, i in vocab.items():
        tokens[i] = k
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    types = [3 if i in special else 1 for i in range(n)]
    C, ffn, nh = 32, 64, 2
    tensors = [("token_embd.weight", (0.02 * RNG.standard_normal((n, C))).astype(np.float16), None),
               ("output_norm.weight", np.ones(C, np.float32), None)]
    for nm, r, c in (("attn_q", C, C), ("attn_k", C, C), ("attn_v", C, C), ("attn_output", C, C),
                     ("ffn_gate", ffn, C), ("ffn_up", ffn, C), ("ffn_down", C, ffn)):
        tensors.append((f"blk.0.{nm}.weight", (0.02 * RNG.standard_normal((r, c))).astype(np.float16), None))
    for nm in ("attn_norm", "ffn_norm"):
        tensors.append((f"blk.0.{nm}.weight", np.ones(C, np.float32), None))
    path = os.path.join(w, name + ".gguf")
    write_gguf(path, hparams(C, ffn, 1, nh, nh), tensors, ("gpt2", pre, tokens, merges, types))
    out = os.path.join(w, name + "-hf")
    import_gguf(path, out)
    return os.path.join(out, "tokenizer.json")


def golden_cases(name, limit):
    with open(os.path.join(GOLDEN, name + ".golden.jsonl")) as f:
        lines = [json.loads(l) for l in f][1:]
    return [c for c in lines if "text" in c][:limit]


def test_real_tokenizers(w):
    from tokenizers import Tokenizer
    for name, src, pre, golden in (("llama-3.2", "tokenizers/llama-3.2/tokenizer.json", "llama-bpe",
                                    "llama-3.2-ignore-merges"),
                                   ("qwen2.5", "tokenizers/qwen2.5/tokenizer.json", "qwen2", "qwen2.5")):
        tj = tokenizer_as_gguf(w, name, os.path.join(CACHE, src), pre)
        cases = golden_cases(golden, 120)
        hf = Tokenizer.from_file(tj)
        bad_hf = [c["name"] for c in cases if hf.encode(c["text"], add_special_tokens=False).ids != c["ids"]]
        bad_dfm = [c["name"] for c in cases if dfm_ids(tj, c["text"]) != c["ids"]]
        check(not bad_hf, f"{name} as GGUF (pre {pre}): built tokenizer.json gives the golden ids of {golden} through "
                          f"tokenizers on {len(cases)} cases ({bad_hf[:3]})")
        check(not bad_dfm, f"{name} as GGUF (pre {pre}): dfm tokenize gives the golden ids ({bad_dfm[:3]})")


# ---- 3. refusals ----------------------------------------------------------------------------------------
def test_refusals(w, good, tensors, tokens, merges, types):
    data = open(good, "rb").read()
    cases = []

    def bad(name, blob, expect):
        p = os.path.join(w, "bad-" + name + ".gguf")
        open(p, "wb").write(blob)
        cases.append((name, p, expect))

    bad("truncated-header", data[:20], "truncated")
    bad("truncated-data", data[:len(data) - 1000], "runs past the end")
    bad("magic", b"GGUX" + data[4:], "not a GGUF file")
    bad("version1", data[:4] + struct.pack("<I", 1) + data[8:], "version 1")
    bad("version0", data[:4] + struct.pack("<I", 0) + data[8:], "version 0")
    bad("bigendian", data[:4] + struct.pack(">I", 3) + data[8:], "big-endian")
    bad("huge-kv-count", data[:16] + struct.pack("<Q", 1 << 60) + data[24:], "more than its")
    bad("huge-tensor-count", data[:8] + struct.pack("<Q", 1 << 60) + data[16:], "more than its")
    # a string length far past the end of the file: the first key's length
    bad("huge-key-len", data[:24] + struct.pack("<Q", 1 << 62) + data[32:], "truncated")
    # the first key renamed to the second's: a duplicate key
    r = gguf.GGUFReader(good)
    keys = list(r.fields.values())
    k0, k1 = keys[0], keys[1]
    if len(k0.name) == len(k1.name):
        bad("dup-key", data.replace(k0.name.encode(), k1.name.encode(), 1), "appears twice")
    # a tensor offset moved past the data
    t0 = r.tensors[0]
    name = t0.name.encode()
    at = data.index(name) + len(name)
    nd = struct.unpack("<I", data[at:at + 4])[0]
    off_at = at + 4 + 8 * nd + 4
    bad("offset-past-end", data[:off_at] + struct.pack("<Q", 1 << 40) + data[off_at + 8:], "runs past the end")
    # the second tensor moved onto the first: overlap
    t1 = r.tensors[1]
    n1 = t1.name.encode()
    at1 = data.index(n1) + len(n1)
    nd1 = struct.unpack("<I", data[at1:at1 + 4])[0]
    off1 = at1 + 4 + 8 * nd1 + 4
    bad("overlap", data[:off1] + data[off_at:off_at + 8] + data[off1 + 8:], "overlap")
    # an IQ type: known layout, not dequantizable (same byte size as Q4_0: IQ4_NL)
    q40 = [t for t in r.tensors if t.tensor_type == Q.Q4_0][0]
    n2 = q40.name.encode()
    at2 = data.index(n2) + len(n2)
    nd2 = struct.unpack("<I", data[at2:at2 + 4])[0]
    ty = at2 + 4 + 8 * nd2
    bad("iq4_nl", data[:ty] + struct.pack("<I", int(Q.IQ4_NL)) + data[ty + 4:], "cannot dequantize")
    bad("unknown-type", data[:ty] + struct.pack("<I", 63) + data[ty + 4:], "block layout dfm does not know")
    # the F32 blk.1.ffn_up claims 2^31 x 2^31 elements: 2^64 bytes, which wrapped to 0 and was accepted
    nu = b"blk.1.ffn_up.weight"
    atu = data.index(nu) + len(nu)
    bad("bytes-wrap", data[:atu + 4] + struct.pack("<QQ", 1 << 31, 1 << 31) + data[atu + 20:],
        "need more bytes than the whole file")
    # a NaN scale in the Q8_0 embedding's first block
    emb = [t for t in r.tensors if t.name == "token_embd.weight"][0]
    pos = r.data_offset + emb.data_offset
    bad("nan-scale", data[:pos] + np.array([np.nan], np.float16).tobytes() + data[pos + 2:], "non-finite")
    # files written whole with gguf.GGUFWriter
    C, ffn, nh, nkv = 256, 512, 4, 2
    base = [t for t in tensors]

    def written(name, kv=None, drop=(), add=(), arch_patch=None, tok=(tokens, merges, types), model="gpt2",
                pre="gpt-2", expect=""):
        p = os.path.join(w, "bad-" + name + ".gguf")
        hp = hparams(C, ffn, 2, nh, nkv)
        hp.update(arch_patch or {})
        ts = [t for t in base if t[0] not in drop] + list(add)
        write_gguf(p, hp, ts, (model, pre, *tok), kv)
        cases.append((name, p, expect))

    written("missing-tensor", drop=("blk.1.ffn_up.weight",), expect="blk.1.ffn_up.weight (model.layers.1.mlp.up_proj.weight) is missing")
    written("extra-bias", add=[("blk.0.attn_q.bias", np.zeros(C, np.float32), None)], expect="blk.0.attn_q.bias")
    written("rope-freqs", add=[("rope_freqs.weight", np.ones(32, np.float32), None)], expect="rope_freqs")
    written("shape", arch_patch={"llama.feed_forward_length": ("uint32", 768)}, expect="the metadata implies")
    written("rope-scaling", kv={"llama.rope.scaling.type": (gguf.GGUFValueType.STRING, "linear")},
            expect="rope scaling")
    written("experts", kv={"llama.expert_count": (gguf.GGUFValueType.UINT32, 8)}, expect="mixture of experts")
    written("spm-tokenizer", model="llama", expect="byte-level BPE")
    written("unknown-pre", pre="deepseek-coder", expect="\"deepseek-coder\" is not a pre-tokenizer dfm knows")
    bad_merges = list(merges)
    bad_merges[3] = "nospace"
    written("bad-merge", tok=(tokens, bad_merges, types), expect="merges[3]")
    # u64 and huge counts: named with their value before anything is sized by them (2^31 - 1 layers once
    # formatted tensor names for hours; 2^32 - 1 was read as -1 layers; an FFN of 2^31 as -2147483648)
    written("layers-u32max", arch_patch={"llama.block_count": ("uint64", 2**32 - 1)},
            expect="llama.block_count is 4294967295, outside 1..4096")
    written("layers-2p31", arch_patch={"llama.block_count": ("uint32", 2**31 - 1)},
            expect="llama.block_count is 2147483647, outside 1..4096")
    written("layers-vs-tensors", arch_patch={"llama.block_count": ("uint32", 4000)},
            expect="fewer than the 9 of each layer")
    written("ffn-2p31", arch_patch={"llama.feed_forward_length": ("uint64", 2**31)},
            expect="llama.feed_forward_length is 2147483648")

    def patched(name, case, old, new, expect):  # the file of an earlier case with some bytes replaced
        src = [c for c in cases if c[0] == case][0][1]
        p = os.path.join(w, "bad-" + name + ".gguf")
        blob = open(src, "rb").read()
        assert blob.count(old) == 1, (name, old)
        open(p, "wb").write(blob.replace(old, new))
        cases.append((name, p, expect))

    utf8_merges = list(merges)
    utf8_merges[3] = "QZQZ QZQZ"
    written("merge-utf8-src", tok=(tokens, utf8_merges, types), expect="merges[3]")
    patched("merge-utf8", "merge-utf8-src", b"QZQZ QZQZ", b"\xff\xfeZQ QZQZ", "merges[3] is not valid UTF-8")
    for name, p, expect in cases:
        out = os.path.join(w, "out-" + name)
        r = import_gguf(p, out, ok=False, timeout=10)
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        check(r.returncode != 0 and expect in r.stderr and not os.path.exists(out)
              and not os.path.exists(out + ".partial"),
              f"refused: {name} (exit {r.returncode}, no folder left): {msg[:220]}")
    # an unsupported architecture
    p = os.path.join(w, "bad-arch.gguf")
    wr = gguf.GGUFWriter(p, "gpt2")
    wr.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()
    r = import_gguf(p, os.path.join(w, "out-arch"), ok=False)
    check(r.returncode != 0 and "architecture \"gpt2\" is not supported" in r.stderr, "refused: architecture gpt2")
    r = import_gguf(os.path.join(w, "no-such.gguf"), os.path.join(w, "out-none"), ok=False)
    check(r.returncode != 0 and "no-such.gguf" in r.stderr, "refused: a missing file, named")
    # a FIFO as the model: refused at once, not read (blocked) forever
    fifo = os.path.join(w, "fifo.gguf")
    os.mkfifo(fifo)
    r = import_gguf(fifo, os.path.join(w, "out-fifo"), ok=False, timeout=10)
    check(r.returncode not in (0, 124) and "fifo.gguf is not a regular file (a FIFO)" in r.stderr,
          f"refused: a FIFO, at once ({r.stderr.strip()[-160:]})")
    # a chat_template that is not valid UTF-8: imported, and said (it was dropped silently)
    p = os.path.join(w, "chat-src.gguf")
    hp = hparams(C, ffn, 2, nh, nkv)
    write_gguf(p, hp, base, ("gpt2", "gpt-2", tokens, merges, types),
               {"tokenizer.chat_template": (gguf.GGUFValueType.STRING, "{{ QZQZ }}")})
    blob = open(p, "rb").read().replace(b"QZQZ", b"\xffQZQ")
    open(p, "wb").write(blob)
    out = os.path.join(w, "out-chat")
    r = import_gguf(p, out, ok=False, timeout=60)
    tc = json.load(open(os.path.join(out, "tokenizer_config.json"))) if r.returncode == 0 else {}
    check(r.returncode == 0 and "chat_template is not valid UTF-8 (byte 3 of 10)" in r.stderr
          and "chat_template" not in tc, f"a non-UTF-8 chat_template is left out with a warning ({r.stderr[-200:]})")


def test_force(w, good):
    """--force over what is there: a file is replaced (exit 0); a folder holding a folder, which import-gguf
    never wrote, is refused before anything is read (both once exited 1 after installing the new model)."""
    out = os.path.join(w, "force-file")
    open(out, "w").write("not a model\n")
    r = import_gguf(good, out, "--force", ok=False, timeout=120)
    check(r.returncode == 0 and os.path.isfile(os.path.join(out, "config.json")) and not os.path.exists(out + ".old"),
          f"--force over a file replaces it and exits 0 (exit {r.returncode}: {r.stderr.strip()[-160:]})")
    out = os.path.join(w, "force-tree")
    os.makedirs(os.path.join(out, "sub"))
    r = import_gguf(good, out, "--force", ok=False, timeout=120)
    check(r.returncode != 0 and "force-tree holds the folder sub" in r.stderr
          and os.path.isdir(os.path.join(out, "sub")) and not os.path.exists(out + ".partial")
          and not os.path.exists(out + ".old"),
          f"--force over a folder holding a folder is refused up front, leaving it as it was ({r.stderr[-160:]})")


def test_shrinks(w, good):
    """A GGUF truncated by another process during the import: a clear error and no output (the file was
    mapped, and the dequantizer died of SIGBUS). The import stops (DFM_FAULT_SIGNAL=STOP) once it has taken
    the file's size; the file is cut to half; then it goes on."""
    src = os.path.join(w, "shrinks.gguf")
    open(src, "wb").write(open(good, "rb").read())
    out = os.path.join(w, "out-shrinks")
    env = dict(os.environ, DFM_FAULT="gguf:sized", DFM_FAULT_SIGNAL="STOP")
    p = subprocess.Popen([DFM_TRAIN, "import-gguf", src, "--out", out], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace")
    stopped = False
    for _ in range(200):
        try:
            stopped = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
        except OSError:
            break
        if stopped or p.poll() is not None:
            break
        time.sleep(0.05)
    os.truncate(src, os.path.getsize(src) // 2)
    try:
        os.kill(p.pid, signal.SIGCONT)
    except ProcessLookupError:  # it never stopped there, and has ended
        pass
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    check(stopped and p.returncode == 1 and "shrinks.gguf shrank while it was read" in err
          and not os.path.exists(out) and not os.path.exists(out + ".partial"),
          f"a GGUF cut to half during the import: exit {p.returncode}, a clear error, no output "
          f"(stopped at gguf:sized: {stopped}; {err.strip()[-200:]})")


# ---- 4. the real SmolLM2-135M ---------------------------------------------------------------------------
def test_smollm2():
    lm = os.environ.get("DFM_LM", os.path.join(CACHE, "models", "smollm2-135m"))
    src = os.environ.get("DFM_LM_GGUF", os.path.join(CACHE, "models", "smollm2-135m-gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not os.path.isfile(os.path.join(lm, "config.json")):
        check(False, f"the converted SmolLM2 folder {lm} exists (make lm)")
        return
    got, meta = st_read(os.path.join(lm, "model.safetensors"))
    sys.path.insert(0, ROOT)
    from tests.ref.llama_numpy import GGUFLlama, mean_ce
    ref = GGUFLlama(src)
    hf = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    diff = []
    for name, x in ref.w.items():
        p = name.split(".")
        k = f"model.layers.{p[1]}.{hf[p[2]]}.weight" if p[0] == "blk" else hf[p[0]] + ".weight"
        if k not in got or not np.array_equal(got[k], x.astype(np.float32)):
            diff.append(name)
    check(not diff and len(got) == len(ref.w) == 272,
          f"SmolLM2: all {len(ref.w)} tensors equal the gguf package's dequantization, q/k un-permuted ({diff[:3]})")
    cfg = json.load(open(os.path.join(lm, "config.json")))
    check((cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
           cfg["vocab_size"], cfg["tie_word_embeddings"], cfg["rope_theta"]) == (30, 576, 9, 3, 49152, True, 100000.0),
          "SmolLM2 config.json: 30 layers, 576 wide, 9/3 heads, vocabulary 49152, tied, theta 1e5")
    # the forward: dfm-train hidden over real text, through the tied head, against the float64 reference
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(lm, "tokenizer.json"))
    text = open("/usr/share/common-licenses/GPL-3").read()[:1500]
    T, S = 64, 3
    ids = tk.encode(text, add_special_tokens=False).ids[:S * T + 1]
    with tempfile.TemporaryDirectory() as w:
        hdr = np.zeros(256, np.int32)
        hdr[:3] = (20240801, 7, len(ids))
        with open(os.path.join(w, "t.bin"), "wb") as f:
            f.write(hdr.tobytes() + np.array(ids, np.uint32).tobytes())
        p = subprocess.run([DFM_TRAIN, "hidden", "--backbone", lm, "--data", os.path.join(w, "t.bin"), "--out",
                            os.path.join(w, "h.bin"), "--seq-len", str(T), "--batch", "1", "--threads", "2"],
                           capture_output=True, text=True)
        if p.returncode:
            print(p.stderr)
            check(False, "dfm-train hidden runs on SmolLM2")
            return
        b = open(os.path.join(w, "h.bin"), "rb").read()
        nk, dim = struct.unpack("<Q", b[16:24])[0], struct.unpack("<I", b[24:28])[0]
        H = np.frombuffer(b[128:128 + nk * dim * 4], np.float32).reshape(nk, dim).astype(np.float64)
    if nk != S * T:
        check(False, f"dfm-train hidden wrote {nk} keys for {S} sequences of {T}")
        return
    err, ce_ref, ce_dfm = 0.0, 0.0, 0.0
    for s in range(S):  # each sequence is its own forward pass
        seq = ids[s * T:(s + 1) * T]
        ref_l = ref.logits(seq)
        dfm_l = H[s * T:(s + 1) * T] @ ref.head.T
        err = max(err, float(np.abs(dfm_l - ref_l).max()))
        ce_ref += mean_ce(ref_l, seq) / S
        ce_dfm += mean_ce(dfm_l, seq) / S
    check(err < 1e-3, f"SmolLM2 logits: dfm-train's forward vs float64 NumPy of the GGUF, max |diff| {err:.2e} over "
                      f"{S} x {T} tokens x 49152 (< 1e-3)")
    check(abs(ce_ref - ce_dfm) < 1e-4 and ce_ref < 4.5, f"SmolLM2 mean CE on GPL-3 text: NumPy {ce_ref:.5f}, dfm "
                                                        f"{ce_dfm:.5f} (a real LM: far below the tiny backbone's 4.74)")


def main():
    with tempfile.TemporaryDirectory() as w:
        good, tensors, tokens, merges, types = test_types(w)
        test_real_tokenizers(w)
        test_refusals(w, good, tensors, tokens, merges, types)
        test_force(w, good)
        test_shrinks(w, good)
    test_smollm2()
    finish("import-gguf")


if __name__ == "__main__":
    main()
