/* encode.c — the encode stage and texts mode (see encode.h). */
#include "encoder/encode.h"

#include "common/error.h"
#include "common/stop.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/progress.h"
#include "common/version.h"
#include "encoder/encoder.h"
#include "tokenizer/tokenizer.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef DFM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* --device: auto (or unset), cpu or cuda */
static void parse_device(const char *s, int *dev) {
    if (!s || !strcmp(s, "auto")) *dev = dfm_encoder_cuda_available() ? DFM_DEVICE_CUDA : DFM_DEVICE_CPU;
    else if (!strcmp(s, "cpu")) *dev = DFM_DEVICE_CPU;
    else *dev = DFM_DEVICE_CUDA;
}

/* --precision: auto (or unset) is fp16 on CUDA, fp32 on the CPU */
static int parse_precision(const char *s, int device) {
    if (!s || !strcmp(s, "auto")) return device == DFM_DEVICE_CUDA ? DFM_COMPUTE_F16 : DFM_COMPUTE_F32;
    return dfm_encoder_precision_parse(s);
}

static int open_encoder(const dfm_encode_config *o, int device, dfm_encoder **enc) {
    int compute = parse_precision(o->precision, device);
    if (compute < 0) return DFM_FAIL(DFM_EARG, "--precision %s: use auto, fp32, fp16, bf16 or int8", o->precision);
    DFM_TRY(dfm_encoder_load(o->model, device, compute, enc));
    int rc = o->batch > 0 ? dfm_encoder_set_batch(*enc, (int)o->batch) : DFM_OK;
    if (!rc && o->max_len > 0) rc = dfm_encoder_set_max_len(*enc, (int)o->max_len);
    if (rc) {
        dfm_encoder_free(*enc);
        *enc = NULL;
    }
    return rc;
}

