"""lm_forward_peer.py — the PyTorch peer of `dfm-train hidden`: a frozen decoder's final-normed hidden states.

Written as a PyTorch user runs a Hugging Face decoder for its hidden states: transformers' AutoModel (LlamaModel
for SmolLM2; SDPA attention) from the same folder, under torch.inference_mode, optionally torch.compile'd and/or
under torch.autocast("cpu", dtype=torch.bfloat16). It reads the same llm.c token shard `dfm-train hidden` read
(sequence i = tokens [i*T, i*T+T)), runs the first batch untimed (warm-up: compilation, allocator), then
times the --seqs sequences after it in CPU-seconds (time.process_time) and wall seconds, and checks all its
hidden states against dfm's file (schemas/hidden_states.md): max abs difference, min and mean cosine per token.

  python bench/trainer/lm_forward_peer.py --backbone DIR --tokens tokens.bin --keys hidden_states.bin --seqs 16 \\
      [--seq-len 256] [--batch 8] [--compile] [--autocast bf16] [--threads 1]

Prints one JSON line: tokens, cpu_s, wall_s, max_abs, cos_min, cos_mean, versions.
"""
import argparse
import json
import struct
import sys
import time

import torch
import torch.nn.functional as F


def read_tokens(path, n):
    """The first n tokens of an llm.c shard (schemas/token_shard.md: u16 for 20240520/1, else u32)."""
    with open(path, "rb") as f:
        magic, version, count = struct.unpack("<iiI", f.read(12))
        f.seek(1024)
        width = 2 if (magic, version) == (20240520, 1) else 4
        if count < n:
            sys.exit("lm_forward_peer: %s holds %d tokens, %d asked" % (path, count, n))
        buf = bytearray(f.read(n * width))
    return torch.frombuffer(buf, dtype=torch.int16 if width == 2 else torch.int32).long() & (0xFFFF if width == 2 else -1)


def read_keys(path):
    """dfm's hidden states: [n_keys, dim] float32 after the 128-byte header."""
    with open(path, "rb") as f:
        head = f.read(128)
        if head[:8] != b"DFMHIDN1":
            sys.exit("lm_forward_peer: %s is not a hidden-states file" % path)
        n, dim = struct.unpack("<QI", head[16:28])
        buf = bytearray(f.read(n * dim * 4))
    return torch.frombuffer(buf, dtype=torch.float32).view(n, dim)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", required=True, help="the Hugging Face folder dfm-train hidden read")
    ap.add_argument("--tokens", required=True, help="the llm.c token shard dfm-train hidden read")
    ap.add_argument("--keys", required=True, help="dfm-train hidden's output, to compare against")
    ap.add_argument("--seqs", type=int, required=True, help="sequences to time after the warm-up batch (a multiple of --batch)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.seqs % a.batch:
        sys.exit("lm_forward_peer: --seqs %d is not a multiple of --batch %d" % (a.seqs, a.batch))
    torch.set_num_threads(a.threads)
    import transformers
    model = transformers.AutoModel.from_pretrained(a.backbone, dtype=torch.float32, attn_implementation="sdpa").eval()
    T, B = a.seq_len, a.batch
    n = a.seqs + B
    tok = read_tokens(a.tokens, n * T).view(n, T)
    fwd = torch.compile(model, dynamic=False) if a.compile else model

    def run(x):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            return fwd(input_ids=x, use_cache=False).last_hidden_state.float()

    outs = [run(tok[:B])]  # warm-up: compilation, allocator
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(B, n, B):
        outs.append(run(tok[i:i + B]))
    c1, w1 = time.process_time(), time.perf_counter()
    h = torch.cat(outs).view(-1, outs[0].shape[-1])
    ref = read_keys(a.keys)
    if ref.shape != h.shape:
        sys.exit("lm_forward_peer: dfm wrote %s hidden states, the peer %s" % (tuple(ref.shape), tuple(h.shape)))
    cos = F.cosine_similarity(h.double(), ref.double(), dim=-1)
    print(json.dumps({"tokens": a.seqs * T, "cpu_s": c1 - c0, "wall_s": w1 - w0,
                      "max_abs": (h - ref).abs().max().item(), "ref_max_abs": ref.abs().max().item(),
                      "cos_min": cos.min().item(), "cos_mean": cos.mean().item(), "torch": torch.__version__,
                      "transformers": transformers.__version__, "compile": a.compile, "autocast": a.autocast,
                      "threads": a.threads}))


if __name__ == "__main__":
    main()
