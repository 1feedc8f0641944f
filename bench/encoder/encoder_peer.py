"""encoder_peer.py — the peers of dfm's CPU encoder, for bench/encoder/bench_encoder_cpu.sh. Runs only in the peer
venv (bench/peers.sh); a missing peer is an error, never replaced by another.

  export MODEL OUT.onnx          MiniLM (local weights) -> ONNX, with mean pooling and L2 normalisation in
                                 the graph, then ONNX Runtime's transformer optimizer (fused Attention,
                                 SkipLayerNormalization, Gelu); prints the fused-operator counts
  quantize IN.onnx OUT.onnx      ONNX Runtime's quantize_dynamic on the exported graph: int8 weights, activations
                                 quantised at run time (DynamicQuantizeLinear + MatMulInteger / QAttention,
                                 which ORT's MLAS runs with VNNI where the CPU has it)
  run PEER MODEL TEXTS T REPS B  PEER st | st-bf16 | ort | ort-int8 (st-bf16: sentence-transformers under
                                 torch.autocast("cpu", torch.bfloat16); ort-int8: MODEL is quantize's
                                 output); one untimed warm-up call on the first 64 texts, then REPS
                                 timed passes over all texts at batch size B and T threads; prints
                                 "PEER pass=R threads=T texts=N batch=B seconds=S cpu_seconds=C" lines
                                 and a final "version ..." line; --out F.f32 writes the last pass's vectors
  sweep PEER MODEL TEXTS T B...  one process, a warm-up, then one timed pass per batch size; prints
                                 "best_batch=B" (least CPU-seconds)
  compare A.f32 B.f32            max abs error, min and mean cosine between two N x 384 float32 files, and the
                                 recall@16 of B's nearest neighbours (inner product, self excluded) against A's

Timing is in-process, around the encode call only (model loading excluded), as bench_encoder.c times
dfm: tokenisation is inside on both sides. cpu_seconds is the process CPU time (all threads).
For ort and ort-int8, MODEL is the .onnx file written by export (or quantize) and the tokenizer.json is read
from --tokenizer-dir.
"""
import argparse
import json
import os
import sys
import time


def load_texts(path):
    return [json.loads(l)["text"] for l in open(path, encoding="utf-8") if l.strip()]


def max_seq_length(model_dir):
    p = os.path.join(model_dir, "sentence_bert_config.json")
    return json.load(open(p))["max_seq_length"] if os.path.exists(p) else 512


