"""Memory that helps: the short version of bench/memory/bench_memory.sh.

On a keyed synthetic corpus (`dfm-train synth --mode keyed`, trainer/data/synth.h: every chunk's key decides
its tokens, the target memory encodes the key, keys follow a chain) a small backbone is pretrained, then
DFM modules are trained on it with the trainer's default memory flags (alignment, fusion memory,
predictor loss). The held-out CE with predicted memory must beat fusion off, the predicted slots must
point where the targets do, and no evaluation mode may be worse than fusion off. The same corpus with a
backbone pretrained on keyed-random text (it knows the key sets but not the chain: DFM's case of a frozen
LM and a datastore holding what it does not know) must gain clearly more. On the keyed-random
corpus (independent keys, same key sets; its own backbone: one pretrained on chained keys leans on the
chain) modules trained on the target memory must turn it into a clear gain: the fusion path alone.
(There, predicted memory cannot know the key and the fusion never saw a prediction: that mode is not
checked.) The shuffled controls of the evaluation (another held-out sequence's memory through the same
modules) must cost what memory gives where memory matters, and nothing where predicted memory carries
nothing (keyed-random); the reported memory effect must be the control's CE minus the real memory's.

The keyed row runs at the benchmark's own sizes (the first row of bench/memory/bench_memory.sh, bit for bit) and
must reach 0.14 nats with slot cosine >= 0.9 (the benchmark's goal is 0.15; the margin is for another
CPU's rounding); the other two rows run shorter, with thresholds they reach with margin (see the
constants). Every CE an evaluation reports must be a finite number (dfm-train writes NaN as null).
Exits non-zero on any failure.
Run: $DFM_PYTHON tests/py/train/test_train_memory_effect.py   (DFM_TRAIN = path of dfm-train)
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import ce_modes, check, finish, run  # noqa: E402

T, L, SEQS, VAL, PRE_STEPS = 128, 16, 3000, 64, 600
DFM_STEPS = 1500          # the keyed row: the full benchmark's sizes (bench/memory/keyed_lib.sh)
DFM_STEPS_OTHER = 600     # the other two rows: their effects are large
# measured with these sizes (2 threads, 2026-12-01; 128 keys): keyed gain 0.163 nats, cos 0.923, every
# mode below fusion off (69 s on 2 idle cores for the whole test); the backbone without the chain: gain
# 0.475, cos 0.870; keyed-random target-memory gain 0.650. With 64 keys (a chain the backbone learns
# much of itself) the keyed gain was 0.067: below MIN_GAIN_PRED.
MIN_GAIN_PRED = 0.14      # nats: fusion off - predicted memory, keyed corpus (the benchmark asks 0.15: margin
                          # for other CPUs' rounding)
MIN_COS = 0.9             # predicted vs target slots, keyed corpus
MIN_GAIN_PRED_LM = 0.15   # nats: the same, backbone pretrained on keyed-random text (knows the key sets, not the chain)
MIN_COS_LM = 0.8
MIN_GAIN_TARGET = 0.1     # nats: fusion off - target memory, keyed-random corpus, modules trained on targets
SLACK = 0.002             # no mode may be worse than fusion off by more than this


def final_eval(out):
    ev = [r for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if "eval" in r]
    return ev[-1]["eval"]


def control(ev, what, pred_min=None, pred_max=None, target_min=None):
    """The shuffled control: the memory effect is the control's CE minus the real memory's, as reported."""
    for m in ("pred", "target"):
        check(abs(ev["memory_effect_" + m] - (ev["ce_%s_shuffled" % m] - ev["ce_" + m])) < 2e-6,
              "%s: memory_effect_%s %.6f = ce_%s_shuffled - ce_%s" % (what, m, ev["memory_effect_" + m], m, m))
        # its noise: the effect batch by batch, whose mean is the effect and whose spread gives the standard error
        xs, n = ev["memory_effect_%s_batches" % m], ev["batches"]
        mean = sum(xs) / len(xs)
        se = (sum((x - mean) ** 2 for x in xs) / (n - 1) / n) ** 0.5
        check(len(xs) == n and abs(mean - ev["memory_effect_" + m]) < 1e-5 and abs(se - ev["memory_effect_%s_se" % m]) < 1e-5,
              "%s: the %d batch effects of %s average to the effect %.6f (%.6f) with standard error %.6f (reported %.6f)"
              % (what, len(xs), m, ev["memory_effect_" + m], mean, se, ev["memory_effect_%s_se" % m]))
    if pred_min is not None:
        check(ev["memory_effect_pred"] >= pred_min, "%s: another sequence's predicted memory costs %.4f nats (>= %.2f)"
              % (what, ev["memory_effect_pred"], pred_min))
    if pred_max is not None:
        check(abs(ev["memory_effect_pred"]) <= pred_max, "%s: predicted memory that carries nothing: its control "
              "differs by %.4f nats (<= %.3f)" % (what, ev["memory_effect_pred"], pred_max))
    if target_min is not None:
        check(ev["memory_effect_target"] >= target_min, "%s: another sequence's target memory costs %.4f nats (>= %.2f)"
              % (what, ev["memory_effect_target"], target_min))


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as w:
        common = ["--seq-len", T, "--batch", 8, "--val-seqs", VAL, "--threads", 2, "--no-ckpt"]
        for mode in ("keyed", "keyed-random"):
            run("synth", "--out", os.path.join(w, mode), "--mode", mode, "--seqs", SEQS, "--seq-len", T,
                "--chunk-len", L)
        pres = {}
        for mode in ("keyed", "keyed-random"):
            pres[mode] = os.path.join(w, mode + "-pre")
            run("pretrain", "--data", os.path.join(w, mode, "tokens.bin"), "--out", pres[mode], "--steps", PRE_STEPS,
                "--lr", 3e-3, "--warmup", 20, "--layers", 2, "--hidden", 64, "--heads", 4, "--kv-heads", 2, *common)
        dfm = ["--chunk-len", L, "--lr", 5e-3, "--warmup", 20, "--fusion-layers", "0,1", "--pred-hidden", 64, *common]

        def train(mode, *flags, backbone=None, steps=DFM_STEPS_OTHER):
            backbone = backbone or mode
            d, out = os.path.join(w, mode), os.path.join(w, "%s-on-%s-dfm" % (mode, backbone))
            run("train", "--backbone", os.path.join(pres[backbone], "model"), "--data", os.path.join(d, "tokens.bin"),
                "--targets", os.path.join(d, "targets.bin"), "--out", out, "--steps", steps, *dfm, *flags)
            ev = final_eval(out)
            what = "%s, backbone pretrained on %s, %s" % (mode, backbone, " ".join(flags) or "(defaults)")
            print("%s: %s" % (what, json.dumps(ev)))
            ce_modes(ev, what)  # every mode a finite number, in every row
            return ev

        def no_mode_worse(ev, what):  # the memory modes, not their shuffled controls (another sequence's memory)
            for k, v in ce_modes(ev, what).items():
                if k.endswith("_shuffled"):
                    continue
                check(v <= ev["ce_none"] + SLACK, "%s: mode %s %.4f is not worse than fusion off %.4f"
                      % (what, k, v, ev["ce_none"]))

        ev = train("keyed", steps=DFM_STEPS)
        gain = ev["ce_none"] - ev["ce_pred"]
        check(gain >= MIN_GAIN_PRED, "keyed, default flags: predicted memory %.4f is %.4f nats below fusion off %.4f "
              "(>= %.3f)" % (ev["ce_pred"], gain, ev["ce_none"], MIN_GAIN_PRED))
        check(ev["cos"] >= MIN_COS, "keyed: predicted-vs-target cosine %.3f >= %.2f" % (ev["cos"], MIN_COS))
        no_mode_worse(ev, "keyed")
        control(ev, "keyed", pred_min=MIN_GAIN_PRED, target_min=MIN_GAIN_PRED)

        # DFM's use case: the frozen LM knows the language (key sets) but not the corpus's chain
        ev = train("keyed", backbone="keyed-random")
        gain = ev["ce_none"] - ev["ce_pred"]
        check(gain >= MIN_GAIN_PRED_LM, "keyed, backbone without the chain: predicted memory %.4f is %.4f nats below "
              "fusion off %.4f (>= %.2f)" % (ev["ce_pred"], gain, ev["ce_none"], MIN_GAIN_PRED_LM))
        check(ev["cos"] >= MIN_COS_LM, "keyed, backbone without the chain: cosine %.3f >= %.2f" % (ev["cos"], MIN_COS_LM))
        no_mode_worse(ev, "keyed, backbone without the chain")
        control(ev, "keyed, backbone without the chain", pred_min=MIN_GAIN_PRED_LM, target_min=MIN_GAIN_PRED_LM)

        ev = train("keyed-random", "--fusion-memory", "target")
        gain = ev["ce_none"] - ev["ce_target"]
        check(gain >= MIN_GAIN_TARGET, "keyed-random, trained on targets: target memory %.4f is %.4f nats below "
              "fusion off %.4f (>= %.2f)" % (ev["ce_target"], gain, ev["ce_none"], MIN_GAIN_TARGET))
        check(ev["trained_with_target"], "keyed-random: the evaluation knows the modules were trained on targets")
        control(ev, "keyed-random", pred_max=0.01, target_min=MIN_GAIN_TARGET)
    finish("memory effect (%.0f s)" % (time.time() - t0))


if __name__ == "__main__":
    main()
