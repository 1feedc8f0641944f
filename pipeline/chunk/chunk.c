/* chunk.c — the chunk stage (see chunk.h). */
#include "pipeline/chunk/chunk.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/progress.h"
#include "common/stop.h"
#include "common/version.h"
#include "pipeline/chunk/pack.h"
#include "pipeline/corpus/corpus.h"
#include "tokenizer/tokenizer.h"
#include "schemas/chunk_shard.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- this rank's flagged token stream ----
 * The stream lives in a window of at most o->window_tokens tokens; each time the window fills it is
 * appended to the spill file RUN/chunk/.stream-RRRRR.tmp (created on the first overflow). So the
 * rank's memory does not grow with its share of the corpus: stream position p < n - wn is in the
 * file, the rest in win. */
typedef struct {
    const dfm_chunk_config *o;
    const dfm_tokenizer *tok;
    uint32_t eos, pad;
    uint32_t *win;      /* the newest flagged tokens */
    size_t wn, wcap;    /* tokens in win, and its size */
    uint64_t n;         /* tokens in the stream (spilled + in win) */
    uint64_t doc_starts, pads; /* DFM_TOK_DOCSTART and DFM_TOK_PAD tokens pushed */
    char *spill_path;   /* the spill file, NULL until the window first overflows */
    FILE *spill;
    /* pending text documents, tokenized together in parallel */
    char **btext;
    size_t *blen;
    int bn, bcap;
    size_t bbytes;
    int last_file, last_was_tokens;
    uint64_t docs, utf8_replaced, share_bytes;
    dfm_read_opts *ro;
    dfm_progress *prog;
} chunk_ctx;

/* append the full window to the spill file */
static int spill_window(chunk_ctx *c) {
    if (!c->spill) {
        c->spill = fopen(c->spill_path, "wb+");
        if (!c->spill) return DFM_FAIL(DFM_EIO, "cannot create %s: %s. HINT: the chunk stage spills each rank's tokens beyond --window-tokens there; check space and permissions", c->spill_path, strerror(errno));
    }
    if (fwrite(c->win, sizeof *c->win, c->wn, c->spill) != c->wn)
        return DFM_FAIL(DFM_EIO, "writing %s: %s. HINT: free disk space (4 bytes per token of this rank's share)", c->spill_path, strerror(errno));
    c->wn = 0;
    return DFM_OK;
}

static int push(chunk_ctx *c, uint32_t v) {
    if (c->wn == c->wcap) DFM_TRY(spill_window(c));
    c->win[c->wn++] = v;
    c->n++;
    c->doc_starts += (v & DFM_TOK_DOCSTART) != 0;
    c->pads += (v & DFM_TOK_PAD) != 0;
    return DFM_OK;
}

/* stream positions [pos, pos + cnt) of this rank into out */
static int stream_read(chunk_ctx *c, uint64_t pos, uint64_t cnt, uint32_t *out) {
    uint64_t in_file = c->n - c->wn;
    if (pos < in_file) {
        uint64_t k = cnt < in_file - pos ? cnt : in_file - pos;
        size_t want = (size_t)k * sizeof *out, got = 0;
        while (got < want) {
            ssize_t r = pread(fileno(c->spill), (char *)out + got, want - got, (off_t)(pos * sizeof *out + got));
            if (r <= 0) return DFM_FAIL(DFM_EIO, "reading %s at token %llu: %s", c->spill_path, (unsigned long long)pos, r ? strerror(errno) : "file ends early");
            got += (size_t)r;
        }
        pos += k, out += k, cnt -= k;
    }
    if (cnt) memcpy(out, c->win + (pos - in_file), (size_t)cnt * sizeof *out);
    return DFM_OK;
}

/* doc-aligned mode: every document starts on a chunk boundary of the rank's stream, and every
 * rank's stream starts on one globally, so padding the local stream to L pads the document. */
static int pad_to_chunk(chunk_ctx *c) {
    uint64_t pad = dfm_pack_doc_pad(c->n, (uint64_t)c->o->chunk_len);
    for (uint64_t i = 0; i < pad; i++) DFM_TRY(push(c, c->pad | DFM_TOK_PAD));
    return DFM_OK;
}