# ---- export ----------------------------------------------------------------------------------------
def cmd_export(a):
    import numpy as np
    import onnx
    import onnxruntime
    import torch
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.from_pretrained(a.model)
    # eager attention: the exported pattern is the one ORT's BERT fusion recognises
    bert = AutoModel.from_pretrained(a.model, attn_implementation="eager").eval()

    class Pooled(torch.nn.Module):
        """BERT + mean pooling over the mask + L2 normalisation: sentence-transformers' pipeline."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            e = (h * w).sum(1) / w.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, p=2.0, dim=1)

    model = Pooled(bert).eval()
    ids = torch.randint(1000, 2000, (2, 16), dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    tt = torch.zeros_like(ids)
    raw = a.out + ".raw.onnx"
    names = dict(input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["embedding"])
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
           "token_type_ids": {0: "batch", 1: "seq"}, "embedding": {0: "batch"}}
    exporter = "torchscript"
    with torch.no_grad():
        try:
            torch.onnx.export(model, (ids, mask, tt), raw, opset_version=17, dynamic_axes=dyn, dynamo=False,
                              **names)
        except Exception as e:  # the TorchScript exporter may be gone in this torch; use the dynamo one
            print(f"TorchScript exporter unavailable ({type(e).__name__}: {e}); using dynamo=True", file=sys.stderr)
            exporter = "dynamo"
            torch.onnx.export(model, (ids, mask, tt), raw, dynamo=True, external_data=False,
                              dynamic_shapes=({0: "batch", 1: "seq"},) * 3, **names)
        ref = model(ids, mask, tt).numpy()
    opt = optimize_model(raw, model_type="bert", num_heads=cfg.num_attention_heads, hidden_size=cfg.hidden_size,
                         opt_level=1, use_gpu=False, only_onnxruntime=False)
    stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    opt.save_model_to_file(a.out)
    os.remove(raw)
    s = onnxruntime.InferenceSession(a.out, providers=["CPUExecutionProvider"])
    got = s.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": tt.numpy()})[0]
    err = float(np.abs(got - ref).max())
    print(f"exported {os.path.basename(a.out)} ({exporter} exporter, opset {onnx.load(a.out).opset_import[0].version}), "
          f"fused operators {json.dumps(stats, sort_keys=True)}, max abs error vs torch {err:.2g}")
    if not stats.get("Attention") and not stats.get("MultiHeadAttention"):
        print("the optimizer fused no attention: this is not the fused graph the benchmark promises", file=sys.stderr)
        return 1
    return 0 if err < 1e-4 else 1


def cmd_quantize(a):
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # the fused graph's contrib operators (Attention, SkipLayerNormalization) defeat ONNX shape inference;
    # their outputs are float, which DefaultTensorType tells the quantizer
    quantize_dynamic(a.inp, a.out, weight_type=QuantType.QInt8, per_channel=a.per_channel,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    ops = {}
    for n in onnx.load(a.out).graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    q = {k: v for k, v in sorted(ops.items()) if "Integer" in k or k.startswith("Q") or "Quantize" in k}
    print(f"quantize_dynamic (weights QInt8, per_channel={a.per_channel}) -> {os.path.basename(a.out)}, "
          f"quantised operators {json.dumps(q, sort_keys=True)}")
    return 0 if q else 1


# ---- peers ------------------------------------------------------------------------------------------
class STPeer:
    def __init__(self, model_dir, threads, bf16=False):
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        import sentence_transformers
        import transformers
        from sentence_transformers import SentenceTransformer

        self.torch = torch
        self.bf16 = bf16
        self.m = SentenceTransformer(model_dir, device="cpu")
        self.version = (f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}, "
                        f"transformers {transformers.__version__}, max_seq_length {self.m.max_seq_length}"
                        f"{', torch.autocast cpu bfloat16' if bf16 else ''}")

    def encode(self, texts, batch):
        with self.torch.inference_mode(), self.torch.autocast("cpu", dtype=self.torch.bfloat16, enabled=self.bf16):
            e = self.m.encode(texts, batch_size=batch, normalize_embeddings=True, convert_to_tensor=True)
        return e.float().numpy()


class ORTPeer:
    def __init__(self, onnx_path, tokenizer_dir, threads, int8=False):
        import numpy as np
        import onnxruntime as ort
        import tokenizers
        from tokenizers import Tokenizer

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        # no spinning: by default ORT's idle pool threads spin for work, which costs CPU-seconds that are
        # not encoding (at 2 threads on a loaded machine, more than they saved), and would count against it
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.np = np
        self.s = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        self.tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=max_seq_length(tokenizer_dir))
        self.version = (f"onnxruntime {ort.__version__} (CPUExecutionProvider, fused graph"
                        f"{', quantize_dynamic int8' if int8 else ''}, ORT_ENABLE_ALL, thread pool spinning off), "
                        f"tokenizers {tokenizers.__version__}")

    def encode(self, texts, batch):
        """Tokenise all, sort by length, run length-sorted batches padded to their longest text."""
        np = self.np
        enc = self.tok.encode_batch(texts)
        order = sorted(range(len(enc)), key=lambda i: len(enc[i].ids))
        out = None
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            L = max(len(enc[i].ids) for i in idx)
            ids = np.zeros((len(idx), L), dtype=np.int64)
            mask = np.zeros((len(idx), L), dtype=np.int64)
            for r, i in enumerate(idx):
                n = len(enc[i].ids)
                ids[r, :n] = enc[i].ids
                mask[r, :n] = 1
            e = self.s.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
            if out is None:
                out = np.empty((len(texts), e.shape[1]), dtype=np.float32)
            out[idx] = e
        return out


def make_peer(a):
    if a.peer in ("st", "st-bf16"):
        return STPeer(a.model, a.threads, bf16=a.peer == "st-bf16")
    if a.peer in ("ort", "ort-int8"):
        return ORTPeer(a.model, a.tokenizer_dir, a.threads, int8=a.peer == "ort-int8")
    raise SystemExit(f"unknown peer {a.peer} (st | st-bf16 | ort | ort-int8)")


def timed(peer, texts, batch):
    t0, c0 = time.perf_counter(), time.process_time()
    e = peer.encode(texts, batch)
    return e, time.perf_counter() - t0, time.process_time() - c0


def cmd_run(a):
    texts = load_texts(a.texts)
    peer = make_peer(a)
    peer.encode(texts[:64], a.batch)
    e = None
    for r in range(a.reps):
        e, dt, dc = timed(peer, texts, a.batch)
        print(f"{a.peer} pass={r} threads={a.threads} texts={len(texts)} batch={a.batch} seconds={dt:.4f} "
              f"cpu_seconds={dc:.4f}", flush=True)
    if a.out:
        e.astype("<f4").tofile(a.out)
    print("version " + peer.version)
    return 0


def cmd_sweep(a):
    texts = load_texts(a.texts)
    peer = make_peer(a)
    peer.encode(texts[:64], a.batches[0])
    best = None
    for b in a.batches:
        _, dt, dc = timed(peer, texts, b)
        print(f"{a.peer} sweep threads={a.threads} texts={len(texts)} batch={b} seconds={dt:.4f} cpu_seconds={dc:.4f}",
              flush=True)
        if best is None or dc < best[1]:
            best = (b, dc)
    print(f"best_batch={best[0]}")
    return 0


def cmd_compare(a):
    import numpy as np

    x = np.fromfile(a.a, dtype="<f4").astype(np.float64)
    y = np.fromfile(a.b, dtype="<f4").astype(np.float64)
    if x.size != y.size or x.size % a.dim:
        print(f"compare: sizes differ or are not rows of {a.dim}: {x.size} vs {y.size} floats", file=sys.stderr)
        return 1
    x, y = x.reshape(-1, a.dim), y.reshape(-1, a.dim)
    cos = (x * y).sum(1) / np.maximum(np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1), 1e-30)
    k = min(a.k, len(x) - 1)

    def knn(e):
        s = e @ e.T
        np.fill_diagonal(s, -np.inf)
        return np.argsort(-s, axis=1, kind="stable")[:, :k]

    recall = float(np.mean([len(set(p) & set(q)) / k for p, q in zip(knn(x), knn(y))])) if k > 0 else float("nan")
    print(f"rows={len(x)} max_abs_err={np.abs(x - y).max():.3g} min_cos={cos.min():.9f} mean_cos={cos.mean():.9f} "
          f"recall{a.k}={recall:.5f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("model")
    e.add_argument("out")
    for name in ("run", "sweep"):
        p = sub.add_parser(name)
        p.add_argument("peer", choices=["st", "st-bf16", "ort", "ort-int8"])
        p.add_argument("model")
        p.add_argument("texts")
        p.add_argument("threads", type=int)
        if name == "run":
            p.add_argument("reps", type=int)
            p.add_argument("batch", type=int)
            p.add_argument("--out")
        else:
            p.add_argument("batches", type=int, nargs="+")
        p.add_argument("--tokenizer-dir", help="ort: the model folder holding tokenizer.json")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--dim", type=int, default=384)
    c.add_argument("--k", type=int, default=16)
    q = sub.add_parser("quantize")
    q.add_argument("inp")
    q.add_argument("out")
    q.add_argument("--per-channel", action="store_true")
    a = ap.parse_args()
    return {"export": cmd_export, "run": cmd_run, "sweep": cmd_sweep, "compare": cmd_compare,
            "quantize": cmd_quantize}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
