/* `dfm encode RUN` — embed every chunk of a run with the frozen encoder (MPI).
 *
 * Each chunk's n_valid LM tokens are decoded to text (special tokens such as <|endoftext|> dropped),
 * tokenised with the encoder's WordPiece, encoded, pooled and L2-normalised, and written to embedding
 * blocks RUN/encode/emb-BBBBBB.bin (schemas/embedding_shard.h): block b holds chunk ids
 * [b*B, min((b+1)*B, N)), B = --block-chunks. Rank r encodes blocks b = r, r+P, r+2P, ...; a block's
 * bytes depend only on its chunks and the options (windows start at block boundaries, GEMM tiles are
 * fixed), so the files are identical for any number of ranks or threads. A re-run keeps every
 * finished block whose header matches (model, tokenizer, dim, dtype, rows) and whose checksums hold.
 *
 * Also: `dfm encode --texts IN.jsonl --out OUT.bin` embeds the "text" field of each JSONL line into one
 * embedding file (first_chunk 0), for tests, references and ad-hoc queries; --tokens-out FILE writes the
 * WordPiece ids of each line as JSONL.
 */
#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/progress.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "encoder/encoder.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"
#include "pipeline/tokenizer/tokenizer.h"
#include "common/version.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *device, *dtype, *compute, *model, *tokenizer, *texts, *out, *tokens_out;
    int64_t batch, block_chunks, window, max_len;
    int force;
} encode_opts;

static int parse_device(const char *s, int *dev) {
    if (!s || !strcmp(s, "auto")) *dev = dfm_encoder_cuda_available() ? DFM_DEVICE_CUDA : DFM_DEVICE_CPU;
    else if (!strcmp(s, "cpu")) *dev = DFM_DEVICE_CPU;
    else *dev = DFM_DEVICE_CUDA; /* the table allows auto, cpu and cuda */
    return DFM_OK;
}

static int open_encoder(const encode_opts *o, int device, dfm_encoder **enc) {
    int compute;
    if (o->compute) {
        compute = dfm_emb_dtype_parse(o->compute);
    } else {
        compute = device == DFM_DEVICE_CUDA ? DFM_COMPUTE_F16 : DFM_COMPUTE_F32;
    }
    DFM_TRY(dfm_encoder_load(o->model, device, compute, enc));
    int rc = o->batch > 0 ? dfm_encoder_set_batch(*enc, (int)o->batch) : DFM_OK;
    if (!rc && o->max_len > 0) rc = dfm_encoder_set_max_len(*enc, (int)o->max_len);
    if (rc) {
        dfm_encoder_free(*enc);
        *enc = NULL;
    }
    return rc;
}