static int flush_text(chunk_ctx *c) {
    if (c->bn == 0) return DFM_OK;
    dfm_ids *ids = calloc((size_t)c->bn, sizeof *ids);
    size_t *repl = calloc((size_t)c->bn, sizeof *repl);
    int *rcs = calloc((size_t)c->bn, sizeof *rcs);
    if (!ids || !repl || !rcs) {
        free(ids); free(repl); free(rcs);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)c->o->threads)
    for (int i = 0; i < c->bn; i++) rcs[i] = dfm_tokenizer_encode(c->tok, c->btext[i], c->blen[i], &ids[i], &repl[i]);
    int rc = DFM_OK;
    for (int i = 0; i < c->bn && !rc; i++) {
        if (rcs[i]) {
            rc = DFM_FAIL(rcs[i], "tokenizing a document failed (%s)", dfm_strerror(rcs[i]));
            break;
        }
        /* the text's ids and the separator split as a .bin's tokens are: a document ends after every
         * EOS, so a literal EOS string in the text (matched as the special token, as HF does by
         * default) ends a document there too */
        for (size_t k = 0; k <= ids[i].n && !rc; k++) {
            uint32_t t = k < ids[i].n ? ids[i].ids[k] : c->eos;
            int start = k == 0 || ids[i].ids[k - 1] == c->eos;
            rc = push(c, t | (start ? DFM_TOK_DOCSTART : 0));
            c->docs += start;
            if (!rc && c->o->doc_aligned && t == c->eos) rc = pad_to_chunk(c);
        }
        c->utf8_replaced += repl[i];
    }
    for (int i = 0; i < c->bn; i++) {
        dfm_ids_free(&ids[i]);
        free(c->btext[i]);
    }
    free(ids); free(repl); free(rcs);
    c->bn = 0;
    c->bbytes = 0;
    dfm_progress_update(c->prog, c->ro->bytes_read);
    return rc;
}

/* doc-aligned pretokenized input: a file's last document ends at the end of the file */
static int end_token_file(chunk_ctx *c) {
    if (!c->last_was_tokens || !c->o->doc_aligned) return DFM_OK;
    return pad_to_chunk(c);
}

static int on_doc(const dfm_doc *d, void *user) {
    chunk_ctx *c = user;
    DFM_TRY(dfm_stop_check("while tokenizing (the chunk stage writes its shards only at the end: it starts over)"));
    if (d->file != c->last_file) {
        DFM_TRY(flush_text(c));
        DFM_TRY(end_token_file(c));
        c->last_file = d->file;
        c->last_was_tokens = 0;
    }
    if (d->tokens) {
        DFM_TRY(flush_text(c));
        c->last_was_tokens = 1;
        for (size_t i = 0; i < d->n_tokens; i++) {
            uint32_t t = d->tokens[i] | ((i == 0 && d->new_document) ? DFM_TOK_DOCSTART : 0);
            DFM_TRY(push(c, t));
            if (c->o->doc_aligned && d->tokens[i] == c->eos) DFM_TRY(pad_to_chunk(c)); /* a document ends at EOS */
        }
        if (d->new_document) c->docs++;
        return DFM_OK;
    }
    if (c->bn == c->bcap) {
        int nc = c->bcap ? c->bcap * 2 : 256;
        char **t = realloc(c->btext, (size_t)nc * sizeof *t);
        if (t) c->btext = t;
        size_t *l = realloc(c->blen, (size_t)nc * sizeof *l);
        if (l) c->blen = l;
        if (!t || !l) return DFM_FAIL(DFM_ENOMEM, "no memory");
        c->bcap = nc;
    }
    c->btext[c->bn] = malloc(d->text_len ? d->text_len : 1);
    if (!c->btext[c->bn]) return DFM_FAIL(DFM_ENOMEM, "no memory");
    memcpy(c->btext[c->bn], d->text, d->text_len);
    c->blen[c->bn++] = d->text_len;
    c->bbytes += d->text_len;
    if (c->bn >= 4096 || c->bbytes >= (8u << 20)) return flush_text(c);
    return DFM_OK;
}