/* ---- texts mode -------------------------------------------------------------------------------- */
int dfm_encode_texts(const dfm_encode_config *o) {
    if (!o->out) return DFM_FAIL(DFM_EARG, "--texts needs --out FILE");
    int device = 0, dtype = dfm_emb_dtype_parse(o->dtype);
    parse_device(o->device, &device);
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

/* ---- the stage ------------------------------------------------------------------------------------ */
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

static int encode_block(const dfm_encode_config *o, dfm_encoder *enc, const dfm_tokenizer *lm, const dfm_chunk_set *cs,
                        const char *path, uint64_t first, uint64_t n_rows, const dfm_emb_header *hdr, enc_counts *cnt) {
    int W = (int)o->window, dim = dfm_encoder_dim(enc);
    char **texts = calloc(W, sizeof *texts);
    size_t *lens = calloc(W, sizeof *lens);
    float *emb = malloc((size_t)W * dim * sizeof(float));
    dfm_emb_writer *w = NULL;
    int rc = texts && lens && emb ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory for a window of %d chunks", W);
    if (!rc) rc = dfm_emb_writer_open(path, hdr, &w);
    for (uint64_t s = 0; s < n_rows && !rc; s += (uint64_t)W) {
        /* a stop abandons this block: its temporary file is removed, the finished blocks are kept */
        if ((rc = dfm_stop_check("inside %s (abandoned; the finished blocks are kept)", path))) break;
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

/* One stage run's state. */
typedef struct {
    const dfm_mpi *m;
    const dfm_encode_config *o;
    const char *run;
    int device, dtype;
    dfm_chunk_set *cs;
    dfm_tokenizer *lm;
    dfm_encoder *enc;
    json_t *man;
    uint64_t N, B, n_blocks; /* chunks, chunks per block, blocks */
    char model_hash[17];
    enc_counts cnt;
    double t_start;
} encode_run;

/* The manifest (chunk stage complete), the chunks, the LM tokenizer that made them, the encoder. */
static int encode_open(encode_run *r) {
    const dfm_encode_config *o = r->o;
    const char *run = r->run;
    DFM_TRY(dfm_manifest_load(run, 0, &r->man));
    DFM_TRY(dfm_manifest_require_complete(r->man, "chunk", run));
    json_t *chunk = dfm_manifest_stage(r->man, "chunk");
    const char *lm_path = o->tokenizer;
    if (!lm_path) lm_path = json_string_value(json_object_get(json_object_get(chunk, "tokenizer"), "path"));
    if (!lm_path) lm_path = json_string_value(json_object_get(json_object_get(chunk, "config"), "tokenizer"));
    if (!lm_path)
        return DFM_FAIL(DFM_EARG, "%s/manifest.json does not say which LM tokenizer made the chunks. HINT: pass --tokenizer FILE", run);
    DFM_TRY(dfm_chunk_set_open(run, &r->cs));
    DFM_TRY(dfm_tokenizer_load(lm_path, &r->lm));
    if (r->cs->n_shards > 0 && r->cs->shards[0]->hdr.tokenizer_hash != dfm_tokenizer_hash(r->lm))
        return DFM_FAIL(DFM_EMISMATCH, "LM tokenizer %s is not the one that made the chunks of %s (hash %016llx vs %016llx). "
                        "HINT: pass --tokenizer with the tokenizer.json used by 'dfm chunk'", lm_path, run,
                        (unsigned long long)dfm_tokenizer_hash(r->lm), (unsigned long long)r->cs->shards[0]->hdr.tokenizer_hash);
    return open_encoder(o, r->device, &r->enc);
}

/* rank 0: the stage contract (common/manifest.h); an interrupted stage keeps its finished blocks */
static int stage_begin(encode_run *r, json_t *config, int *skip) {
    dfm_stage_spec spec = {"encode", config, NULL, r->o->force, r->m->size, .file_ok = dfm_emb_shard_check};
    dfm_stage_action act;
    DFM_TRY(dfm_stage_begin(r->man, r->run, &spec, &act));
    *skip = act == DFM_STAGE_SKIP;
    return DFM_OK;
}

/* This rank's blocks b = rank, rank + P, ...: kept when finished and matching, else encoded. */
static int encode_blocks(encode_run *r, dfm_emb_header *hdr) {
    const dfm_mpi *m = r->m;
    uint64_t N = r->N, B = r->B, mine = 0;
    int rc = DFM_OK;
    for (uint64_t b = (uint64_t)m->rank; b < r->n_blocks; b += (uint64_t)m->size) mine += N - b * B < B ? N - b * B : B;
    dfm_progress_begin(m, "encode", "chunks", mine, &r->cnt.prog);
    for (uint64_t b = (uint64_t)m->rank; b < r->n_blocks && !rc; b += (uint64_t)m->size) {
        uint64_t first = b * B, n_rows = N - first < B ? N - first : B;
        char *name = dfm_emb_block_name(b), *path = name ? dfm_path_join(r->run, name) : NULL;
        if (!path) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) rc = dfm_stop_check("before block %llu (the finished blocks are kept)", (unsigned long long)b);
        hdr->first_chunk = first;
        if (!rc && block_is_done(path, first, n_rows, hdr)) { /* only after a resume: FRESH emptied the folder */
            r->cnt.blocks_kept++;
            DFM_LOG_D("block %llu already done: %s", (unsigned long long)b, path);
        } else if (!rc) {
            rc = encode_block(r->o, r->enc, r->lm, r->cs, path, first, n_rows, hdr, &r->cnt);
            r->cnt.blocks_done++;
            if (!rc) DFM_LOG_I("block %llu: %llu chunks -> %s", (unsigned long long)b, (unsigned long long)n_rows, name);
        }
        free(name);
        free(path);
    }
    dfm_progress_end(r->cnt.prog); /* collective: every rank reaches it, failed or not */
    r->cnt.prog = NULL;
    return rc;
}

/* rank 0: the complete stage from the totals over ranks */
static int stage_finish(encode_run *r, const uint64_t *tot, const double *tmax, double fsum) {
    const dfm_mpi *m = r->m;
    uint64_t N = r->N, B = r->B;
    json_t *outs = json_array();
    for (uint64_t b = 0; b < r->n_blocks; b++) {
        char *name = dfm_emb_block_name(b);
        uint64_t first = b * B, n_rows = N - first < B ? N - first : B;
        json_array_append_new(outs, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)first, "n_rows",
                                              (json_int_t)n_rows));
        free(name);
    }
    double total = dfm_now() - r->t_start;
    json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "chunks", (json_int_t)N, "encoded", (json_int_t)tot[0],
                               "empty", (json_int_t)tot[1], "truncated", (json_int_t)tot[2], "tokens", (json_int_t)tot[3],
                               "blocks_encoded", (json_int_t)tot[4], "blocks_kept", (json_int_t)tot[5]);
    json_object_set_new(counts, "empty_decoded", json_integer((json_int_t)tot[6]));
    json_t *timings = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "decode_s", tmax[0], "tokenize_s", tmax[1], "forward_s",
                                tmax[2], "write_s", tmax[3], "total_s", total, "gflop", fsum * 1e-9);
    json_t *st = dfm_manifest_stage(r->man, "encode");
    json_object_set_new(st, "state", json_string("complete"));
    json_object_set_new(st, "counts", counts);
    json_object_set_new(st, "timings", timings);
    json_object_set_new(st, "outputs", outs);
    json_object_set_new(st, "block_chunks", json_integer((json_int_t)B));
    json_object_set_new(st, "dim", json_integer(dfm_encoder_dim(r->enc)));
    json_object_set_new(st, "dtype", json_string(dfm_emb_dtype_name((uint32_t)r->dtype)));
    json_object_set_new(st, "precision", json_string(dfm_encoder_precision_name(parse_precision(r->o->precision, r->device))));
    json_object_set_new(st, "model", json_pack("{s:s, s:s, s:s}", "path", r->o->model, "hash", r->model_hash, "describe",
                                               dfm_encoder_describe(r->enc)));
    json_object_set_new(st, "dfm_version", json_string(DFM_VERSION));
    DFM_TRY(dfm_manifest_save(r->run, r->man));
    printf("encode: %llu chunks (%llu encoded now, %llu empty, %llu truncated), %llu tokens, %llu blocks (%llu kept) in "
           "%.2fs on %d rank%s: %.1f chunks/s\n",
           (unsigned long long)N, (unsigned long long)tot[0], (unsigned long long)tot[1], (unsigned long long)tot[2],
           (unsigned long long)tot[3], (unsigned long long)r->n_blocks, (unsigned long long)tot[5], total, m->size,
           m->size > 1 ? "s" : "", total > 0 ? tot[0] / total : 0.0);
    return DFM_OK;
}

