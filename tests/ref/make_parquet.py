#!/usr/bin/env python3
"""Parquet test files written with pyarrow, each beside the same texts as JSONL (a null is written to the
JSONL as "", both count as an empty document), for tests/integration/pipeline/test_chunk_parquet.sh and
bench/corpus/bench_corpus_formats.sh.

  variants --corpus C --out DIR --jsonl DIR     one file per writer option set (the table VARIANTS):
                                                codecs, dictionary or plain, data pages v1/v2, nulls,
                                                many row groups and pages, string and large_string
  fineweb --corpus C --out DIR --jsonl DIR [--files N] [--rows-per-group R] [--copies K] [--compression C]
                                                a FineWeb-shaped folder: data/CC-MAIN-*/000_0000N.parquet with
                                                FineWeb's columns, and the JSONL twin of each file
  refusals --out DIR                            files dfm must refuse (names say why)

Every written file is read back with pyarrow and its texts compared, and its metadata checked to hold
the codec, encodings and row groups asked for, so a writer default that changes cannot empty a test."""
import argparse
import base64
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

# name: (compression, use_dictionary, data_page_version, row_group_size, data_page_size, type, nulls)
VARIANTS = {
    "a-snappy-dict-v1": ("snappy", True, "1.0", 1 << 20, 1 << 20, pa.string(), True),
    "b-zstd-plain-v2": ("zstd", False, "2.0", 1 << 20, 1 << 20, pa.string(), True),
    "c-gzip-dict-v2-pages": ("gzip", True, "2.0", 1 << 20, 256, pa.string(), True),
    "d-none-plain-v1-groups": ("none", False, "1.0", 7, 1 << 20, pa.string(), False),
    "e-zstd-dict-v1-large": ("zstd", True, "1.0", 13, 512, pa.large_string(), True),
    "f-snappy-plain-v2-groups": ("snappy", False, "2.0", 5, 300, pa.string(), True),
}


def corpus_texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def write_pair(table, pq_path, jsonl_path, text_col="text", **kw):
    pq.write_table(table, pq_path, **kw)
    back = pq.read_table(pq_path, columns=[text_col]).column(0).to_pylist()
    assert back == table.column(text_col).to_pylist(), pq_path
    with open(jsonl_path, "w", encoding="utf-8") as f:
        for t in back:
            f.write(json.dumps({"text": "" if t is None else t}, ensure_ascii=False) + "\n")


def check_meta(path, compression, dictionary, min_groups):
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups >= min_groups, (path, md.num_row_groups)
    col = md.schema.names.index("text")
    for g in range(md.num_row_groups):
        c = md.row_group(g).column(col)
        want = "UNCOMPRESSED" if compression == "none" else compression.upper()
        assert c.compression == want, (path, c.compression)
        assert ("RLE_DICTIONARY" in c.encodings or "PLAIN_DICTIONARY" in c.encodings) == dictionary, (path, c.encodings)
    return md.num_row_groups