/* inputs with sizes and hashes; hashing is spread over ranks */
static int hash_inputs(const dfm_mpi *m, const dfm_input_list *in, json_t **out) {
    char *hashes = calloc((size_t)in->n, 33);
    char *all = calloc((size_t)in->n, 33);
    int rc = (!hashes || !all) ? DFM_FAIL(DFM_ENOMEM, "no memory") : DFM_OK;
    for (int i = 0; i < in->n && !rc; i++)
        if (i % m->size == m->rank) rc = dfm_file_hash(in->files[i].path, hashes + 33 * i);
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Allreduce(hashes, all, in->n * 33, MPI_CHAR, MPI_BOR, m->comm));
    if (!rc) {
        *out = json_array();
        for (int i = 0; i < in->n; i++)
            json_array_append_new(*out, json_pack("{s:s, s:I, s:s}", "path", in->files[i].path, "bytes",
                                                  (json_int_t)in->files[i].bytes, "xxh128", all + 33 * i));
    }
    free(hashes);
    free(all);
    return rc;
}

static void remove_old_shards(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "chunks-", 7) != 0 && strncmp(e->d_name, ".stream-", 8) != 0) continue; /* shards, stale spill files */
        char *p = dfm_path_join(dir, e->d_name);
        if (p) unlink(p);
        free(p);
    }
    closedir(d);
}

/* The flagged tokens of the range [A, A + owned_len) this rank owns, in order: its own stream from
 * the end of its head on, then the tokens received from later ranks, then padding (on the rank that
 * owns the last sequence). */
typedef struct {
    chunk_ctx *c;
    uint64_t pos;          /* next position in c's stream */
    const uint32_t *recv;  /* tokens from later ranks */
    uint64_t n_recv, recv_pos;
} owned_src;

static int owned_next(owned_src *s, uint32_t *out, uint64_t cnt) {
    uint64_t k = s->pos < s->c->n ? s->c->n - s->pos : 0;
    if (k > cnt) k = cnt;
    if (k) DFM_TRY(stream_read(s->c, s->pos, k, out));
    s->pos += k, out += k, cnt -= k;
    k = s->n_recv - s->recv_pos < cnt ? s->n_recv - s->recv_pos : cnt;
    memcpy(out, s->recv + s->recv_pos, (size_t)k * sizeof *out);
    s->recv_pos += k, out += k, cnt -= k;
    for (uint64_t i = 0; i < cnt; i++) out[i] = s->c->pad | DFM_TOK_PAD;
    return DFM_OK;
}

/* Write this rank's owned chunks: the len flagged tokens of [A, A + len) from src, read a block of
 * about 2 MB at a time. */
