"""train_torch.py — train DFM modules on a frozen backbone in PyTorch, from a run's target shards, with the
dfm package (batches, modules) and torch.optim.AdamW. A trainer's starting point: it does what
`dfm-train train` does (same batches, loss, teacher forcing, schedule, clipping), so its loss curve tracks
dfm-train's (tests/py/pkg/test_pkg_train_example.py measures it).

    # initial modules, shaped and initialised by dfm-train (--lr 0: one step that changes nothing)
    dfm-train train --backbone LM --data RUN --targets RUN --steps 1 --lr 0 --no-ckpt --out init [shape flags]
    python examples/train_torch.py --backbone LM --data RUN --targets RUN --init init/dfm_modules.safetensors \\
        --out out --steps 200 --batch 8 --seq-len 256
    dfm-train eval --backbone LM --modules out/dfm_modules.safetensors --data RUN --targets RUN ...

Writes OUT/log.jsonl (one {"step", "loss", "ce", "mse", "lr"} per step) and OUT/dfm_modules.safetensors.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import torch  # noqa: E402

import dfm  # noqa: E402
import dfm.torch as dt  # noqa: E402


def mix64(x):  # splitmix64's finaliser, as trainer/model/model.c
    M = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)


def teacher_forcing(idx, NC, p, seed):
    """[B, NC] bool: chunk c of sequence idx[b] fuses its target (dfm-train's draw, model_memory_mix_draw)."""
    return torch.tensor([[(mix64((mix64(seed ^ mix64(int(s))) + c) & ((1 << 64) - 1)) >> 11) * 2.0 ** -53 < p
                          for c in range(NC)] for s in idx])


def lr_at(step, a):  # linear warm-up, cosine to min_lr_frac (trainer/kernels/adamw.c lr_schedule)
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, kw in (("backbone", {}), ("data", {}), ("targets", {}), ("init", {}), ("out", {})):
        ap.add_argument("--" + name, required=True, **kw)
    for name, typ, dv in (("steps", int, 100), ("batch", int, 4), ("seq-len", int, 128), ("seed", int, 1),
                          ("val-seqs", int, 0), ("lr", float, 1e-3), ("warmup", int, 10), ("min-lr-frac", float, 0.1),
                          ("wd", float, 0.1), ("beta2", float, 0.95), ("clip", float, 1.0), ("threads", int, 1)):
        ap.add_argument("--" + name, type=typ, default=dv)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    mods = dt.DFMModules.from_safetensors(a.init)
    model = dt.DFMModel(dt.load_backbone(a.backbone), mods)
    c = mods.config
    fm = c.get("fusion_memory", "predicted")
    tf_p = c.get("teacher_forcing_p", 0.5) if fm == "mixed" else (1.0 if fm == "target" else 0.0)
    batches = dfm.Batches(None, a.seq_len, a.batch, 0, 1, a.seed, data=a.data, targets=a.targets,
                          chunk_len=c["chunk_len"], val_seqs=a.val_seqs, steps=a.steps, format="torch")
    params = [p for p in mods.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.wd},  # matrices decay
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, a.beta2), eps=1e-8)
    os.makedirs(a.out, exist_ok=True)
    model.train()
    with open(os.path.join(a.out, "log.jsonl"), "w") as log:
        for step, b in enumerate(batches):
            p = tf_p * (1 - step / a.steps if c.get("teacher_forcing_decay") else 1.0)
            src = teacher_forcing(b.idx.tolist(), b.mask.shape[1], p, (a.seed * 0x9E3779B97F4A7C15 + step) % 2 ** 64)
            r = model(b.tokens, b.labels, b.memory, b.mask, mode="mixed", mem_src=src)
            opt.zero_grad(set_to_none=True)
            r["loss"].backward()
            gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
            if a.clip > 0 and gn > a.clip:
                for q in params:
                    q.grad.mul_(a.clip / float(gn))
            for g in opt.param_groups:
                g["lr"] = lr_at(step, a)
            opt.step()
            log.write(json.dumps({"step": step + 1, "loss": float(r["loss"]), "ce": float(r["ce"]), "mse": r["mse"],
                                  "lr": lr_at(step, a)}) + "\n")
    mods.save_safetensors(os.path.join(a.out, "dfm_modules.safetensors"))
    print("trained %d steps; last loss %.4f; modules in %s" % (a.steps, float(r["loss"]), a.out))


if __name__ == "__main__":
    main()
