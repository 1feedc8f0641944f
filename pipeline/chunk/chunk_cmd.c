/* `dfm chunk RUN INPUT...` — tokenize a corpus with the LM tokenizer and cut it into chunks.
 *
 * Phases (all ranks): read and tokenize this rank's share of the inputs (corpus.h) into a flagged
 * token stream (pack.h); agree on global offsets (prefix scan); send each rank's head to the owner
 * of the sequence it belongs to (one Alltoallv); write one chunk shard per rank; rank 0 records the
 * stage in RUN/manifest.json. Chunk ids and contents do not depend on the number of ranks.
 */
#include "pipeline/chunk/pack.h"
#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "common/progress.h"
#include "pipeline/corpus/corpus.h"
#include "pipeline/tokenizer/tokenizer.h"
#include "schemas/chunk_shard.h"
#include "common/version.h"

#include <dirent.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *tokenizer, *text_field;
    int64_t chunk_len, seq_len, threads, eos_id, pad_id;
    int doc_aligned, skip_bad, force;
} chunk_opts;

typedef struct {
    const chunk_opts *o;
    const dfm_tokenizer *tok;
    uint32_t eos, pad;
    uint32_t *stream; /* flagged tokens of this rank, in order */
    size_t n, cap;
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

static int push(chunk_ctx *c, uint32_t v) {
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : (1u << 20);
        uint32_t *s = realloc(c->stream, nc * sizeof *s);
        if (!s) return DFM_FAIL(DFM_ENOMEM, "no memory for %zu tokens on this rank. HINT: use more ranks", nc);
        c->stream = s;
        c->cap = nc;
    }
    c->stream[c->n++] = v;
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
        for (size_t k = 0; k < ids[i].n && !rc; k++) rc = push(c, ids[i].ids[k] | (k == 0 ? DFM_TOK_DOCSTART : 0));
        if (!rc) rc = push(c, c->eos | (ids[i].n == 0 ? DFM_TOK_DOCSTART : 0));
        if (!rc && c->o->doc_aligned) rc = pad_to_chunk(c);
        c->utf8_replaced += repl[i];
        c->docs++;
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
        if (strncmp(e->d_name, "chunks-", 7) != 0) continue;
        char *p = dfm_path_join(dir, e->d_name);
        if (p) unlink(p);
        free(p);
    }
    closedir(d);
}

