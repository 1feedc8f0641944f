"""Compact vocabularies (trainer/data/vocab_map.h, schemas/vocab_map.md): `dfm-train pretrain --compact-vocab`
on tokens with sparse ids must train exactly the model that plain pretraining trains on the same tokens
renumbered densely by hand (byte-identical weights), store the map beside it and say so in config.json;
train / eval on the sparse ids must equal train / eval of the dense twin; generate must map the prompt in
and the answer back; an id the map lacks and a damaged map are refused. Exits non-zero on any failure.
Run: $DFM_PYTHON tests/py/train/test_train_compact_vocab.py   (DFM_TRAIN = path of dfm-train)
"""
import filecmp
import json
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish, run  # noqa: E402


def read_shard(path):
    b = open(path, "rb").read()
    h = list(struct.unpack_from("<256i", b))
    return h, list(struct.unpack_from("<%dI" % h[2], b, 1024))


def write_shard(path, h, ids):
    open(path, "wb").write(struct.pack("<256i", *h) + struct.pack("<%dI" % len(ids), *ids))


def main():
    with tempfile.TemporaryDirectory() as w:
        data = os.path.join(w, "data")
        run("synth", "--out", data, "--seqs", 48, "--seq-len", 32, "--chunk-len", 8, "--vocab", 120, "--slots", 3,
            "--d-mem", 16)
        h, ids = read_shard(os.path.join(data, "tokens.bin"))
        sparse = [t * 1237 + 11 for t in ids]  # ids up to ~150k, like a real tokenizer's
        used = sorted(set(sparse))
        dense = [used.index(t) for t in sparse]
        write_shard(os.path.join(w, "sparse.bin"), h, sparse)
        write_shard(os.path.join(w, "dense.bin"), h, dense)
        common = ["--seq-len", 32, "--batch", 4, "--steps", 4, "--val-seqs", 8, "--threads", 1, "--seed", 3]
        shape = ["--layers", 2, "--hidden", 32, "--heads", 4, "--kv-heads", 2]
        run("pretrain", "--data", os.path.join(w, "sparse.bin"), "--out", os.path.join(w, "pc"), "--compact-vocab",
            *shape, *common)
        run("pretrain", "--data", os.path.join(w, "dense.bin"), "--out", os.path.join(w, "pd"), "--vocab", len(used),
            *shape, *common)
        mc, md = os.path.join(w, "pc", "model"), os.path.join(w, "pd", "model")
        check(filecmp.cmp(os.path.join(mc, "model.safetensors"), os.path.join(md, "model.safetensors"), shallow=False),
              "compact-vocabulary pretraining equals pretraining on hand-renumbered ids (byte-identical weights)")
        cfg = json.load(open(os.path.join(mc, "config.json")))
        note = cfg.get("dfm_vocab_map", {})
        check(cfg["vocab_size"] == len(used) and note.get("compact_ids") == len(used) and
              note.get("source_vocab") == max(used) + 1 and note.get("file") == "vocab_map.bin",
              "config.json: vocab_size = %d distinct ids, dfm_vocab_map names the file and sizes" % len(used))
        vm = open(os.path.join(mc, "vocab_map.bin"), "rb").read()
        n = struct.unpack_from("<I", vm, 12)[0]
        check(vm[:8] == b"DFMVMAP1" and list(struct.unpack_from("<%dI" % n, vm, 32)) == used,
              "vocab_map.bin lists the used ids in increasing order")

        tflags = ["--targets", os.path.join(data, "targets.bin"), "--chunk-len", 8, "--fusion-layers", 1,
                  "--steps", 3, "--seq-len", 32, "--batch", 4, "--val-seqs", 8, "--threads", 1, "--seed", 3]
        run("train", "--backbone", mc, "--data", os.path.join(w, "sparse.bin"), "--out", os.path.join(w, "tc"), *tflags)
        run("train", "--backbone", md, "--data", os.path.join(w, "dense.bin"), "--out", os.path.join(w, "td"), *tflags)
        check(filecmp.cmp(os.path.join(w, "tc", "dfm_modules.safetensors"), os.path.join(w, "td", "dfm_modules.safetensors"),
                          shallow=False), "train on sparse ids through the map equals train on dense ids")
        ev = []
        for bb, tokens, out in ((mc, "sparse.bin", "tc"), (md, "dense.bin", "td")):
            p = run("eval", "--backbone", bb, "--modules", os.path.join(w, out, "dfm_modules.safetensors"), "--data",
                    os.path.join(w, tokens), "--targets", os.path.join(data, "targets.bin"), "--seq-len", 32,
                    "--val-seqs", 8, "--threads", 1)
            ev.append([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
        check(ev[0] == ev[1], "eval through the map equals eval of the dense twin")

        prompt = sparse[:10]
        gc = run("generate", "--backbone", mc, "--modules", os.path.join(w, "tc", "dfm_modules.safetensors"),
                 "--prompt-ids", ",".join(map(str, prompt)), "--max-new", 6)
        gd = run("generate", "--backbone", md, "--modules", os.path.join(w, "td", "dfm_modules.safetensors"),
                 "--prompt-ids", ",".join(str(used.index(t)) for t in prompt), "--max-new", 6)
        out_c = [int(x) for x in gc.stdout.split("ids:")[1].split()[0].split(",")]
        out_d = [int(x) for x in gd.stdout.split("ids:")[1].split()[0].split(",")]
        check(out_c == [used[t] for t in out_d], "generate maps the prompt in and the answer back (%s)" % out_c)
        bad = run("generate", "--backbone", mc, "--prompt-ids", "%d,%d" % (used[0], used[0] + 1), "--max-new", 2, ok=False)
        check(bad.returncode != 0 and "not in the backbone's compact vocabulary" in bad.stderr,
              "a prompt id the map lacks is refused, naming it")
        corrupt = bytearray(vm)
        corrupt[40] ^= 1
        open(os.path.join(mc, "vocab_map.bin"), "wb").write(bytes(corrupt))
        bad = run("eval", "--backbone", mc, "--modules", os.path.join(w, "tc", "dfm_modules.safetensors"), "--data",
                  os.path.join(w, "sparse.bin"), "--seq-len", 32, "--val-seqs", 8, ok=False)
        check(bad.returncode != 0 and "checksum" in bad.stderr, "a damaged vocab_map.bin is refused (checksum)")
    finish("compact vocabularies")


if __name__ == "__main__":
    main()