def variants(a):
    texts = corpus_texts(a.corpus)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.jsonl, exist_ok=True)
    per = max(8, len(texts) // len(VARIANTS))
    for k, (name, (comp, dic, ver, rgs, page, typ, nulls)) in enumerate(sorted(VARIANTS.items())):
        part = texts[k * per:(k + 1) * per]
        # repeated texts make the dictionary matter; nulls and "" every 9th and 11th row
        part = part + part[: len(part) // 3]
        if nulls:
            part = [None if i % 9 == 4 else ("" if i % 11 == 6 else t) for i, t in enumerate(part)]
        table = pa.table({"id": pa.array(range(len(part)), pa.int64()), "text": pa.array(part, typ)})
        p = f"{a.out}/{name}.parquet"
        write_pair(table, p, f"{a.jsonl}/{name}.jsonl", compression=comp, use_dictionary=dic,
                   data_page_version=ver, row_group_size=rgs, data_page_size=page, write_page_checksum=True)
        n = check_meta(p, comp, dic, 2 if rgs < 100 else 1)
        print(f"{name}: {len(part)} rows, {n} row groups")


def fineweb(a):
    texts = corpus_texts(a.corpus) * a.copies
    per = (len(texts) + a.files - 1) // a.files
    d = f"{a.out}/data/CC-MAIN-2024-10"
    os.makedirs(d, exist_ok=True)
    os.makedirs(a.jsonl, exist_ok=True)
    for k in range(a.files):
        part = texts[k * per:(k + 1) * per]
        n = len(part)
        table = pa.table({
            "text": pa.array(part, pa.string()),
            "id": pa.array([f"<urn:uuid:{k:04d}-{i:08d}>" for i in range(n)], pa.string()),
            "dump": pa.array(["CC-MAIN-2024-10"] * n, pa.string()),
            "url": pa.array([f"https://example.org/{k}/{i}" for i in range(n)], pa.string()),
            "date": pa.array(["2024-02-20T12:00:00Z"] * n, pa.string()),
            "file_path": pa.array([f"s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/{k}.warc.gz"] * n, pa.string()),
            "language": pa.array(["en"] * n, pa.string()),
            "language_score": pa.array([0.9] * n, pa.float64()),
            "token_count": pa.array([len(t.split()) for t in part], pa.int64()),
        })
        p = f"{d}/000_{k:05d}.parquet"
        write_pair(table, p, f"{a.jsonl}/000_{k:05d}.jsonl", compression=a.compression, row_group_size=a.rows_per_group)
        check_meta(p, a.compression, True, 1)
    print(f"fineweb: {a.files} files, {len(texts)} rows")


class _Kms:  # a test KMS: the "wrapped" key is the key itself, base64 (only for writing a test file)
    @staticmethod
    def client(_config):
        import pyarrow.parquet.encryption as pe

        class K(pe.KmsClient):
            def wrap_key(self, key, master_key_identifier):
                return base64.b64encode(key)

            def unwrap_key(self, wrapped, master_key_identifier):
                return base64.b64decode(wrapped)
        return K()


def refusals(a):
    import pyarrow.parquet.encryption as pe
    os.makedirs(a.out, exist_ok=True)
    t = pa.table({"text": ["one", "two"], "n": pa.array([1, 2], pa.int64()),
                  "blob": pa.array([b"x", b"y"], pa.binary()),
                  "meta": pa.array([{"text": "a"}, {"text": "b"}]),
                  "tags": pa.array([["a"], ["b", "c"]])})
    pq.write_table(t, f"{a.out}/types.parquet")
    bad = pa.array([b"fine", b"bad \xff\xfe utf8"], pa.binary()).view(pa.string())  # not validated on write
    pq.write_table(pa.table({"text": bad}), f"{a.out}/utf8.parquet")
    pq.write_table(pa.table({"text": ["a checksummed page " * 40] * 50}), f"{a.out}/crc.parquet",
                   write_page_checksum=True, compression="none", use_dictionary=False)
    cf = pe.CryptoFactory(_Kms.client)
    for name, plain in (("encrypted", False), ("encrypted-plainfooter", True)):
        cfg = pe.EncryptionConfiguration(footer_key="kf", column_keys={"kc": ["text"]}, plaintext_footer=plain)
        props = cf.file_encryption_properties(pe.KmsConnectionConfig(), cfg)
        pq.write_table(pa.table({"text": ["secret"]}), f"{a.out}/{name}.parquet", encryption_properties=props)
    print("refusals written")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("variants")
    f = sub.add_parser("fineweb")
    for s in (v, f):
        s.add_argument("--corpus", required=True)
        s.add_argument("--out", required=True)
        s.add_argument("--jsonl", required=True)
    f.add_argument("--files", type=int, default=2)
    f.add_argument("--rows-per-group", type=int, default=40)
    f.add_argument("--copies", type=int, default=1)
    f.add_argument("--compression", default="snappy")
    r = sub.add_parser("refusals")
    r.add_argument("--out", required=True)
    a = ap.parse_args()
    {"variants": variants, "fineweb": fineweb, "refusals": refusals}[a.cmd](a)


if __name__ == "__main__":
    main()
