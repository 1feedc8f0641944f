"""The Python target reader (python/dfm_targets.py) against the C reader (build/libdfm.so via ctypes) on
the same shards, for every dtype and both store options, and for --slots-hold continuation and both; and its
fault detection (a shard or a record of another slots choice among them too). Exits non-zero on failure."""
import ctypes
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import xxhash

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import dfm_targets  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
LIB = os.path.join(ROOT, "build", "libdfm.so")


class Trec(ctypes.Structure):
    _fields_ = [("chunk_id", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("mask", ctypes.c_uint64),
                ("ids", ctypes.POINTER(ctypes.c_int64)), ("scores", ctypes.POINTER(ctypes.c_float)),
                ("emb", ctypes.POINTER(ctypes.c_float))]


class Info(ctypes.Structure):
    _fields_ = [("n_chunks", ctypes.c_uint64), ("k", ctypes.c_uint32), ("d", ctypes.c_uint32), ("dtype", ctypes.c_int),
                ("ids_only", ctypes.c_int), ("n_shards", ctypes.c_uint32), ("span", ctypes.c_uint64),
                ("raw_bytes", ctypes.c_uint64), ("stored_bytes", ctypes.c_uint64), ("fingerprint", ctypes.c_char * 17)]


lib = ctypes.CDLL(LIB)
lib.dfm_target_reader_open.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.dfm_target_reader_info.restype = ctypes.POINTER(Info)
lib.dfm_target_reader_info.argtypes = [ctypes.c_void_p]
lib.dfm_target_reader_next.argtypes = [ctypes.c_void_p, ctypes.POINTER(Trec)]
lib.dfm_target_reader_get.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(Trec)]
lib.dfm_target_reader_close.argtypes = [ctypes.c_void_p]
lib.dfm_last_error.restype = ctypes.c_char_p

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def c_records(run):
    h = ctypes.c_void_p()
    rc = lib.dfm_target_reader_open(run.encode(), None, ctypes.byref(h))
    assert rc == 0, lib.dfm_last_error().decode()
    inf = lib.dfm_target_reader_info(h).contents
    k, d = inf.k, inf.d
    ids = (ctypes.c_int64 * k)()
    sc = (ctypes.c_float * k)()
    emb = (ctypes.c_float * (k * d))()
    t = Trec(0, 0, 0, ids, sc, emb)
    out = []
    while True:
        rc = lib.dfm_target_reader_next(h, ctypes.byref(t))
        if rc == 1:
            break
        assert rc == 0, lib.dfm_last_error().decode()
        out.append((t.chunk_id, t.flags, t.mask, np.ctypeslib.as_array(ids).copy(), np.ctypeslib.as_array(sc).copy(),
                    np.ctypeslib.as_array(emb).reshape(k, d).copy()))
    lib.dfm_target_reader_close(h)
    return out


def write_run(path, *args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DFM_LOG_LEVEL="warn")
    subprocess.run([DFM, "write-targets", path, "--synthetic", "150", "--k", "5", "--d", "24", "--target-shards", "3",
                    "--seq-chunks", "6", *args], check=True, env=env, stdout=subprocess.DEVNULL)


def expect_error(fn, cls, needle, what):
    try:
        fn()
    except cls as e:
        check(needle in str(e), f"{what}: message '{e}' lacks '{needle}'")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__}: {e}, want {cls.__name__}")
        return
    check(False, f"{what}: no error")


def drain(run_dir):
    with dfm_targets.TargetRun(run_dir) as r:
        for _ in r.records():
            pass


def patch_all(path, old, at, newbyte):
    assert at < len(old)
    data = bytearray(open(path, "rb").read())
    pos, hits = 0, 0
    while True:
        i = data.find(old, pos)
        if i < 0:
            break
        data[i + at] = newbyte(data[i + at])
        pos, hits = i + len(old), hits + 1
    assert hits, "record bytes not found in data.mdb"
    open(path, "wb").write(bytes(data))