/* counts and timings over ranks into the manifest */
static int finish(encode_run *r) {
    const dfm_mpi *m = r->m;
    enc_counts *cnt = &r->cnt;
    dfm_encoder_stats es;
    dfm_encoder_get_stats(r->enc, &es);
    uint64_t loc[7] = {cnt->chunks, es.empty, es.truncated, es.tokens, cnt->blocks_done, cnt->blocks_kept, cnt->decode_empty}, tot[7];
    double tl[5] = {cnt->decode_s, es.tokenize_s, es.forward_s, cnt->write_s, es.flops}, tmax[5], fsum = 0;
    DFM_TRY(DFM_MPI_CHECK(MPI_Reduce(loc, tot, 7, MPI_UINT64_T, MPI_SUM, 0, m->comm)));
    DFM_TRY(DFM_MPI_CHECK(MPI_Reduce(tl, tmax, 4, MPI_DOUBLE, MPI_MAX, 0, m->comm)));
    DFM_TRY(DFM_MPI_CHECK(MPI_Reduce(&tl[4], &fsum, 1, MPI_DOUBLE, MPI_SUM, 0, m->comm)));
    return m->rank == 0 ? stage_finish(r, tot, tmax, fsum) : DFM_OK;
}

/* After encode_open: the stage's begin (or skip), blocks and finish, each agreed by all ranks. */
static int encode_stage(encode_run *r, json_t *config) {
    const dfm_mpi *m = r->m;
    r->N = r->cs->n_chunks, r->B = (uint64_t)r->o->block_chunks, r->n_blocks = (r->N + r->B - 1) / r->B;
    snprintf(r->model_hash, sizeof r->model_hash, "%016llx", (unsigned long long)dfm_encoder_model_hash(r->enc));
    json_object_set_new(config, "model_hash", json_string(r->model_hash));
    json_object_set_new(config, "max_len", json_integer(dfm_encoder_max_len(r->enc)));
    /* the precision the vectors are computed in, resolved (auto -> fp32 / fp16): part of the stage contract,
     * so a resume or a re-run under another precision is refused instead of mixing blocks */
    json_object_set_new(config, "precision", json_string(dfm_encoder_precision_name(parse_precision(r->o->precision, r->device))));
    dfm_emb_header hdr = {.dim = (uint32_t)dfm_encoder_dim(r->enc), .dtype = (uint32_t)r->dtype,
                          .model_hash = dfm_encoder_model_hash(r->enc), .tokenizer_hash = dfm_tokenizer_hash(r->lm)};
    int skip = 0, rc = m->rank == 0 ? stage_begin(r, config, &skip) : DFM_OK;
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Bcast(&skip, 1, MPI_INT, 0, m->comm));
    if (rc) return rc;
    if (skip) return DFM_OK;
    if (m->rank == 0)
        DFM_LOG_I("encoding %llu chunks in %llu blocks of %llu on %d rank%s: %s", (unsigned long long)r->N,
                  (unsigned long long)r->n_blocks, (unsigned long long)r->B, m->size, m->size > 1 ? "s" : "",
                  dfm_encoder_describe(r->enc));
    rc = dfm_mpi_agree(m, encode_blocks(r, &hdr));
    if (rc) return rc;
    return dfm_mpi_agree(m, finish(r));
}