static int write_shard(const char *path, const dfm_chunk_config *o, const dfm_tokenizer *tok, uint32_t eos, uint32_t pad,
                       owned_src *src, uint64_t len, uint64_t A, uint64_t doc_before, uint64_t *n_chunks_out) {
    uint64_t L = (uint64_t)o->chunk_len, per_seq = (uint64_t)(o->seq_len / o->chunk_len);
    dfm_chunk_header h = {0};
    h.chunk_len = (uint32_t)L;
    h.seq_len = (uint32_t)o->seq_len;
    h.flags = o->doc_aligned ? DFM_CHUNK_F_DOC_ALIGNED : 0;
    h.first_chunk = A / L;
    h.vocab_size = dfm_tokenizer_vocab_size(tok);
    h.tokenizer_hash = dfm_tokenizer_hash(tok);
    h.eos_id = eos;
    h.pad_id = pad;
    dfm_chunk_writer *w = NULL;
    DFM_TRY(dfm_chunk_writer_open(path, &h, &w));
    uint64_t blk = (1u << 19) / L ? (1u << 19) / L : 1; /* chunks per block read from src */
    uint32_t *toks = malloc(L * sizeof *toks), *buf = malloc(blk * L * sizeof *buf);
    if (!toks || !buf) {
        free(toks), free(buf);
        dfm_chunk_writer_abort(w);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    uint64_t cur = doc_before; /* doc starts at positions < current */
    int rc = DFM_OK;
    uint64_t nc = len / L;
    for (uint64_t c = 0; c < nc && !rc; c++) {
        if (c % blk == 0 && (rc = owned_next(src, buf, (nc - c < blk ? nc - c : blk) * L))) break;
        const uint32_t *stream = buf + (c % blk) * L;
        dfm_chunk_meta m = {0};
        int seen_valid = 0;
        for (uint64_t j = 0; j < L; j++) {
            uint32_t t = stream[j];
            if (t & DFM_TOK_DOCSTART) {
                cur++;
                m.flags |= DFM_CHUNK_DOC_START;
            }
            toks[j] = t & DFM_TOK_ID_MASK;
            if (!(t & DFM_TOK_PAD)) {
                uint64_t doc = cur ? cur - 1 : 0;
                if (!seen_valid) m.doc_first = doc;
                m.doc_last = doc;
                seen_valid = 1;
                m.n_valid = (uint16_t)(j + 1);
            }
        }
        if (!seen_valid) m.doc_first = m.doc_last = cur ? cur - 1 : 0;
        if (((A / L) + c) % per_seq == 0) m.flags |= DFM_CHUNK_SEQ_START;
        rc = dfm_chunk_writer_add(w, &m, toks);
    }
    free(toks);
    free(buf);
    if (rc) {
        dfm_chunk_writer_abort(w);
        return rc;
    }
    *n_chunks_out = nc;
    return dfm_chunk_writer_close(w);
}

/* ---- one run's phases ---- */
typedef struct {
    const dfm_mpi *m;
    const dfm_chunk_config *o;
    const char *run;
    dfm_tokenizer *tok;
    json_t *man, *inputs_json;
    dfm_input_list in;
    char *chunk_dir;
    chunk_ctx c;
    dfm_read_opts ro;
    uint32_t *recv;    /* tokens from later ranks that complete this rank's last sequence (< S) */
    uint64_t n_recv, head;
    uint64_t N;        /* tokens in the global stream */
    uint64_t A, owned_len, doc_base, n_docs, pads_local, my_chunks;
    double t_start, t_tok, t_xchg, t_write;
} chunk_run;

/* EOS and padding ids (flags, else the tokenizer's), recorded in config so the manifest says which were used */
static int resolve_ids(chunk_run *r, json_t *config) {
    const dfm_chunk_config *o = r->o;
    int rc = DFM_OK;
    int64_t eos = o->eos_id >= 0 ? o->eos_id : dfm_tokenizer_eos_id(r->tok);
    uint32_t vocab = dfm_tokenizer_vocab_size(r->tok);
    if (eos < 0) rc = DFM_FAIL(DFM_EARG, "tokenizer %s has no known EOS token. HINT: pass --eos-id", o->tokenizer);
    else if ((uint64_t)eos >= vocab || (o->pad_id >= 0 && (uint64_t)o->pad_id >= vocab))
        rc = DFM_FAIL(DFM_ERANGE, "--eos-id/--pad-id outside the vocabulary (%u ids)", vocab);
    else if (vocab > DFM_TOK_ID_MASK)
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "vocabularies over 2^30 ids are not supported");
    r->c.eos = (uint32_t)eos;
    r->c.pad = o->pad_id >= 0 ? (uint32_t)o->pad_id : r->c.eos;
    if (!rc) {
        json_object_set_new(config, "eos-id", json_integer(r->c.eos));
        json_object_set_new(config, "pad-id", json_integer(r->c.pad));
        json_object_set_new(config, "tokenizer_hash", json_sprintf("%016llx", (unsigned long long)dfm_tokenizer_hash(r->tok)));
    }
    return rc;
}