/* ---- --texts mode -------------------------------------------------------------------------------- */
static int encode_texts(const encode_opts *o, int device, int dtype) {
    if (!o->out) return DFM_FAIL(DFM_EARG, "--texts needs --out FILE");
    dfm_encoder *enc = NULL;
    char *buf = NULL;
    size_t len = 0;
    const char **texts = NULL;
    size_t *lens = NULL;
    json_t **rows = NULL;
    float *emb = NULL;
    dfm_emb_writer *w = NULL;
    FILE *tf = NULL;
    int n = 0, cap = 0;
    int rc = dfm_read_file(o->texts, &buf, &len);
    for (char *p = buf, *e; !rc && p && p < buf + len; p = e + 1) {
        e = memchr(p, '\n', buf + len - p);
        if (!e) e = buf + len;
        if (e == p) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            void *a = realloc(rows, cap * sizeof *rows), *b = a ? realloc(texts, cap * sizeof *texts) : NULL,
                 *c = b ? realloc(lens, cap * sizeof *lens) : NULL;
            if (a) rows = a;
            if (b) texts = b;
            if (c) lens = c;
            if (!c) {
                rc = DFM_FAIL(DFM_ENOMEM, "no memory");
                break;
            }
        }
        json_error_t err;
        rows[n] = json_loadb(p, e - p, JSON_ALLOW_NUL, &err);
        json_t *t = json_object_get(rows[n], "text");
        if (!json_is_string(t)) {
            rc = DFM_FAIL(DFM_EFORMAT, "%s line %d: not a JSON object with a string \"text\"", o->texts, n + 1);
            json_decref(rows[n]);
            break;
        }
        texts[n] = json_string_value(t);
        lens[n] = json_string_length(t);
        n++;
    }
    if (!rc) rc = open_encoder(o, device, &enc);
    int dim = enc ? dfm_encoder_dim(enc) : 0;
    if (!rc && !(emb = malloc(((size_t)n + 1) * dim * sizeof(float)))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    double t0 = dfm_now();
    if (!rc) rc = dfm_encoder_encode(enc, texts, lens, n, emb);
    double dt = dfm_now() - t0;
    if (!rc) {
        dfm_emb_header h = {.dim = (uint32_t)dim, .dtype = (uint32_t)dtype, .model_hash = dfm_encoder_model_hash(enc)};
        rc = dfm_emb_writer_open(o->out, &h, &w);
        if (!rc) rc = dfm_emb_writer_add(w, emb, n);
        if (!rc) rc = dfm_emb_writer_close(w);
        else dfm_emb_writer_abort(w);
    }
    if (!rc && o->tokens_out) {
        tf = fopen(o->tokens_out, "w");
        if (!tf) rc = DFM_FAIL(DFM_EIO, "cannot create %s", o->tokens_out);
        int32_t *ids = malloc(sizeof(int32_t) * dfm_encoder_max_len(enc));
        for (int i = 0; i < n && !rc; i++) {
            int tr = 0;
            int k = dfm_encoder_tokenize(enc, texts[i], lens[i], ids, dfm_encoder_max_len(enc), &tr);
            if (k < 0) {
                rc = k;
                break;
            }
            fprintf(tf, "{\"truncated\": %s, \"ids\": [", tr ? "true" : "false");
            for (int j = 0; j < k; j++) fprintf(tf, "%s%d", j ? ", " : "", ids[j]);
            fprintf(tf, "]}\n");
        }
        free(ids);
        if (tf && fclose(tf) && !rc) rc = DFM_FAIL(DFM_EIO, "writing %s", o->tokens_out);
    }
    if (!rc) {
        dfm_encoder_stats st;
        dfm_encoder_get_stats(enc, &st);
        printf("encode: %d texts (%llu empty, %llu truncated), %llu tokens in %.3fs: %.1f texts/s, %.2f GFLOP/s; %s -> %s\n", n,
               (unsigned long long)st.empty, (unsigned long long)st.truncated, (unsigned long long)st.tokens, dt,
               dt > 0 ? n / dt : 0.0, dt > 0 ? st.flops / dt * 1e-9 : 0.0, dfm_encoder_describe(enc), o->out);
    }
    for (int i = 0; i < n; i++) json_decref(rows[i]);
    free(rows);
    free(texts);
    free(lens);
    free(buf);
    free(emb);
    dfm_encoder_free(enc);
    return rc;
}

/* ---- run mode ------------------------------------------------------------------------------------ */
typedef struct {
    uint64_t chunks, empty, truncated, tokens, blocks_done, blocks_kept, decode_empty;
    double decode_s, tokenize_s, forward_s, write_s;
    dfm_progress *prog; /* rank 0 prints done/total, rate, ETA over all ranks */
} enc_counts;

/* Is the block at path finished and made by the same model/tokenizer/options? */
static int block_is_done(const char *path, uint64_t first, uint64_t n_rows, const dfm_emb_header *want) {
    if (!dfm_path_exists(path)) return 0;
    dfm_emb_shard *s = NULL;
    int rc = dfm_emb_shard_open(path, &s);
    int ok = !rc && s->hdr.first_chunk == first && s->hdr.n_rows == n_rows && s->hdr.dim == want->dim &&
             s->hdr.dtype == want->dtype && s->hdr.model_hash == want->model_hash &&
             s->hdr.tokenizer_hash == want->tokenizer_hash;
    if (rc) {
        DFM_LOG_W("re-encoding %s: %s", path, dfm_last_error());
        dfm_error_clear();
    }
    dfm_emb_shard_close(s);
    return ok;
}