/* Write this rank's owned chunks. stream holds the flagged tokens of [A, A + len). */
static int write_shard(const char *path, const chunk_opts *o, const dfm_tokenizer *tok, uint32_t eos, uint32_t pad,
                       const uint32_t *stream, uint64_t len, uint64_t A, uint64_t doc_before, uint64_t *n_chunks_out) {
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
    uint32_t *toks = malloc(L * sizeof *toks);
    if (!toks) {
        dfm_chunk_writer_abort(w);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    uint64_t cur = doc_before; /* doc starts at positions < current */
    int rc = DFM_OK;
    uint64_t nc = len / L;
    for (uint64_t c = 0; c < nc && !rc; c++) {
        dfm_chunk_meta m = {0};
        int seen_valid = 0;
        for (uint64_t j = 0; j < L; j++) {
            uint32_t t = stream[c * L + j];
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
    if (rc) {
        dfm_chunk_writer_abort(w);
        return rc;
    }
    *n_chunks_out = nc;
    return dfm_chunk_writer_close(w);
}

int dfm_cmd_chunk(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    chunk_opts o;
    dfm_opt table[] = {
        {"tokenizer", DFM_OPT_STR, &o.tokenizer, getenv("DFM_TOKENIZER"), "FILE", "the LM's Hugging Face tokenizer.json (env DFM_TOKENIZER)", 0},
        {"chunk-len", DFM_OPT_INT, &o.chunk_len, "32", "L", "tokens per chunk", 0, .min = "1", .max = "4096"},
        {"seq-len", DFM_OPT_INT, &o.seq_len, "1024", "S", "tokens per training sequence, a multiple of L", 0},
        {"text-field", DFM_OPT_STR, &o.text_field, "text", "NAME", "JSONL field holding the text", 0},
        {"doc-aligned", DFM_OPT_FLAG, &o.doc_aligned, NULL, NULL, "pad every document to a chunk boundary (padding masked)", 0},
        {"skip-bad-lines", DFM_OPT_FLAG, &o.skip_bad, NULL, NULL, "count and skip malformed lines/documents instead of failing", 0},
        {"eos-id", DFM_OPT_INT, &o.eos_id, "-1", "ID", "document separator (default: the tokenizer's EOS)", 0},
        {"pad-id", DFM_OPT_INT, &o.pad_id, "-1", "ID", "padding token (default: EOS)", 0},
        {"threads", DFM_OPT_INT, &o.threads, "1", "N", "tokenizer threads per rank", 1},
        {"force", DFM_OPT_FLAG, &o.force, NULL, NULL, "redo the stage even if the manifest says it is complete, or differs", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL, *man = NULL, *inputs_json = NULL;
    dfm_tokenizer *tok = NULL;
    dfm_input_list in = {0};
    chunk_ctx c = {0};
    uint32_t *owned = NULL;
    uint64_t *offs = NULL, *lens = NULL;
    char *run = NULL, *chunk_dir = NULL, *shard_path = NULL;
    int rc = dfm_opts_parse("chunk", "RUN INPUT...",
                            "Tokenize INPUT files (JSONL, text, llm.c .bin token shards; .zst compressed too) with the LM "
                            "tokenizer, pack them into sequences of S tokens and cut them into chunks of L tokens, written "
                            "to RUN/chunk/ with the stage recorded in RUN/manifest.json. Run under mpirun for several ranks.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        dfm_mpi_finalize();
        return 0;
    }
    double t_start = dfm_now(), t_tok = 0, t_xchg = 0, t_write = 0;
    if (!rc && npos < 2) rc = DFM_FAIL(DFM_EARG, "usage: dfm chunk RUN INPUT... (see --help)");
    if (!rc && !o.tokenizer) rc = DFM_FAIL(DFM_EARG, "no tokenizer: pass --tokenizer FILE (a Hugging Face tokenizer.json) or set DFM_TOKENIZER");
    if (!rc && (o.seq_len < o.chunk_len || o.seq_len % o.chunk_len))
        rc = DFM_FAIL(DFM_EARG, "--seq-len %lld must be a positive multiple of --chunk-len %lld", (long long)o.seq_len, (long long)o.chunk_len);
    if (!rc && o.threads < 1) o.threads = 1;
    if (!rc) run = pos[0];
    if (!rc) rc = dfm_tokenizer_load(o.tokenizer, &tok);
    if (!rc) {
        int64_t eos = o.eos_id >= 0 ? o.eos_id : dfm_tokenizer_eos_id(tok);
        if (eos < 0) rc = DFM_FAIL(DFM_EARG, "tokenizer %s has no known EOS token. HINT: pass --eos-id", o.tokenizer);
        else if ((uint64_t)eos >= dfm_tokenizer_vocab_size(tok) || (o.pad_id >= 0 && (uint64_t)o.pad_id >= dfm_tokenizer_vocab_size(tok)))
            rc = DFM_FAIL(DFM_ERANGE, "--eos-id/--pad-id outside the vocabulary (%u ids)", dfm_tokenizer_vocab_size(tok));
        else if (dfm_tokenizer_vocab_size(tok) > DFM_TOK_ID_MASK)
            rc = DFM_FAIL(DFM_EUNSUPPORTED, "vocabularies over 2^30 ids are not supported");
        c.eos = (uint32_t)eos;
        c.pad = o.pad_id >= 0 ? (uint32_t)o.pad_id : c.eos;
        /* record what was resolved, so the manifest says which ids were used */
        if (!rc) {
            json_object_set_new(cfg, "eos-id", json_integer(c.eos));
            json_object_set_new(cfg, "pad-id", json_integer(c.pad));
            json_object_set_new(cfg, "tokenizer_hash", json_sprintf("%016llx", (unsigned long long)dfm_tokenizer_hash(tok)));
        }
    }
    if (!rc) rc = dfm_inputs_expand(pos + 1, npos - 1, &in);
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) rc = hash_inputs(&m, &in, &inputs_json);
    if (!rc && !(chunk_dir = dfm_path_join(run, "chunk"))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");

    /* ---- manifest: skip a finished identical stage; refuse a silent mix ---- */
    int skip = 0;
    if (!rc && m.rank == 0) {
        rc = dfm_mkdir_p(chunk_dir);
        if (!rc) rc = dfm_manifest_load(run, 1, &man);
        json_t *st = rc ? NULL : dfm_manifest_stage(man, "chunk");
        if (st && !o.force) {
            int same = json_equal(json_object_get(st, "config"), cfg) && json_equal(json_object_get(st, "inputs"), inputs_json);
            const char *state = json_string_value(json_object_get(st, "state"));
            if (same && state && !strcmp(state, "complete")) {
                skip = 1;
            } else if (!same) {
                rc = DFM_FAIL(DFM_EMISMATCH, "run %s was chunked with other inputs or options. HINT: use a new run directory, or pass --force to redo it (later stages then become stale)",
                              run);
            }
        }
        if (!rc && !skip) {
            remove_old_shards(chunk_dir);
            json_t *stage = json_pack("{s:s, s:i, s:O, s:O}", "state", "running", "ranks", m.size, "config", cfg, "inputs", inputs_json);
            dfm_manifest_drop_later(man, "chunk"); /* a re-chunked corpus invalidates everything after it */
            rc = dfm_manifest_set_stage(man, "chunk", stage);
            if (!rc) rc = dfm_manifest_save(run, man);
        }
    }
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) MPI_Bcast(&skip, 1, MPI_INT, 0, m.comm);
    if (!rc && skip) {
        if (m.rank == 0) DFM_LOG_I("chunk stage of %s is already complete with the same inputs and options; nothing to do (--force redoes it)", run);
        goto done;
    }

    /* ---- 1. read and tokenize this rank's share ---- */
    dfm_read_opts ro = {.text_field = o.text_field, .skip_bad = o.skip_bad, .vocab_size = tok ? dfm_tokenizer_vocab_size(tok) : 0,
                        .eos_id = c.eos};
    if (!rc) {
        c.o = &o;
        c.tok = tok;
        c.ro = &ro;
        c.last_file = -1;
        uint64_t lo = (uint64_t)((unsigned __int128)in.total_bytes * (unsigned)m.rank / (unsigned)m.size);
        uint64_t hi = (uint64_t)((unsigned __int128)in.total_bytes * (unsigned)(m.rank + 1) / (unsigned)m.size);
        dfm_progress_begin(&m, "chunk", "bytes", hi - lo, &c.prog);
        if (o.doc_aligned) /* pretokenized files stay whole so every rank starts on a chunk boundary */
            for (int i = 0; i < in.n; i++)
                if (in.files[i].kind == DFM_IN_TOKENS) in.files[i].whole = 1;
        rc = dfm_corpus_read_share(&in, m.rank, m.size, &ro, on_doc, &c);
        if (!rc) rc = flush_text(&c);
        if (!rc) rc = end_token_file(&c);
        for (int i = 0; i < c.bn; i++) free(c.btext[i]);
        dfm_progress_end(c.prog);
    }
    t_tok = dfm_now() - t_start;
    dfm_fault_point("chunk:tokenized", m.rank);
    rc = dfm_mpi_agree(&m, rc);

    /* ---- 2. global offsets and the head exchange ---- */
    uint64_t off = 0, N = 0, doc_starts_local = 0, doc_base = 0, n_docs = 0;
    uint64_t A = 0, E = 0, owned_len = 0, pads_local = 0;
    double t1 = dfm_now();
    if (!rc) {
        for (size_t i = 0; i < c.n; i++) {
            doc_starts_local += (c.stream[i] & DFM_TOK_DOCSTART) != 0;
            pads_local += (c.stream[i] & DFM_TOK_PAD) != 0;
        }
        rc = dfm_mpi_exscan_u64(&m, c.n, &off, &N);
        if (!rc) rc = dfm_mpi_exscan_u64(&m, doc_starts_local, &doc_base, &n_docs);
        if (!rc && N == 0) rc = DFM_FAIL(DFM_EFORMAT, "the inputs hold no text (0 tokens after %llu empty and %llu bad documents)",
                                         (unsigned long long)ro.empty_docs, (unsigned long long)ro.bad_lines);
    }
    if (!rc) {
        offs = calloc((size_t)m.size, sizeof *offs);
        lens = calloc((size_t)m.size, sizeof *lens);
        if (!offs || !lens) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        uint64_t n64 = c.n;
        if (!rc) rc = DFM_MPI_CHECK(MPI_Allgather(&off, 1, MPI_UINT64_T, offs, 1, MPI_UINT64_T, m.comm));
        if (!rc) rc = DFM_MPI_CHECK(MPI_Allgather(&n64, 1, MPI_UINT64_T, lens, 1, MPI_UINT64_T, m.comm));
    }
    int *scnt = NULL, *sdsp = NULL, *rcnt = NULL, *rdsp = NULL;
    if (!rc) {
        uint64_t S = (uint64_t)o.seq_len;
        scnt = calloc((size_t)m.size, sizeof(int));
        sdsp = calloc((size_t)m.size, sizeof(int));
        rcnt = calloc((size_t)m.size, sizeof(int));
        rdsp = calloc((size_t)m.size, sizeof(int));
        if (!scnt || !sdsp || !rcnt || !rdsp) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        uint64_t head = dfm_pack_head(off, c.n, S);
        if (!rc && head) {
            int dest = dfm_pack_owner(offs, lens, m.size, S, off / S);
            if (dest < 0 || dest == m.rank) rc = DFM_FAIL(DFM_EINTERNAL, "no owner for sequence %llu", (unsigned long long)(off / S));
            else scnt[dest] = (int)head;
        }
        if (!rc) rc = DFM_MPI_CHECK(MPI_Alltoall(scnt, 1, MPI_INT, rcnt, 1, MPI_INT, m.comm));
        dfm_pack_owned(off, c.n, S, &A, &E);
        uint64_t recv_total = 0;
        for (int r = 0; !rc && r < m.size; r++) {
            rdsp[r] = (int)recv_total;
            recv_total += (uint64_t)rcnt[r];
        }
        uint64_t have = c.n > head ? c.n - head : 0; /* own tokens from A on */
        owned_len = E - A;
        if (!rc && have + recv_total > owned_len)
            rc = DFM_FAIL(DFM_EINTERNAL, "rank holds %llu tokens for a %llu-token owned range", (unsigned long long)(have + recv_total),
                          (unsigned long long)owned_len);
        if (!rc && !(owned = malloc((owned_len ? owned_len : 1) * sizeof *owned))) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc && have) memcpy(owned, c.stream + head, have * sizeof *owned);
        for (int r = 0; r < m.size; r++) rdsp[r] += (int)have;
        if (!rc) rc = DFM_MPI_CHECK(MPI_Alltoallv(c.stream, scnt, sdsp, MPI_UINT32_T, owned, rcnt, rdsp, MPI_UINT32_T, m.comm));
        if (!rc) {
            uint64_t filled = have + recv_total;
            if (E > N && E > A) { /* this rank owns the last sequence: pad it to S */
                if (A + filled != N) rc = DFM_FAIL(DFM_EINTERNAL, "last sequence has %llu of %llu tokens", (unsigned long long)(A + filled), (unsigned long long)N);
                for (uint64_t i = filled; i < owned_len; i++) owned[i] = c.pad | DFM_TOK_PAD;
                pads_local += owned_len - filled;
            } else if (filled != owned_len) {
                rc = DFM_FAIL(DFM_EINTERNAL, "owned range has %llu of %llu tokens", (unsigned long long)filled, (unsigned long long)owned_len);
            }
        }
        /* documents started before A: those of earlier ranks plus this rank's head */
        for (uint64_t i = 0; !rc && i < head; i++) doc_base += (c.stream[i] & DFM_TOK_DOCSTART) != 0;
    }
    free(scnt); free(sdsp); free(rcnt); free(rdsp);
    free(c.stream);
    c.stream = NULL;
    t_xchg = dfm_now() - t1;
    rc = dfm_mpi_agree(&m, rc);

    /* ---- 3. write this rank's shard ---- */
    uint64_t my_chunks = 0;
    double t2 = dfm_now();
    if (!rc) {
        char name[64];
        snprintf(name, sizeof name, "chunks-%05d.bin", m.rank);
        shard_path = dfm_path_join(chunk_dir, name);
        rc = shard_path ? write_shard(shard_path, &o, tok, c.eos, c.pad, owned, owned_len, A, doc_base, &my_chunks)
                        : DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    t_write = dfm_now() - t2;
    dfm_fault_point("chunk:shard-written", m.rank);
    rc = dfm_mpi_agree(&m, rc);

    /* ---- 4. counts and the manifest ---- */
    if (!rc) {
        uint64_t loc[6] = {c.docs, ro.bad_lines, ro.empty_docs, c.utf8_replaced, pads_local, ro.bytes_read}, tot[6];
        uint64_t mine[2] = {A / (uint64_t)o.chunk_len, my_chunks}, *all = calloc(2 * (size_t)m.size, sizeof(uint64_t));
        rc = all ? DFM_MPI_CHECK(MPI_Reduce(loc, tot, 6, MPI_UINT64_T, MPI_SUM, 0, m.comm)) : DFM_FAIL(DFM_ENOMEM, "no memory");
        if (!rc) rc = DFM_MPI_CHECK(MPI_Gather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, 0, m.comm));
        double tt[3] = {t_tok, t_xchg, t_write}, tmax[3];
        if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(tt, tmax, 3, MPI_DOUBLE, MPI_MAX, 0, m.comm));
        if (!rc && m.rank == 0) {
            uint64_t chunks = dfm_ceil_div(N, (uint64_t)o.seq_len) * ((uint64_t)o.seq_len / (uint64_t)o.chunk_len);
            json_t *outs = json_array();
            for (int r = 0; r < m.size; r++) {
                char name[64];
                snprintf(name, sizeof name, "chunk/chunks-%05d.bin", r);
                json_array_append_new(outs, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)all[2 * r],
                                                      "n_chunks", (json_int_t)all[2 * r + 1]));
            }
            json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "documents", (json_int_t)n_docs,
                                       "tokens", (json_int_t)(dfm_ceil_div(N, (uint64_t)o.seq_len) * (uint64_t)o.seq_len - tot[4]),
                                       "stream_tokens", (json_int_t)N, "pad_tokens", (json_int_t)tot[4], "chunks", (json_int_t)chunks,
                                       "sequences", (json_int_t)dfm_ceil_div(N, (uint64_t)o.seq_len), "bad_lines", (json_int_t)tot[1],
                                       "empty_documents", (json_int_t)tot[2], "utf8_replacements", (json_int_t)tot[3],
                                       "bytes_read", (json_int_t)tot[5]);
            json_t *timings = json_pack("{s:f, s:f, s:f, s:f}", "tokenize_s", tmax[0], "exchange_s", tmax[1], "write_s", tmax[2],
                                        "total_s", dfm_now() - t_start);
            json_t *st = dfm_manifest_stage(man, "chunk");
            json_object_set_new(st, "state", json_string("complete"));
            json_object_set_new(st, "counts", counts);
            json_object_set_new(st, "timings", timings);
            json_object_set_new(st, "outputs", outs);
            json_object_set_new(st, "tokenizer", json_pack("{s:s, s:I, s:s}", "path", o.tokenizer, "vocab_size",
                                                           (json_int_t)dfm_tokenizer_vocab_size(tok), "describe",
                                                           dfm_tokenizer_describe(tok)));
            json_object_set_new(st, "dfm_version", json_string(DFM_VERSION));
            rc = dfm_manifest_save(run, man);
            if (!rc)
                printf("chunk: %llu documents, %llu tokens, %llu chunks of %lld tokens in %llu sequences of %lld; %llu bad, %llu empty; %.2fs on %d rank%s\n",
                       (unsigned long long)n_docs, (unsigned long long)json_integer_value(json_object_get(counts, "tokens")),
                       (unsigned long long)chunks, (long long)o.chunk_len, (unsigned long long)dfm_ceil_div(N, (uint64_t)o.seq_len),
                       (long long)o.seq_len, (unsigned long long)tot[1], (unsigned long long)tot[2], dfm_now() - t_start, m.size,
                       m.size > 1 ? "s" : "");
        }
        free(all);
    }
    rc = dfm_mpi_agree(&m, rc);
done:
    free(owned);
    free(offs);
    free(lens);
    free(c.btext);
    free(c.blen);
    free(shard_path);
    free(chunk_dir);
    json_decref(man);
    json_decref(cfg);
    json_decref(inputs_json);
    dfm_inputs_free(&in);
    dfm_tokenizer_free(tok);
    free(pos);
    dfm_opts_free(table);
    dfm_mpi_finalize();
    return rc;
}