/* rank 0: the stage contract (common/manifest.h); chunking restarts rather than resumes (cheap next to encode) */
static int stage_begin(chunk_run *r, json_t *config, int *skip) {
    DFM_TRY(dfm_mkdir_p(r->chunk_dir));
    DFM_TRY(dfm_manifest_load(r->run, 1, &r->man));
    dfm_stage_spec spec = {"chunk", config, r->inputs_json, r->o->force, r->m->size, .file_ok = dfm_chunk_shard_check};
    dfm_stage_action act;
    DFM_TRY(dfm_stage_begin(r->man, r->run, &spec, &act));
    *skip = act == DFM_STAGE_SKIP;
    if (!*skip) remove_old_shards(r->chunk_dir);
    return DFM_OK;
}

/* 1. read and tokenize this rank's share into r->c.stream */
static int read_share(chunk_run *r) {
    const dfm_mpi *m = r->m;
    chunk_ctx *c = &r->c;
    c->o = r->o;
    c->tok = r->tok;
    c->ro = &r->ro;
    c->last_file = -1;
    char name[64];
    snprintf(name, sizeof name, ".stream-%05d.tmp", m->rank);
    c->wcap = (size_t)r->o->window_tokens;
    c->win = malloc(c->wcap * sizeof *c->win);
    c->spill_path = dfm_path_join(r->chunk_dir, name);
    if (!c->win || !c->spill_path) return DFM_FAIL(DFM_ENOMEM, "no memory for a window of %zu tokens. HINT: lower --window-tokens", c->wcap);
    uint64_t lo = (uint64_t)((unsigned __int128)r->in.total_bytes * (unsigned)m->rank / (unsigned)m->size);
    uint64_t hi = (uint64_t)((unsigned __int128)r->in.total_bytes * (unsigned)(m->rank + 1) / (unsigned)m->size);
    dfm_progress_begin(m, "chunk", "bytes", hi - lo, &c->prog);
    if (r->o->doc_aligned) /* pretokenized files stay whole so every rank starts on a chunk boundary */
        for (int i = 0; i < r->in.n; i++)
            if (r->in.files[i].kind == DFM_IN_TOKENS) r->in.files[i].whole = 1;
    int rc = dfm_corpus_read_share(&r->in, m->rank, m->size, &r->ro, on_doc, c);
    if (!rc) rc = flush_text(c);
    if (!rc) rc = end_token_file(c);
    if (!rc)
        DFM_LOG_D("chunk: this rank's share: %llu documents, %llu bytes read", (unsigned long long)c->docs,
                  (unsigned long long)r->ro.bytes_read);
    if (!rc && c->spill && fflush(c->spill) != 0) rc = DFM_FAIL(DFM_EIO, "writing %s: %s", c->spill_path, strerror(errno));
    for (int i = 0; i < c->bn; i++) free(c->btext[i]);
    dfm_progress_end(c->prog);
    return rc;
}

/* 2a. global offsets: this rank's *off in the stream of r->N tokens, documents before it, and every
 * rank's (offs, lens) */
static int global_offsets(chunk_run *r, uint64_t *off, uint64_t *offs, uint64_t *lens) {
    const dfm_mpi *m = r->m;
    r->pads_local = r->c.pads;
    DFM_TRY(dfm_mpi_exscan_u64(m, r->c.n, off, &r->N));
    DFM_TRY(dfm_mpi_exscan_u64(m, r->c.doc_starts, &r->doc_base, &r->n_docs));
    if (r->N == 0)
        return DFM_FAIL(DFM_EFORMAT, "the inputs hold no text (0 tokens after %llu empty and %llu bad documents)",
                        (unsigned long long)r->ro.empty_docs, (unsigned long long)r->ro.bad_lines);
    uint64_t n64 = r->c.n;
    DFM_TRY(DFM_MPI_CHECK(MPI_Allgather(off, 1, MPI_UINT64_T, offs, 1, MPI_UINT64_T, m->comm)));
    return DFM_MPI_CHECK(MPI_Allgather(&n64, 1, MPI_UINT64_T, lens, 1, MPI_UINT64_T, m->comm));
}

