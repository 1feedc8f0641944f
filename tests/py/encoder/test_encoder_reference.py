#!/usr/bin/env python3
"""dfm's encoder against independent references, on >= 200 real chunk texts plus hard cases.

1. Tokenisation: `dfm encode --tokens-out` ids == Hugging Face `tokenizers` ids (truncated to the
   model's max_seq_length) for every text.
2. Embeddings: `dfm encode --texts` (CPU, fp32) vs tests/ref/encoder_reference.py (NumPy, float64):
   max abs error <= 1e-4 and cosine >= 0.99999 for every text.
3. If sentence-transformers is importable, the same bounds against it (otherwise a SKIP line, counted by
   tests/run.sh).
4. The embedding file itself is parsed independently here (header fields, both checksums if xxhash
   is importable) so the format is checked from outside C.
Exit status non-zero on any failure.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import encoder_reference as R  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build/dfm"))
N_TEXTS = int(os.environ.get("DFM_ENCODER_TEST_TEXTS", "208"))


def read_emb(path):
    buf = open(path, "rb").read()
    assert buf[:8] == b"DFMEMBD1", "magic"
    version, hbytes, dim, dtype = struct.unpack_from("<4I", buf, 8)
    first, n_rows, mh, th, pbytes, pck = struct.unpack_from("<6Q", buf, 24)
    (hck,) = struct.unpack_from("<Q", buf, 120)
    assert version == 1 and hbytes == 128 and buf[72:120] == bytes(48), "header fields"
    es = {0: 4, 1: 2, 2: 2}[dtype]
    assert pbytes == n_rows * dim * es and len(buf) == 128 + pbytes, "sizes"
    try:
        import xxhash

        assert xxhash.xxh3_64_intdigest(buf[:120]) == hck, "header checksum"
        assert xxhash.xxh3_64_intdigest(buf[128:]) == pck, "payload checksum"
    except ImportError:
        print("SKIP: the embedding file's checksums (xxhash is not importable by this Python)")
    raw = np.frombuffer(buf, dtype={0: "<f4", 1: "<f2", 2: "<u2"}[dtype], offset=128)
    if dtype == 2:
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return first, raw.astype(np.float64).reshape(n_rows, dim)


def compare(name, got, ref):
    err = np.abs(got - ref).max()
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    print(f"{name}: {len(got)} texts, max abs error {err:.3g}, min cosine {cos.min():.9f}")
    return err <= 1e-4 and cos.min() >= 0.99999


def main():
    ok = True
    texts = R.chunk_texts(N_TEXTS, seed=2026) + R.HARD
    texts.append(" ".join(texts[:30]))  # over max_seq_length: truncated
    max_len = R.model_max_len(R.MODEL)
    with tempfile.TemporaryDirectory() as d:
        tp, ep, kp = (os.path.join(d, x) for x in ("texts.jsonl", "emb.bin", "tokens.jsonl"))
        with open(tp, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
        r = subprocess.run([DFM, "encode", "--texts", tp, "--out", ep, "--tokens-out", kp, "--device", "cpu",
                            "--model", R.MODEL], capture_output=True, text=True)
        print(r.stdout.strip(), r.stderr.strip()[-2000:])
        if r.returncode:
            print("FAIL: dfm encode --texts failed")
            return 1
        _, got = read_emb(ep)
        ids_c = [json.loads(l)["ids"] for l in open(kp)]

    # 1. tokenisation
    hf = R.hf_tokenizer(R.MODEL, max_len)
    ids_hf = [e.ids for e in hf.encode_batch(texts)]
    same = sum(a == b for a, b in zip(ids_c, ids_hf))
    print(f"tokenization: {same} / {len(texts)} identical to HF tokenizers (max_len {max_len})")
    for i, (a, b) in enumerate(zip(ids_c, ids_hf)):
        if a != b:
            print(f"  mismatch {i}: {texts[i][:60]!r}\n    dfm {a[:30]}\n    hf  {b[:30]}")
    ok &= same == len(texts) and len(ids_c) == len(texts)

    # 2. NumPy reference
    ref = R.bert_embed(R.MODEL, ids_hf)
    ok &= compare("numpy reference (float64)", got, ref)

    # 3. sentence-transformers, when some Python can import it (this one, $DFM_ST_PYTHON, the benchmarks'
    # peer venv of bench/peers.sh, /tmp/stvenv)
    st_py = None
    peers = os.path.join(os.environ.get("DFM_CACHE", "/var/cache/dfm"), "peers-venv", "bin", "python")
    for p in (sys.executable, os.environ.get("DFM_ST_PYTHON"), peers, "/tmp/stvenv/bin/python"):
        if p and os.path.exists(p) and subprocess.run([p, "-c", "import sentence_transformers"],
                                                      capture_output=True).returncode == 0:
            st_py = p
            break
    if st_py is None:
        print("SKIP: sentence-transformers (not importable by any Python here): compared with the NumPy reference only")
    else:
        with tempfile.TemporaryDirectory() as d:
            tp, op = os.path.join(d, "t.json"), os.path.join(d, "st.f32")
            json.dump(texts, open(tp, "w"))
            code = ("import json, sys, torch\n"
                    "from sentence_transformers import SentenceTransformer\n"
                    "m = SentenceTransformer(sys.argv[1], device='cpu')\n"
                    "e = m.encode(json.load(open(sys.argv[2])), batch_size=64, convert_to_tensor=True,"
                    " normalize_embeddings=True)\n"
                    "open(sys.argv[3], 'wb').write(e.float().contiguous().numpy().tobytes())\n"
                    "import sentence_transformers as s; print(s.__version__, torch.__version__)\n")
            r = subprocess.run([st_py, "-c", code, R.MODEL, tp, op], capture_output=True, text=True)
            if r.returncode:
                print("FAIL: sentence-transformers run failed:", r.stderr[-1000:])
                ok = False
            else:
                st = np.fromfile(op, dtype="<f4").reshape(len(texts), -1).astype(np.float64)
                ok &= compare(f"sentence-transformers {r.stdout.split()[0]} (torch {r.stdout.split()[1]}, {st_py})",
                              got, st)

    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