static int encode_block(const encode_opts *o, dfm_encoder *enc, const dfm_tokenizer *lm, const dfm_chunk_set *cs,
                        const char *path, uint64_t first, uint64_t n_rows, const dfm_emb_header *hdr, enc_counts *cnt) {
    int W = (int)o->window, dim = dfm_encoder_dim(enc);
    char **texts = calloc(W, sizeof *texts);
    size_t *lens = calloc(W, sizeof *lens);
    float *emb = malloc((size_t)W * dim * sizeof(float));
    dfm_emb_writer *w = NULL;
    int rc = texts && lens && emb ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory for a window of %d chunks", W);
    if (!rc) rc = dfm_emb_writer_open(path, hdr, &w);
    for (uint64_t s = 0; s < n_rows && !rc; s += (uint64_t)W) {
        int nw = (int)(n_rows - s < (uint64_t)W ? n_rows - s : (uint64_t)W);
        double t0 = dfm_now();
        int drc = DFM_OK;
        char emsg[1024] = "";
        uint64_t n_empty = 0;
#pragma omp parallel for schedule(dynamic, 32) reduction(+ : n_empty)
        for (int i = 0; i < nw; i++) {
            const dfm_chunk_meta *meta;
            const uint32_t *toks;
            int r = dfm_chunk_set_get(cs, first + s + (uint64_t)i, &meta, &toks);
            if (!r) r = dfm_tokenizer_decode(lm, toks, meta->n_valid, 1, &texts[i], &lens[i]);
            if (r) {
#pragma omp critical(dfm_encode_decode_rc)
                if (!drc) {
                    drc = r; /* the message lives in this worker thread: carry it over */
                    snprintf(emsg, sizeof emsg, "%s", dfm_last_error());
                }
            } else if (lens[i] == 0) {
                n_empty++;
            }
        }
        rc = drc ? DFM_FAIL(drc, "decoding chunk: %s", emsg) : DFM_OK;
        double t1 = dfm_now();
        cnt->decode_s += t1 - t0;
        cnt->decode_empty += n_empty;
        if (!rc) rc = dfm_encoder_encode(enc, (const char *const *)texts, lens, nw, emb);
        double t2 = dfm_now();
        if (!rc) rc = dfm_emb_writer_add(w, emb, nw);
        cnt->write_s += dfm_now() - t2;
        for (int i = 0; i < nw; i++) {
            free(texts[i]);
            texts[i] = NULL;
        }
        cnt->chunks += nw;
        dfm_progress_update(cnt->prog, cnt->chunks);
    }
    if (w) {
        double t3 = dfm_now();
        if (rc) dfm_emb_writer_abort(w);
        else rc = dfm_emb_writer_close(w);
        cnt->write_s += dfm_now() - t3;
        if (!rc) dfm_fault_point("encode:block-written", -1);
    }
    free(texts);
    free(lens);
    free(emb);
    if (rc) dfm_error_prefix("encoding block %s (chunks %llu..%llu)", path, (unsigned long long)first,
                             (unsigned long long)(first + n_rows));
    return rc;
}