/* This rank's GPU: the ranks of a node that all see its G GPUs (mpirun, or Slurm's --gres=gpu:G) take
 * GPU (node-local rank mod G), not all GPU 0. Collective (the node split): every rank calls it. *gpu is
 * the index made current for this thread, which loads and runs the encoder; -1 on the CPU. */
static int select_gpu(const dfm_mpi *m, int device, int *local, int *gpu) {
    *local = dfm_mpi_local_rank(m), *gpu = -1;
#ifdef DFM_HAVE_CUDA
    int n = 0;
    if (device == DFM_DEVICE_CUDA && cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no usable GPU: dfm_encoder_load reports it */
        n = 0;
    }
    int g = dfm_gpu_for_rank(*local, n, -1);
    if (g >= 0) {
        cudaError_t e = cudaSetDevice(g);
        if (e != cudaSuccess)
            return DFM_FAIL(DFM_ECUDA, "cudaSetDevice(%d) for node-local rank %d: %s. HINT: check the GPUs with nvidia-smi",
                            g, *local, cudaGetErrorString(e));
        *gpu = g;
    }
#else
    (void)device;
#endif
    return DFM_OK;
}

int dfm_encode_run(const dfm_mpi *m, const dfm_encode_config *cfg, const char *run, json_t *config) {
    encode_run r;
    memset(&r, 0, sizeof r);
    r.m = m, r.o = cfg, r.run = run;
    r.t_start = dfm_now();
    parse_device(cfg->device, &r.device);
    r.dtype = dfm_emb_dtype_parse(cfg->dtype);
    int rc = r.dtype < 0 ? DFM_FAIL(DFM_EARG, "--dtype %s: use fp32, fp16 or bf16", cfg->dtype ? cfg->dtype : "(none)") : DFM_OK;
    int local, gpu, grc = select_gpu(m, r.device, &local, &gpu); /* collective: before anything can fail */
    if (!rc) rc = grc;
    if (gpu >= 0) DFM_LOG_I("node-local rank %d encodes on visible GPU %d", local, gpu);
    if (!rc) json_object_set_new(config, "dtype", json_string(dfm_emb_dtype_name((uint32_t)r.dtype)));
    if (!rc) rc = encode_open(&r);
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = encode_stage(&r, config);
    dfm_encoder_free(r.enc);
    dfm_tokenizer_free(r.lm);
    dfm_chunk_set_close(r.cs);
    json_decref(r.man);
    return rc;
}