/* 2b. the head exchange: each rank sends the tokens before its first sequence start (fewer than S)
 * to the owner of that sequence, which keeps what it receives in r->recv; r->A and r->owned_len
 * give the range this rank owns (its last sequence padded to S if it is the corpus's last) */
static int head_exchange(chunk_run *r, uint64_t off, const uint64_t *offs, const uint64_t *lens, int *scnt, int *sdsp,
                         int *rcnt, int *rdsp) {
    const dfm_mpi *m = r->m;
    chunk_ctx *c = &r->c;
    uint64_t S = (uint64_t)r->o->seq_len, E = 0, N = r->N;
    int rc = DFM_OK;
    uint64_t head = dfm_pack_head(off, c->n, S);
    uint32_t *hbuf = NULL;
    if (head) {
        int dest = dfm_pack_owner(offs, lens, m->size, S, off / S);
        if (dest < 0 || dest == m->rank) rc = DFM_FAIL(DFM_EINTERNAL, "no owner for sequence %llu", (unsigned long long)(off / S));
        else scnt[dest] = (int)head;
        if (!rc && !(hbuf = malloc(head * sizeof *hbuf))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) rc = stream_read(c, 0, head, hbuf);
    }
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Alltoall(scnt, 1, MPI_INT, rcnt, 1, MPI_INT, m->comm));
    dfm_pack_owned(off, c->n, S, &r->A, &E);
    uint64_t recv_total = 0;
    for (int q = 0; !rc && q < m->size; q++) {
        rdsp[q] = (int)recv_total;
        recv_total += (uint64_t)rcnt[q];
    }
    uint64_t have = c->n > head ? c->n - head : 0; /* own tokens from A on */
    r->owned_len = E - r->A;
    if (!rc && have + recv_total > r->owned_len)
        rc = DFM_FAIL(DFM_EINTERNAL, "rank holds %llu tokens for a %llu-token owned range", (unsigned long long)(have + recv_total),
                      (unsigned long long)r->owned_len);
    if (!rc && !(r->recv = malloc((recv_total ? recv_total : 1) * sizeof *r->recv))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    rc = dfm_mpi_agree(m, rc);
    uint32_t none = 0;
    if (!rc) rc = DFM_MPI_CHECK(MPI_Alltoallv(hbuf ? hbuf : &none, scnt, sdsp, MPI_UINT32_T, r->recv, rcnt, rdsp, MPI_UINT32_T, m->comm));
    if (!rc) {
        r->n_recv = recv_total;
        r->head = head;
        uint64_t filled = have + recv_total;
        if (E > N && E > r->A) { /* this rank owns the last sequence: padded to S as the shard is written */
            if (r->A + filled != N) rc = DFM_FAIL(DFM_EINTERNAL, "last sequence has %llu of %llu tokens", (unsigned long long)(r->A + filled), (unsigned long long)N);
            r->pads_local += r->owned_len - filled;
        } else if (filled != r->owned_len) {
            rc = DFM_FAIL(DFM_EINTERNAL, "owned range has %llu of %llu tokens", (unsigned long long)filled, (unsigned long long)r->owned_len);
        }
    }
    /* documents started before A: those of earlier ranks plus this rank's head */
    for (uint64_t i = 0; !rc && i < head; i++) r->doc_base += (hbuf[i] & DFM_TOK_DOCSTART) != 0;
    free(hbuf);
    return rc;
}