static int run_mode(const encode_opts *o, json_t *cfg, const char *run, int device, int dtype, dfm_mpi *m) {
    double t_start = dfm_now();
    dfm_chunk_set *cs = NULL;
    dfm_tokenizer *lm = NULL;
    dfm_encoder *enc = NULL;
    json_t *man = NULL;
    char *enc_dir = NULL, *lm_path = NULL;
    enc_counts cnt = {0};
    int skip = 0;
    int rc = dfm_manifest_load(run, 0, &man);
    if (!rc) rc = dfm_manifest_require_complete(man, "chunk", run);
    if (!rc) {
        const char *p = o->tokenizer;
        if (!p) p = json_string_value(json_object_get(json_object_get(dfm_manifest_stage(man, "chunk"), "tokenizer"), "path"));
        if (!p) p = json_string_value(json_object_get(json_object_get(dfm_manifest_stage(man, "chunk"), "config"), "tokenizer"));
        if (!p) rc = DFM_FAIL(DFM_EARG, "%s/manifest.json does not say which LM tokenizer made the chunks. HINT: pass --tokenizer FILE", run);
        else lm_path = strdup(p);
    }
    if (!rc) rc = dfm_chunk_set_open(run, &cs);
    if (!rc) rc = dfm_tokenizer_load(lm_path, &lm);
    if (!rc && cs->n_shards > 0 && cs->shards[0]->hdr.tokenizer_hash != dfm_tokenizer_hash(lm))
        rc = DFM_FAIL(DFM_EMISMATCH, "LM tokenizer %s is not the one that made the chunks of %s (hash %016llx vs %016llx). "
                      "HINT: pass --tokenizer with the tokenizer.json used by 'dfm chunk'", lm_path, run,
                      (unsigned long long)dfm_tokenizer_hash(lm), (unsigned long long)cs->shards[0]->hdr.tokenizer_hash);
    if (!rc) rc = open_encoder(o, device, &enc);
    rc = dfm_mpi_agree(m, rc);
    if (rc) goto done;

    uint64_t N = cs->n_chunks, B = (uint64_t)o->block_chunks, n_blocks = (N + B - 1) / B;
    int dim = dfm_encoder_dim(enc);
    char model_hash[17];
    snprintf(model_hash, sizeof model_hash, "%016llx", (unsigned long long)dfm_encoder_model_hash(enc));
    json_object_set_new(cfg, "model_hash", json_string(model_hash));
    json_object_set_new(cfg, "max_len", json_integer(dfm_encoder_max_len(enc)));
    dfm_emb_header hdr = {.dim = (uint32_t)dim, .dtype = (uint32_t)dtype, .model_hash = dfm_encoder_model_hash(enc),
                          .tokenizer_hash = dfm_tokenizer_hash(lm)};
    enc_dir = dfm_path_join(run, "encode");
    if (!enc_dir) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    /* rank 0: skip a finished identical stage; otherwise mark it running */
    if (!rc && m->rank == 0) {
        rc = dfm_mkdir_p(enc_dir);
        json_t *st = dfm_manifest_stage(man, "encode");
        const char *state = st ? json_string_value(json_object_get(st, "state")) : NULL;
        if (!rc && st && !o->force && state && !strcmp(state, "complete") && json_equal(json_object_get(st, "config"), cfg))
            skip = 1;
        if (!rc && !skip) {
            json_t *stage = json_pack("{s:s, s:i, s:O}", "state", "running", "ranks", m->size, "config", cfg);
            dfm_manifest_drop_later(man, "encode"); /* stale once the embeddings change */
            rc = dfm_manifest_set_stage(man, "encode", stage);
            if (!rc) rc = dfm_manifest_save(run, man);
        }
    }
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Bcast(&skip, 1, MPI_INT, 0, m->comm));
    if (rc) goto done;
    if (skip) {
        if (m->rank == 0) DFM_LOG_I("encode stage of %s is already complete with the same model and options; nothing to do (--force redoes it)", run);
        goto done;
    }
    if (m->rank == 0)
        DFM_LOG_I("encoding %llu chunks in %llu blocks of %llu on %d rank%s: %s", (unsigned long long)N,
                  (unsigned long long)n_blocks, (unsigned long long)B, m->size, m->size > 1 ? "s" : "", dfm_encoder_describe(enc));
    uint64_t mine = 0;
    for (uint64_t b = (uint64_t)m->rank; b < n_blocks; b += (uint64_t)m->size) mine += N - b * B < B ? N - b * B : B;
    dfm_progress_begin(m, "encode", "chunks", mine, &cnt.prog);
    for (uint64_t b = (uint64_t)m->rank; b < n_blocks && !rc; b += (uint64_t)m->size) {
        uint64_t first = b * B, n_rows = N - first < B ? N - first : B;
        char *name = dfm_emb_block_name(b), *path = name ? dfm_path_join(run, name) : NULL;
        if (!path) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        hdr.first_chunk = first;
        if (!rc && !o->force && block_is_done(path, first, n_rows, &hdr)) {
            cnt.blocks_kept++;
            DFM_LOG_D("block %llu already done: %s", (unsigned long long)b, path);
        } else if (!rc) {
            rc = encode_block(o, enc, lm, cs, path, first, n_rows, &hdr, &cnt);
            cnt.blocks_done++;
            if (!rc) DFM_LOG_I("block %llu: %llu chunks -> %s", (unsigned long long)b, (unsigned long long)n_rows, name);
        }
        free(name);
        free(path);
    }
    dfm_progress_end(cnt.prog); /* collective: every rank reaches it, failed or not */
    cnt.prog = NULL;
    rc = dfm_mpi_agree(m, rc);
    if (rc) goto done;
    dfm_encoder_stats es;
    dfm_encoder_get_stats(enc, &es);
    uint64_t loc[7] = {cnt.chunks, es.empty, es.truncated, es.tokens, cnt.blocks_done, cnt.blocks_kept, cnt.decode_empty}, tot[7];
    double tl[5] = {cnt.decode_s, es.tokenize_s, es.forward_s, cnt.write_s, es.flops}, tmax[5], fsum = 0;
    rc = DFM_MPI_CHECK(MPI_Reduce(loc, tot, 7, MPI_UINT64_T, MPI_SUM, 0, m->comm));
    if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(tl, tmax, 4, MPI_DOUBLE, MPI_MAX, 0, m->comm));
    if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(&tl[4], &fsum, 1, MPI_DOUBLE, MPI_SUM, 0, m->comm));
    if (!rc && m->rank == 0) {
        json_t *outs = json_array();
        for (uint64_t b = 0; b < n_blocks; b++) {
            char *name = dfm_emb_block_name(b);
            uint64_t first = b * B, n_rows = N - first < B ? N - first : B;
            json_array_append_new(outs, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)first, "n_rows",
                                                  (json_int_t)n_rows));
            free(name);
        }
        double total = dfm_now() - t_start;
        json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "chunks", (json_int_t)N, "encoded", (json_int_t)tot[0],
                                   "empty", (json_int_t)tot[1], "truncated", (json_int_t)tot[2], "tokens", (json_int_t)tot[3],
                                   "blocks_encoded", (json_int_t)tot[4], "blocks_kept", (json_int_t)tot[5]);
        json_object_set_new(counts, "empty_decoded", json_integer((json_int_t)tot[6]));
        json_t *timings = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "decode_s", tmax[0], "tokenize_s", tmax[1], "forward_s",
                                    tmax[2], "write_s", tmax[3], "total_s", total, "gflop", fsum * 1e-9);
        json_t *st = dfm_manifest_stage(man, "encode");
        json_object_set_new(st, "state", json_string("complete"));
        json_object_set_new(st, "counts", counts);
        json_object_set_new(st, "timings", timings);
        json_object_set_new(st, "outputs", outs);
        json_object_set_new(st, "block_chunks", json_integer((json_int_t)B));
        json_object_set_new(st, "dim", json_integer(dim));
        json_object_set_new(st, "dtype", json_string(dfm_emb_dtype_name((uint32_t)dtype)));
        json_object_set_new(st, "model", json_pack("{s:s, s:s, s:s}", "path", o->model, "hash", model_hash, "describe",
                                                   dfm_encoder_describe(enc)));
        json_object_set_new(st, "dfm_version", json_string(DFM_VERSION));
        rc = dfm_manifest_save(run, man);
        if (!rc)
            printf("encode: %llu chunks (%llu encoded now, %llu empty, %llu truncated), %llu tokens, %llu blocks (%llu kept) in "
                   "%.2fs on %d rank%s: %.1f chunks/s\n",
                   (unsigned long long)N, (unsigned long long)tot[0], (unsigned long long)tot[1], (unsigned long long)tot[2],
                   (unsigned long long)tot[3], (unsigned long long)n_blocks, (unsigned long long)tot[5], total, m->size,
                   m->size > 1 ? "s" : "", total > 0 ? tot[0] / total : 0.0);
    }
    rc = dfm_mpi_agree(m, rc);