def main():
    tmp = tempfile.mkdtemp(prefix="dfm-py-targets-")
    try:
        for dtype in ("fp32", "fp16", "bf16"):
            for store in ("embeddings", "ids"):
                run = os.path.join(tmp, f"{dtype}-{store}")
                write_run(run, "--dtype", dtype, "--store", store)
                cre = c_records(run)
                with dfm_targets.TargetRun(run, tokens_run=run, k=5, d=24) as r:
                    py = list(r.records())
                    check(len(py) == len(cre) == 150, f"{dtype}/{store}: {len(py)} python vs {len(cre)} C records")
                    for a, b in zip(py, cre):
                        cid, flags, mask, ids, sc, emb = b
                        m = np.array([(mask >> i) & 1 for i in range(5)], bool)
                        same = a["chunk_id"] == cid and a["flags"] & 24 == flags & 24 and np.array_equal(a["mask"], m) and \
                            np.array_equal(a["ids"], ids) and a["scores"].tobytes() == sc.tobytes() and \
                            a["emb"].tobytes() == emb.tobytes()
                        if not same:
                            check(False, f"{dtype}/{store}: chunk {cid} differs between the Python and C readers")
                            break
                    g = r.get(77)
                    check(g["emb"].tobytes() == cre[77][5].tobytes(), f"{dtype}/{store}: get(77) differs from C")
                    seqs = list(r.sequences())
                    check(len(seqs) == 25 and seqs[0]["emb"].shape == (6, 5, 24) and not seqs[1]["mask"][0].any(),
                          f"{dtype}/{store}: sequences() grouping ({len(seqs)} sequences)")
                    print(f"ok {dtype}/{store}: Python and C readers agree on 150 records")

        # what the slots hold: both readers agree, and say the same
        for slots, k in (("continuation", 5), ("both", 10)):
            for store in ("embeddings", "ids"):
                run = os.path.join(tmp, f"{slots}-{store}")
                write_run(run, "--slots-hold", slots, "--store", store)
                cre = c_records(run)
                with dfm_targets.TargetRun(run, k=k) as r:
                    check(r.slots == slots and r.k == k, f"{slots}/{store}: run says slots {r.slots}, K {r.k}")
                    py = list(r.records())
                same = len(py) == len(cre) == 150 and all(
                    a["chunk_id"] == b[0] and np.array_equal(a["ids"], b[3]) and a["emb"].tobytes() == b[5].tobytes() and
                    int(sum(1 << i for i, v in enumerate(a["mask"]) if v)) == b[2] for a, b in zip(py, cre))
                check(same, f"{slots}/{store}: the Python and C readers differ")
                print(f"ok slots {slots}/{store}: Python and C readers agree on 150 records of {k} slots")
        # a continuation shard among neighbour shards: refused by shard.json's slots
        mixed = os.path.join(tmp, "mixed-slots")
        shutil.copytree(os.path.join(tmp, "fp16-embeddings"), mixed)
        shutil.rmtree(os.path.join(mixed, "targets/shard-00001"))
        shutil.copytree(os.path.join(tmp, "continuation-embeddings", "targets/shard-00001"), os.path.join(mixed, "targets/shard-00001"))
        expect_error(lambda: dfm_targets.TargetRun(mixed), dfm_targets.TargetMismatchError, "slots is continuation",
                     "a continuation shard among neighbour shards")
        # a record whose slots byte says continuation, checksums recomputed: refused by the record check
        with dfm_targets.TargetRun(os.path.join(tmp, "fp16-embeddings")) as r:
            with r.shards[1].env.begin() as txn:
                buf = bytearray(txn.get(struct.pack(">Q", 61)))
        buf[19] = 1
        struct.pack_into("<Q", buf, 40, xxhash.xxh3_64_intdigest(bytes(buf[48:]), seed=xxhash.xxh3_64_intdigest(bytes(buf[:40]))))
        expect_error(lambda: dfm_targets.decode_record(bytes(buf), 5, 24, 2, False, 0), dfm_targets.TargetMismatchError,
                     "slots continuation", "a record of another slots choice")

        # faults, each named by the Python reader
        base = os.path.join(tmp, "fp16-embeddings")
        rec_bytes = None
        with dfm_targets.TargetRun(base) as r:
            sh = r.shards[1]
            with sh.env.begin() as txn:
                rec_bytes = bytes(txn.get(struct.pack(">Q", 61)))  # 60 starts a sequence: a 72-byte record
        flip = os.path.join(tmp, "flip")
        shutil.copytree(base, flip)
        patch_all(os.path.join(flip, "targets/shard-00001/data.mdb"), rec_bytes, 90, lambda b: b ^ 0x04)
        expect_error(lambda: dfm_targets.TargetRun(flip).get(61), dfm_targets.TargetChecksumError,
                     "shard-00001 key 000000000000003d (chunk 61)", "flipped byte (get)")
        expect_error(lambda: drain(flip), dfm_targets.TargetChecksumError, "key 000000000000003d", "flipped byte (iteration)")

        ver = os.path.join(tmp, "ver")
        shutil.copytree(base, ver)
        patch_all(os.path.join(ver, "targets/shard-00001/data.mdb"), rec_bytes, 4, lambda b: 9)
        expect_error(lambda: dfm_targets.TargetRun(ver).get(61), dfm_targets.TargetVersionError, "chunk 61", "unknown version")

        trunc = os.path.join(tmp, "trunc")
        shutil.copytree(base, trunc)
        p = os.path.join(trunc, "targets/shard-00002/data.mdb")
        os.truncate(p, os.path.getsize(p) - 4096)
        expect_error(lambda: dfm_targets.TargetRun(trunc), dfm_targets.TargetTruncatedError, "shard-00002/data.mdb",
                     "truncated data.mdb")

        meta = os.path.join(tmp, "meta")  # both LMDB meta pages damaged: the magic of pages 0 and 1 zeroed
        shutil.copytree(base, meta)
        p = os.path.join(meta, "targets/shard-00001/data.mdb")
        data = bytearray(open(p, "rb").read())
        for page in (0, 4096):
            data[page + 16:page + 24] = bytes(8)
        open(p, "wb").write(bytes(data))
        expect_error(lambda: dfm_targets.TargetRun(meta), dfm_targets.TargetError, "shard-00001", "damaged LMDB meta pages")

        other = os.path.join(tmp, "other")
        write_run(other, "--seed", "9")
        mixed = os.path.join(tmp, "mixed")
        shutil.copytree(base, mixed)
        shutil.rmtree(os.path.join(mixed, "targets/shard-00000"))
        shutil.copytree(os.path.join(other, "targets/shard-00000"), os.path.join(mixed, "targets/shard-00000"))
        expect_error(lambda: dfm_targets.TargetRun(mixed), dfm_targets.TargetMismatchError, "shard-00000",
                     "shard of another run")
        expect_error(lambda: dfm_targets.TargetRun(base, tokens_run=other), dfm_targets.TargetMismatchError,
                     "'synthetic' stage", "targets checked against another run's tokens")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