/* 2. offsets and the head exchange */
static int exchange(chunk_run *r) {
    int P = r->m->size;
    uint64_t off = 0, *offs = calloc((size_t)P, sizeof *offs), *lens = calloc((size_t)P, sizeof *lens);
    int *scnt = calloc((size_t)P, sizeof(int)), *sdsp = calloc((size_t)P, sizeof(int));
    int *rcnt = calloc((size_t)P, sizeof(int)), *rdsp = calloc((size_t)P, sizeof(int));
    int rc = global_offsets(r, &off, offs, lens);
    if (!rc && (!offs || !lens || !scnt || !sdsp || !rcnt || !rdsp)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = head_exchange(r, off, offs, lens, scnt, sdsp, rcnt, rdsp);
    free(scnt), free(sdsp), free(rcnt), free(rdsp), free(offs), free(lens);
    return rc;
}

/* 3. this rank's shard RUN/chunk/chunks-RRRRR.bin */
static int write_own_shard(chunk_run *r) {
    char name[64];
    snprintf(name, sizeof name, "chunks-%05d.bin", r->m->rank);
    char *path = dfm_path_join(r->chunk_dir, name);
    owned_src src = {.c = &r->c, .pos = r->head, .recv = r->recv, .n_recv = r->n_recv};
    int rc = path ? write_shard(path, r->o, r->tok, r->c.eos, r->c.pad, &src, r->owned_len, r->A, r->doc_base, &r->my_chunks)
                  : DFM_FAIL(DFM_ENOMEM, "no memory");
    free(path);
    return rc;
}

/* rank 0: the complete stage (counts over ranks in tot, each rank's first chunk and count in all) */
static int stage_finish(chunk_run *r, const uint64_t *tot, const uint64_t *all, const double *tmax) {
    const dfm_chunk_config *o = r->o;
    const dfm_mpi *m = r->m;
    uint64_t N = r->N, S = (uint64_t)o->seq_len, seqs = dfm_ceil_div(N, S);
    uint64_t chunks = seqs * (S / (uint64_t)o->chunk_len);
    json_t *outs = json_array();
    for (int q = 0; q < m->size; q++) {
        char name[64];
        snprintf(name, sizeof name, "chunk/chunks-%05d.bin", q);
        json_array_append_new(outs, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)all[2 * q],
                                              "n_chunks", (json_int_t)all[2 * q + 1]));
    }
    json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "documents", (json_int_t)r->n_docs,
                               "tokens", (json_int_t)(seqs * S - tot[4]), "stream_tokens", (json_int_t)N, "pad_tokens",
                               (json_int_t)tot[4], "chunks", (json_int_t)chunks, "sequences", (json_int_t)seqs, "bad_lines",
                               (json_int_t)tot[1], "empty_documents", (json_int_t)tot[2], "utf8_replacements", (json_int_t)tot[3],
                               "bytes_read", (json_int_t)tot[5]);
    json_t *timings = json_pack("{s:f, s:f, s:f, s:f}", "tokenize_s", tmax[0], "exchange_s", tmax[1], "write_s", tmax[2],
                                "total_s", dfm_now() - r->t_start);
    json_t *st = dfm_manifest_stage(r->man, "chunk");
    json_object_set_new(st, "state", json_string("complete"));
    json_object_set_new(st, "counts", counts);
    json_object_set_new(st, "timings", timings);
    json_object_set_new(st, "outputs", outs);
    json_object_set_new(st, "tokenizer", json_pack("{s:s, s:I, s:s}", "path", o->tokenizer, "vocab_size",
                                                   (json_int_t)dfm_tokenizer_vocab_size(r->tok), "describe",
                                                   dfm_tokenizer_describe(r->tok)));
    json_object_set_new(st, "dfm_version", json_string(DFM_VERSION));
    DFM_TRY(dfm_manifest_save(r->run, r->man));
    printf("chunk: %llu documents, %llu tokens, %llu chunks of %lld tokens in %llu sequences of %lld; %llu bad, %llu empty; %.2fs on %d rank%s\n",
           (unsigned long long)r->n_docs, (unsigned long long)json_integer_value(json_object_get(counts, "tokens")),
           (unsigned long long)chunks, (long long)o->chunk_len, (unsigned long long)seqs, (long long)o->seq_len,
           (unsigned long long)tot[1], (unsigned long long)tot[2], dfm_now() - r->t_start, m->size, m->size > 1 ? "s" : "");
    return DFM_OK;
}