done:
    dfm_encoder_free(enc);
    dfm_tokenizer_free(lm);
    dfm_chunk_set_close(cs);
    json_decref(man);
    free(enc_dir);
    free(lm_path);
    return rc;
}

int dfm_cmd_encode(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    encode_opts o;
    memset(&o, 0, sizeof o);
    const char *def_model = getenv("DFM_MODEL");
    if (!def_model || !*def_model) def_model = "/var/cache/dfm/models/all-MiniLM-L6-v2";
    dfm_opt table[] = {
        {"model", DFM_OPT_STR, &o.model, def_model, "DIR", "BERT-family sentence-transformers model folder (env DFM_MODEL)", 0},
        {"device", DFM_OPT_STR, &o.device, "auto", "DEV", "where to encode (auto: cuda when a GPU is visible)", 1, .choices = "auto|cpu|cuda"},
        {"dtype", DFM_OPT_STR, &o.dtype, "fp32", "T", "stored embedding dtype", 0, .choices = "fp32|fp16|bf16"},
        {"compute", DFM_OPT_STR, &o.compute, NULL, "T", "compute precision: fp32 (CPU), fp16/bf16/fp32 (CUDA; default fp16)", 1, .choices = "fp32|fp16|bf16"},
        {"batch", DFM_OPT_INT, &o.batch, "0", "N", "texts per forward batch, length-bucketed (0: 64 on the CPU, 1024 on CUDA)", 1, .min = "0", .max = "65536"},
        {"block-chunks", DFM_OPT_INT, &o.block_chunks, "65536", "B", "chunks per embedding block file", 0, .min = "1", .max = "4294967296"},
        {"window", DFM_OPT_INT, &o.window, "4096", "N", "chunks decoded, sorted by length and encoded together", 0, .min = "1", .max = "1048576"},
        {"max-len", DFM_OPT_INT, &o.max_len, "0", "N", "token limit per text (default: the model's max_seq_length)", 0},
        {"tokenizer", DFM_OPT_STR, &o.tokenizer, NULL, "FILE", "LM tokenizer.json (default: the one the chunk stage used)", 1},
        {"texts", DFM_OPT_STR, &o.texts, NULL, "FILE", "instead of a run: embed the \"text\" of each JSONL line", 1},
        {"out", DFM_OPT_STR, &o.out, NULL, "FILE", "with --texts: the embedding file to write", 1},
        {"tokens-out", DFM_OPT_STR, &o.tokens_out, NULL, "FILE", "with --texts: also write WordPiece ids as JSONL", 1},
        {"force", DFM_OPT_FLAG, &o.force, NULL, NULL, "re-encode every block even if finished", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL;
    int rc = dfm_opts_parse("encode", "RUN | --texts FILE --out FILE",
                            "Embed every chunk of RUN with the frozen encoder: decode with the LM tokenizer, tokenize with "
                            "WordPiece, run the BERT model (CPU or CUDA), mean/CLS-pool, L2-normalise, and write "
                            "RUN/encode/emb-BBBBBB.bin blocks of --block-chunks chunks, recorded in RUN/manifest.json. "
                            "Run under mpirun for several ranks; the files do not depend on the number of ranks.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        dfm_opts_free(table);
        free(pos);
        json_decref(cfg);
        dfm_mpi_finalize();
        return 0;
    }
    int device = 0, dtype = 0;
    if (!rc) rc = parse_device(o.device, &device);
    if (!rc) dtype = dfm_emb_dtype_parse(o.dtype);
    if (!rc && o.texts) {
        if (m.rank == 0) rc = encode_texts(&o, device, dtype);
    } else if (!rc) {
        if (npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm encode RUN (or --texts FILE --out FILE); see --help");
        else {
            json_object_set_new(cfg, "dtype", json_string(dfm_emb_dtype_name((uint32_t)dtype)));
            rc = run_mode(&o, cfg, pos[0], device, dtype, &m);
        }
    }
    dfm_opts_free(table);
    free(pos);
    json_decref(cfg);
    dfm_mpi_finalize();
    return rc;
}