/* 4. counts and timings over ranks into the manifest */
static int finish(chunk_run *r) {
    const dfm_mpi *m = r->m;
    uint64_t loc[6] = {r->c.docs, r->ro.bad_lines, r->ro.empty_docs, r->c.utf8_replaced, r->pads_local, r->ro.bytes_read}, tot[6];
    uint64_t mine[2] = {r->A / (uint64_t)r->o->chunk_len, r->my_chunks}, *all = calloc(2 * (size_t)m->size, sizeof(uint64_t));
    int rc = all ? DFM_MPI_CHECK(MPI_Reduce(loc, tot, 6, MPI_UINT64_T, MPI_SUM, 0, m->comm)) : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = DFM_MPI_CHECK(MPI_Gather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, 0, m->comm));
    double tt[3] = {r->t_tok, r->t_xchg, r->t_write}, tmax[3];
    if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(tt, tmax, 3, MPI_DOUBLE, MPI_MAX, 0, m->comm));
    if (!rc && m->rank == 0) rc = stage_finish(r, tot, all, tmax);
    free(all);
    return rc;
}

/* The phases, each closed by an agreement of all ranks. */
static int run_phases(chunk_run *r) {
    const dfm_mpi *m = r->m;
    r->ro = (dfm_read_opts){.text_field = r->o->text_field, .skip_bad = r->o->skip_bad,
                            .max_doc_bytes = r->o->max_doc_bytes > 0 ? (uint64_t)r->o->max_doc_bytes : 0,
                            .vocab_size = dfm_tokenizer_vocab_size(r->tok), .eos_id = r->c.eos};
    int rc = read_share(r);
    r->t_tok = dfm_now() - r->t_start;
    dfm_fault_point("chunk:tokenized", m->rank);
    rc = dfm_mpi_agree(m, rc);
    double t1 = dfm_now();
    if (!rc) rc = exchange(r);
    r->t_xchg = dfm_now() - t1;
    if (!rc) rc = dfm_stop_check("after tokenizing, before writing the chunk shards (the chunk stage starts over)");
    rc = dfm_mpi_agree(m, rc);
    double t2 = dfm_now();
    if (!rc) rc = write_own_shard(r);
    r->t_write = dfm_now() - t2;
    dfm_fault_point("chunk:shard-written", m->rank);
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = finish(r);
    return dfm_mpi_agree(m, rc);
}

int dfm_chunk_run(const dfm_mpi *m, const dfm_chunk_config *cfg, const char *run, char **inputs, int n_inputs,
                  json_t *config) {
    dfm_chunk_config o = *cfg;
    if (o.threads < 1) o.threads = 1;
    if (o.window_tokens < 1) o.window_tokens = DFM_CHUNK_WINDOW_TOKENS;
    chunk_run r;
    memset(&r, 0, sizeof r);
    r.m = m, r.o = &o, r.run = run;
    r.t_start = dfm_now();
    int rc = DFM_OK;
    if (o.chunk_len < 1 || o.seq_len < o.chunk_len || o.seq_len % o.chunk_len)
        rc = DFM_FAIL(DFM_EARG, "--seq-len %lld must be a positive multiple of --chunk-len %lld", (long long)o.seq_len, (long long)o.chunk_len);
    if (!rc) rc = dfm_tokenizer_load(o.tokenizer, &r.tok);
    if (!rc) rc = resolve_ids(&r, config);
    if (!rc) rc = dfm_inputs_expand(inputs, n_inputs, &r.in);
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = hash_inputs(m, &r.in, &r.inputs_json);
    if (!rc && !(r.chunk_dir = dfm_path_join(run, "chunk"))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    int skip = 0;
    if (!rc && m->rank == 0) rc = stage_begin(&r, config, &skip);
    rc = dfm_mpi_agree(m, rc);
    if (!rc) MPI_Bcast(&skip, 1, MPI_INT, 0, m->comm);
    if (!rc && !skip) rc = run_phases(&r);
    free(r.recv);
    free(r.c.win);
    if (r.c.spill) {
        fclose(r.c.spill);
        unlink(r.c.spill_path);
    }
    free(r.c.spill_path);
    free(r.c.btext);
    free(r.c.blen);
    free(r.chunk_dir);
    json_decref(r.man);
    json_decref(r.inputs_json);
    dfm_inputs_free(&r.in);
    dfm_tokenizer_free(r.tok);
    return rc;
}
