#include "pipeline/corpus/corpus.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "pipeline/corpus/parquet_text.h"

#include <errno.h>
#include <glob.h>
#include <isa-l/igzip_lib.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#define TOKBIN_HEADER_BYTES 1024u

/* ------------------------------------------------------------------------------------------------
 * input list
 * ---------------------------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static int add_file(dfm_input_list *l, const char *path) {
    struct stat st;
    int fd; /* a regular file that can be read (common/fsutil.h): a FIFO would block every rank */
    if (dfm_open_regular(path, NULL, &fd)) return dfm_error_prefix("input");
    int serr = fstat(fd, &st) ? errno : 0;
    close(fd);
    if (serr) return DFM_FAIL(DFM_EIO, "input %s: %s", path, strerror(serr));
    dfm_input *f = realloc(l->files, (size_t)(l->n + 1) * sizeof *f);
    if (!f) return DFM_FAIL(DFM_ENOMEM, "no memory");
    l->files = f;
    dfm_input *in = &l->files[l->n];
    memset(in, 0, sizeof *in);
    if (!(in->path = strdup(path))) return DFM_FAIL(DFM_ENOMEM, "no memory");
    in->zst = ends_with(path, ".zst");
    in->gz = ends_with(path, ".gz");
    char *base = strdup(path);
    if (!base) return DFM_FAIL(DFM_ENOMEM, "no memory");
    if (in->zst) base[strlen(base) - 4] = 0;
    if (in->gz) base[strlen(base) - 3] = 0;
    in->kind = (ends_with(base, ".jsonl") || ends_with(base, ".json")) ? DFM_IN_JSONL
               : ends_with(base, ".bin")                               ? DFM_IN_TOKENS
               : ends_with(base, ".parquet")                           ? DFM_IN_PARQUET
                                                                       : DFM_IN_TEXT;
    free(base);
    if (in->kind == DFM_IN_PARQUET && (in->zst || in->gz))
        return DFM_FAIL(DFM_EUNSUPPORTED, "input %s: a compressed Parquet file; Parquet compresses its pages itself. HINT: decompress it (%s)",
                        path, in->zst ? "zstd -d" : "gzip -d");
    in->bytes = (uint64_t)st.st_size;
    in->start = l->total_bytes;
    l->total_bytes += in->bytes;
    l->n++;
    return DFM_OK;
}

int dfm_inputs_expand(char *const *patterns, int n, dfm_input_list *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n; i++) {
        int rc;
        if (!strpbrk(patterns[i], "*?[")) {
            rc = add_file(out, patterns[i]);
        } else {
            glob_t g;
            int grc = glob(patterns[i], 0, NULL, &g);
            if (grc == GLOB_NOMATCH) {
                rc = DFM_FAIL(DFM_ENOTFOUND, "input pattern '%s' matches no file", patterns[i]);
            } else if (grc != 0) {
                rc = DFM_FAIL(DFM_EIO, "input pattern '%s' could not be expanded", patterns[i]);
            } else {
                rc = DFM_OK;
                for (size_t k = 0; k < g.gl_pathc && !rc; k++) rc = add_file(out, g.gl_pathv[k]);
            }
            if (grc == 0) globfree(&g);
        }
        if (rc) {
            dfm_inputs_free(out);
            return rc;
        }
    }
    if (out->n == 0) return DFM_FAIL(DFM_EARG, "no input files. HINT: pass files or globs after the run directory");
    return DFM_OK;
}

void dfm_inputs_free(dfm_input_list *l) {
    for (int i = 0; i < l->n; i++) free(l->files[i].path);
    free(l->files);
    memset(l, 0, sizeof *l);
}

uint64_t dfm_line_of_offset(const char *path, uint64_t offset) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    uint64_t line = 1, pos = 0;
    char buf[1 << 16];
    size_t n;
    while (pos < offset && (n = fread(buf, 1, sizeof buf, fp)) > 0) {
        size_t m = (uint64_t)n < offset - pos ? n : (size_t)(offset - pos);
        for (const char *p = buf; (p = memchr(p, '\n', (size_t)(buf + m - p))) != NULL; p++) line++;
        pos += n;
    }
    fclose(fp);
    return line;
}

/* ------------------------------------------------------------------------------------------------
 * byte source: a plain file from an offset, a zstd stream or a gzip stream
 * ---------------------------------------------------------------------------------------------- */

static int compressed(const dfm_input *f) { return f->zst || f->gz; }

typedef struct {
    const char *path;
    FILE *fp;
    ZSTD_DCtx *dctx;
    struct inflate_state *gz;
    uint8_t *in;
    size_t in_cap;
    ZSTD_inBuffer ib;
    size_t last_ret;  /* last ZSTD_decompressStream result: 0 = frame complete */
    int gz_state;     /* 0: between members (none begun), 1: inside a member, 2: a member just ended */
    uint64_t members; /* gzip members begun */
    uint64_t member_at; /* compressed offset where the current member begins */
    int eof;
    uint64_t compressed_read;
} source;

static int source_open(source *s, const dfm_input *f, uint64_t offset) {
    memset(s, 0, sizeof *s);
    s->path = f->path;
    s->fp = fopen(f->path, "rb");
    if (!s->fp) return DFM_FAIL(DFM_EIO, "cannot open input %s: %s", f->path, strerror(errno));
    if (f->zst) {
        s->dctx = ZSTD_createDCtx();
        s->in_cap = ZSTD_DStreamInSize();
        s->in = malloc(s->in_cap);
        if (!s->dctx || !s->in) return DFM_FAIL(DFM_ENOMEM, "no memory for zstd stream");
    } else if (f->gz) {
        s->gz = malloc(sizeof *s->gz);
        s->in_cap = 1 << 18;
        s->in = malloc(s->in_cap);
        if (!s->gz || !s->in) return DFM_FAIL(DFM_ENOMEM, "no memory for gzip stream");
        isal_inflate_init(s->gz);
        s->gz->crc_flag = ISAL_GZIP;
    } else if (offset && fseeko(s->fp, (off_t)offset, SEEK_SET) != 0) {
        return DFM_FAIL(DFM_EIO, "cannot seek to byte %llu of %s", (unsigned long long)offset, f->path);
    }
    return DFM_OK;
}

static void source_close(source *s) {
    if (s->fp) fclose(s->fp);
    ZSTD_freeDCtx(s->dctx);
    free(s->gz);
    free(s->in);
    memset(s, 0, sizeof *s);
}

/* refill s->in when it is used up; *at_eof = 1 when the file has no more bytes */
static int source_refill(source *s, size_t *avail, int *at_eof) {
    *at_eof = 0;
    if (*avail) return DFM_OK;
    size_t n = s->eof ? 0 : fread(s->in, 1, s->in_cap, s->fp);
    if (n == 0) {
        if (ferror(s->fp)) return DFM_FAIL(DFM_EIO, "read error on %s: %s", s->path, strerror(errno));
        if (s->compressed_read == 0) /* gzip -t and zstd -t refuse it too: a stream holds one member or frame */
            return DFM_FAIL(DFM_ETRUNCATED, "%s is empty (0 bytes): a %s file holds at least one %s. HINT: re-create "
                            "or re-download it, or remove it from the inputs", s->path, s->gz ? ".gz" : ".zst",
                            s->gz ? "gzip member" : "zstd frame");
        s->eof = *at_eof = 1;
        return DFM_OK;
    }
    s->compressed_read += n;
    *avail = n;
    return DFM_OK;
}

static const char *isal_error_name(int e) {
    switch (e) {
    case ISAL_INVALID_BLOCK: return "invalid deflate block";
    case ISAL_INVALID_SYMBOL: return "invalid deflate symbol";
    case ISAL_INVALID_LOOKBACK: return "back-reference beyond the start of the data";
    case ISAL_INVALID_WRAPPER: return "not a gzip member (bad magic or header)";
    case ISAL_UNSUPPORTED_METHOD: return "compression method other than deflate";
    case ISAL_INCORRECT_CHECKSUM: return "CRC-32 or length in the member trailer does not match the data";
    case ISAL_NEED_DICT: return "needs a preset dictionary";
    default: return "undecodable gzip data";
    }
}

/* RFC 1952: a reader must refuse a member whose header sets a reserved flag bit (FLG bits 5-7); ISA-L's header
 * parser ignores them. The 4 bytes up to FLG are made contiguous first (moved to the buffer's start and the
 * rest refilled) when a member begins at the buffer's end. Fewer than 4 bytes left: inflate says truncated. */
static int gz_check_flags(source *s) {
    struct inflate_state *z = s->gz;
    if (z->avail_in < 4 && !s->eof) {
        memmove(s->in, z->next_in, z->avail_in);
        size_t n = fread(s->in + z->avail_in, 1, s->in_cap - z->avail_in, s->fp);
        if (n == 0 && ferror(s->fp)) return DFM_FAIL(DFM_EIO, "read error on %s: %s", s->path, strerror(errno));
        if (n == 0) s->eof = 1;
        s->compressed_read += n;
        z->next_in = s->in;
        z->avail_in += (uint32_t)n;
    }
    const uint8_t *h = z->next_in; /* not a member at all (no magic, another method): inflate names it */
    if (z->avail_in >= 4 && h[0] == 0x1f && h[1] == 0x8b && h[2] == 8 && (h[3] & 0xE0))
        return DFM_FAIL(DFM_EFORMAT, "%s: gzip member %llu (at compressed byte %llu) sets reserved header flag bits "
                        "(FLG 0x%02x), which RFC 1952 tells a reader to refuse. HINT: check the file with `gzip -t`; "
                        "re-create or re-download it", s->path, (unsigned long long)s->members + 1,
                        (unsigned long long)(s->compressed_read - z->avail_in), h[3]);
    return DFM_OK;
}

static int gz_read(source *s, uint8_t *buf, size_t cap, size_t *got) {
    struct inflate_state *z = s->gz;
    size_t pos = 0;
    while (pos == 0) {
        size_t avail = z->avail_in;
        int at_eof;
        DFM_TRY(source_refill(s, &avail, &at_eof));
        if (at_eof) {
            if (s->gz_state == 1)
                return DFM_FAIL(DFM_ETRUNCATED, "%s is a truncated gzip stream (member %llu, from compressed byte %llu, ends early: the file ends after %llu compressed bytes). HINT: re-create or re-download the file",
                                s->path, (unsigned long long)s->members, (unsigned long long)s->member_at, (unsigned long long)s->compressed_read);
            break;
        }
        if (avail != z->avail_in) { /* fresh input */
            z->next_in = s->in;
            z->avail_in = (uint32_t)avail;
        }
        if (s->gz_state != 1) { /* a new member starts here */
            DFM_TRY(gz_check_flags(s));
            uint8_t *ni = z->next_in;
            uint32_t na = z->avail_in;
            if (s->gz_state == 2) {
                isal_inflate_reset(z);
                z->crc_flag = ISAL_GZIP;
                z->next_in = ni;
                z->avail_in = na;
            }
            s->gz_state = 1;
            s->members++;
            s->member_at = s->compressed_read - z->avail_in;
        }
        z->next_out = buf + pos;
        z->avail_out = (uint32_t)(cap - pos > UINT32_MAX ? UINT32_MAX : cap - pos);
        uint32_t before = z->avail_out, in_before = z->avail_in;
        int e = isal_inflate(z);
        pos += before - z->avail_out;
        if (e == ISAL_DECOMP_OK && z->avail_out == before && z->avail_in == in_before && z->avail_in && z->block_state != ISAL_BLOCK_FINISH)
            e = ISAL_INVALID_BLOCK; /* no progress with input and room left: never loop on it */
        if (e < 0 || e == ISAL_NEED_DICT)
            return DFM_FAIL(DFM_EFORMAT, "%s: gzip error in member %llu (from compressed byte %llu) near compressed byte %llu: %s. HINT: check the file with `gzip -t`; re-create or re-download it",
                            s->path, (unsigned long long)s->members, (unsigned long long)s->member_at,
                            (unsigned long long)(s->compressed_read - z->avail_in), isal_error_name(e));
        if (z->block_state == ISAL_BLOCK_FINISH) s->gz_state = 2;
    }
    *got = pos;
    return DFM_OK;
}

/* Read up to cap bytes; *got = 0 only at the end. */
static int source_read(source *s, uint8_t *buf, size_t cap, size_t *got) {
    *got = 0;
    if (s->gz) return gz_read(s, buf, cap, got);
    if (!s->dctx) {
        size_t n = fread(buf, 1, cap, s->fp);
        if (n == 0 && ferror(s->fp)) return DFM_FAIL(DFM_EIO, "read error on %s: %s", s->path, strerror(errno));
        *got = n;
        return DFM_OK;
    }
    ZSTD_outBuffer ob = {buf, cap, 0};
    while (ob.pos == 0) {
        size_t avail = s->ib.size - s->ib.pos;
        int at_eof;
        DFM_TRY(source_refill(s, &avail, &at_eof));
        if (at_eof) {
            if (s->last_ret != 0)
                return DFM_FAIL(DFM_ETRUNCATED, "%s is a truncated zstd stream (ends inside a frame after %llu compressed bytes). HINT: re-create or re-download the file",
                                s->path, (unsigned long long)s->compressed_read);
            break;
        }
        if (avail != s->ib.size - s->ib.pos) s->ib = (ZSTD_inBuffer){s->in, avail, 0};
        size_t r = ZSTD_decompressStream(s->dctx, &ob, &s->ib);
        if (ZSTD_isError(r))
            return DFM_FAIL(DFM_EFORMAT, "%s: zstd error near compressed byte %llu: %s", s->path,
                            (unsigned long long)s->compressed_read, ZSTD_getErrorName(r));
        s->last_ret = r;
    }
    *got = ob.pos;
    return DFM_OK;
}

/* ------------------------------------------------------------------------------------------------
 * readers
 * ---------------------------------------------------------------------------------------------- */

static int bad_input(dfm_read_opts *o, int code, const dfm_input *f, uint64_t off, int is_line, const char *what) {
    if (o->skip_bad) {
        o->bad_lines++;
        return DFM_OK;
    }
    uint64_t line = compressed(f) ? 0 : dfm_line_of_offset(f->path, off);
    if (line)
        return DFM_FAIL(code, "%s:%llu (byte %llu): %s. HINT: fix the input or pass --skip-bad-lines to count and skip it",
                        f->path, (unsigned long long)line, (unsigned long long)off, what);
    return DFM_FAIL(code, "%s (uncompressed byte %llu%s): %s. HINT: fix the input or pass --skip-bad-lines to count and skip it",
                    f->path, (unsigned long long)off, is_line ? ", a line" : "", what);
}

static uint64_t max_doc(const dfm_read_opts *o) { return o->max_doc_bytes ? o->max_doc_bytes : DFM_MAX_DOC_BYTES; }

/* A document longer than the cap: refused (or skipped and counted) like any malformed one. line: its line
 * number when the caller knows it (a compressed file), else 0. */
static int doc_too_long(dfm_read_opts *o, const dfm_input *f, uint64_t off, int is_line, uint64_t line) {
    char what[240], at[48] = "";
    if (line && compressed(f)) snprintf(at, sizeof at, " (line %llu)", (unsigned long long)line);
    snprintf(what, sizeof what, "a document%s longer than %llu bytes (--max-doc-bytes; raise it to read longer "
             "ones)", at, (unsigned long long)max_doc(o));
    return bad_input(o, DFM_ERANGE, f, off, is_line, what);
}

/* The next buffer size for a document still growing: doubled, but never past the cap + 1 (a longer one is
 * refused once it fills that). */
static size_t grow_cap(size_t cap, const dfm_read_opts *o) {
    uint64_t lim = max_doc(o) + 1;
    return cap >= lim ? cap : (uint64_t)cap * 2 > lim ? (size_t)lim : cap * 2;
}

static int valid_utf8(const uint8_t *s, size_t n, size_t *bad_at) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; }
        else { *bad_at = i; return 0; }
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80) { *bad_at = i; return 0; }
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF)) { *bad_at = i; return 0; }
        i += k + 1;
    }
    return 1;
}

static int handle_json_line(const dfm_input *f, int fi, const char *line, size_t len, uint64_t off, dfm_read_opts *o,
                            dfm_doc_fn fn, void *user) {
    size_t a = 0;
    while (a < len && (line[a] == ' ' || line[a] == '\t' || line[a] == '\r')) a++;
    if (a == len) return DFM_OK; /* blank line: no document */
    json_error_t e;
    json_t *j = json_loadb(line, len, JSON_ALLOW_NUL, &e); /* "\u0000" is valid JSON, and web crawls hold it */
    char what[400];
    if (!j) {
        snprintf(what, sizeof what, "malformed JSON line: %s (column %d)", e.text, e.column);
        return bad_input(o, DFM_EFORMAT, f, off, 1, what);
    }
    json_t *t = json_is_object(j) ? json_object_get(j, o->text_field) : NULL;
    int rc = DFM_OK;
    if (!t) {
        snprintf(what, sizeof what, "line has no \"%s\" field. HINT: choose the field with --text-field", o->text_field);
        rc = bad_input(o, DFM_EFORMAT, f, off, 1, what);
    } else if (!json_is_string(t)) {
        snprintf(what, sizeof what, "field \"%s\" is not a string", o->text_field);
        rc = bad_input(o, DFM_EFORMAT, f, off, 1, what);
    } else if (json_string_length(t) == 0) {
        o->empty_docs++;
    } else {
        dfm_doc d = {.text = json_string_value(t), .text_len = json_string_length(t), .file = fi, .offset = off};
        rc = fn(&d, user);
    }
    json_decref(j);
    return rc;
}

static int read_jsonl(const dfm_input *f, int fi, uint64_t begin, uint64_t end, dfm_read_opts *o, dfm_doc_fn fn, void *user) {
    source s;
    uint64_t pos = begin; /* file offset of buf[0] */
    int rc = source_open(&s, f, compressed(f) ? 0 : begin);
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    if (!rc && !buf) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    int skipping = 0;
    if (!rc && !compressed(f) && begin > 0) { /* does a line start at begin? only if byte begin-1 is '\n' */
        uint8_t prev = 0;
        FILE *fp = fopen(f->path, "rb");
        if (!fp || fseeko(fp, (off_t)begin - 1, SEEK_SET) != 0 || fread(&prev, 1, 1, fp) != 1)
            rc = DFM_FAIL(DFM_EIO, "cannot read byte %llu of %s", (unsigned long long)begin - 1, f->path);
        if (fp) fclose(fp);
        skipping = prev != '\n';
    }
    int done = 0;
    uint64_t lines = 0; /* lines begun in this read: the line number in a compressed file (read from its start) */
    while (!rc && !done) {
        if (len == cap) {
            size_t ncap = grow_cap(cap, o);
            uint8_t *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) { rc = DFM_FAIL(DFM_ENOMEM, "no memory for a %zu-byte line in %s", ncap, f->path); break; }
            buf = nb;
            cap = ncap;
        }
        size_t got = 0;
        rc = source_read(&s, buf + len, cap - len, &got);
        if (rc) break;
        int at_end = got == 0;
        len += got;
        size_t a = 0;
        for (;;) {
            uint8_t *nl = memchr(buf + a, '\n', len - a);
            if (!nl && !(at_end && a < len)) break;
            size_t e = nl ? (size_t)(nl - buf) : len;
            uint64_t line_off = pos + a;
            if (line_off >= end) { done = 1; break; }
            if (skipping) skipping = 0; /* the tail of a line owned by the previous rank, or of one too long */
            else {
                lines++;
                rc = e - a > max_doc(o) ? doc_too_long(o, f, line_off, 1, lines)
                                        : handle_json_line(f, fi, (const char *)buf + a, e - a, line_off, o, fn, user);
                if (rc) break;
            }
            a = nl ? e + 1 : len;
        }
        if (rc) break;
        memmove(buf, buf + a, len - a);
        len -= a;
        pos += a;
        o->bytes_read += a;
        if (!skipping && len > max_doc(o)) { /* a line that does not end within the cap: not held whole */
            if (pos >= end) break;           /* the next rank's line */
            if ((rc = doc_too_long(o, f, pos, 1, ++lines))) break;
            skipping = 1; /* skipped and counted: the rest of it up to its newline is dropped */
        }
        if (skipping && len > 0 && !memchr(buf, '\n', len)) { /* inside a skipped line: drop what was read */
            pos += len;
            o->bytes_read += len;
            len = 0;
        }
        if (at_end) break;
    }
    free(buf);
    source_close(&s);
    return rc;
}

static int read_text(const dfm_input *f, int fi, dfm_read_opts *o, dfm_doc_fn fn, void *user) {
    source s;
    int rc = source_open(&s, f, 0);
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    if (!rc && !buf) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    int too_long = 0;
    while (!rc) {
        if (len > max_doc(o)) { /* the whole file is the document */
            rc = doc_too_long(o, f, 0, 0, 0);
            too_long = 1;
            break;
        }
        if (len == cap) {
            size_t ncap = grow_cap(cap, o);
            uint8_t *nb = realloc(buf, ncap);
            if (!nb) { rc = DFM_FAIL(DFM_ENOMEM, "no memory for document %s", f->path); break; }
            buf = nb;
            cap = ncap;
        }
        size_t got;
        rc = source_read(&s, buf + len, cap - len, &got);
        if (rc || got == 0) break;
        len += got;
    }
    if (!rc && too_long) {
        o->bytes_read += len; /* skipped and counted */
    } else if (!rc) {
        o->bytes_read += len;
        size_t bad = 0;
        if (len == 0) {
            o->empty_docs++;
        } else if (!valid_utf8(buf, len, &bad)) {
            char what[200];
            snprintf(what, sizeof what, "invalid UTF-8 at byte %zu of the document", bad);
            rc = bad_input(o, DFM_EFORMAT, f, bad, 0, what);
        } else {
            dfm_doc d = {.text = (const char *)buf, .text_len = len, .file = fi, .offset = 0};
            rc = fn(&d, user);
        }
    }
    free(buf);
    source_close(&s);
    return rc;
}

/* Pretokenized shard: tokens [t0, t1) of the file (t1 = UINT64_MAX: to the end). */
static int read_tokens(const dfm_input *f, int fi, uint64_t t0, uint64_t t1, dfm_read_opts *o, dfm_doc_fn fn, void *user) {
    source s;
    int32_t hdr[256];
    int rc = source_open(&s, f, 0);
    size_t got = 0, have = 0;
    while (!rc && have < sizeof hdr) {
        rc = source_read(&s, (uint8_t *)hdr + have, sizeof hdr - have, &got);
        if (!rc && got == 0) break;
        have += got;
    }
    if (rc) { source_close(&s); return rc; }
    if (have < sizeof hdr) {
        source_close(&s);
        return DFM_FAIL(DFM_ETRUNCATED, "token shard %s: %zu bytes, shorter than its 1024-byte header", f->path, have);
    }
    unsigned width;
    if (hdr[0] == 20240520 && hdr[1] == 1) width = 2;
    else if (hdr[0] == 20240801 && hdr[1] == 7) width = 4;
    else {
        source_close(&s);
        return DFM_FAIL(DFM_EFORMAT, "token shard %s: magic %d version %d unknown (expected 20240520/1 for uint16 or 20240801/7 for uint32)",
                        f->path, hdr[0], hdr[1]);
    }
    uint64_t count = (uint32_t)hdr[2];
    if (!compressed(f) && f->bytes != TOKBIN_HEADER_BYTES + count * width) {
        source_close(&s);
        return DFM_FAIL(f->bytes < TOKBIN_HEADER_BYTES + count * width ? DFM_ETRUNCATED : DFM_EFORMAT,
                        "token shard %s: header says %llu tokens (%llu bytes) but the file has %llu bytes", f->path,
                        (unsigned long long)count, (unsigned long long)(TOKBIN_HEADER_BYTES + count * width),
                        (unsigned long long)f->bytes);
    }
    if (t1 > count) t1 = count;
    int prev_eos = 1; /* token t0-1 was EOS (or t0 is the file start) */
    uint64_t idx = 0;
    if (!compressed(f) && t0 > 0) {
        uint32_t prev = 0;
        if (fseeko(s.fp, (off_t)(TOKBIN_HEADER_BYTES + (t0 - 1) * width), SEEK_SET) != 0 || fread(&prev, width, 1, s.fp) != 1)
            rc = DFM_FAIL(DFM_EIO, "cannot read token %llu of %s", (unsigned long long)t0 - 1, f->path);
        prev_eos = prev == o->eos_id;
        idx = t0;
    }
    size_t batch = 1 << 16;
    uint8_t *raw = malloc(batch * width);
    uint32_t *tok = malloc(batch * sizeof *tok);
    if (!rc && (!raw || !tok)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    while (!rc && idx < t1) {
        size_t want = (size_t)((t1 - idx) < batch ? (t1 - idx) : batch), n = 0;
        while (!rc && n < want * width) {
            rc = source_read(&s, raw + n, want * width - n, &got);
            if (!rc && got == 0) break;
            n += got;
        }
        if (rc) break;
        if (n < want * width) {
            rc = DFM_FAIL(DFM_ETRUNCATED, "token shard %s ends after %llu of %llu tokens", f->path,
                          (unsigned long long)(idx + n / width), (unsigned long long)count);
            break;
        }
        if (idx < t0) { /* zstd: skip to t0 */
            idx += want;
            continue;
        }
        for (size_t i = 0; i < want; i++) tok[i] = width == 2 ? ((uint16_t *)raw)[i] : ((uint32_t *)raw)[i];
        size_t a = 0;
        for (size_t i = 0; i < want && !rc; i++) {
            if (tok[i] >= o->vocab_size) {
                rc = DFM_FAIL(DFM_EFORMAT, "token shard %s, token %llu: id %u is outside the vocabulary (size %u). HINT: was it made with another tokenizer?",
                              f->path, (unsigned long long)(idx + i), tok[i], o->vocab_size);
                break;
            }
            if (tok[i] == o->eos_id || i + 1 == want) {
                dfm_doc d = {.tokens = tok + a, .n_tokens = i + 1 - a, .file = fi,
                             .offset = TOKBIN_HEADER_BYTES + (idx + a) * width, .new_document = prev_eos};
                rc = fn(&d, user);
                prev_eos = tok[i] == o->eos_id;
                a = i + 1;
            }
        }
        idx += want;
        o->bytes_read += want * width;
    }
    free(raw);
    free(tok);
    source_close(&s);
    return rc;
}

typedef struct {
    const dfm_input *f;
    int fi, rg;
    uint64_t row0; /* rows of the file before this row group */
    dfm_read_opts *o;
    dfm_doc_fn fn;
    void *user;
} parquet_ctx;

static int parquet_value(const char *text, size_t len, int is_null, uint64_t row, void *user) {
    parquet_ctx *c = user;
    c->o->bytes_read += len;
    if (is_null || len == 0) {
        c->o->empty_docs++;
        return DFM_OK;
    }
    if (len > max_doc(c->o)) {
        if (c->o->skip_bad) {
            c->o->bad_lines++;
            return DFM_OK;
        }
        return DFM_FAIL(DFM_ERANGE, "%s, row group %d, row %llu (row %llu of the file): a document of %zu bytes, longer than %llu (--max-doc-bytes). HINT: raise --max-doc-bytes, or pass --skip-bad-lines to count and skip it",
                        c->f->path, c->rg, (unsigned long long)row, (unsigned long long)(c->row0 + row), len,
                        (unsigned long long)max_doc(c->o));
    }
    size_t bad = 0;
    if (!valid_utf8((const uint8_t *)text, len, &bad)) {
        if (c->o->skip_bad) {
            c->o->bad_lines++;
            return DFM_OK;
        }
        return DFM_FAIL(DFM_EFORMAT, "%s, row group %d, row %llu (row %llu of the file): invalid UTF-8 at byte %zu of the text. HINT: fix the input or pass --skip-bad-lines to count and skip it",
                        c->f->path, c->rg, (unsigned long long)row, (unsigned long long)(c->row0 + row), bad);
    }
    dfm_doc d = {.text = text, .text_len = len, .file = c->fi, .offset = c->row0 + row};
    return c->fn(&d, c->user);
}

/* The row groups of a Parquet file whose position lies in [a, b) (file offsets): a row group's position
 * is the start of its text column chunk, raised to the largest position before it, so that the row
 * groups of a range are consecutive and ranks meet them in file order. */
static int read_parquet(const dfm_input *f, int fi, uint64_t a, uint64_t b, dfm_read_opts *o, dfm_doc_fn fn, void *user) {
    dfm_parquet *p;
    DFM_TRY(dfm_parquet_open(f->path, f->bytes, o->text_field, &p));
    parquet_ctx c = {.f = f, .fi = fi, .o = o, .fn = fn, .user = user};
    uint64_t pos = 0;
    int rc = DFM_OK;
    for (int rg = 0; rg < dfm_parquet_row_groups(p) && !rc; rg++) {
        uint64_t at = dfm_parquet_offset(p, rg);
        if (at > pos) pos = at;
        if (pos >= b) break;
        c.rg = rg;
        if (pos >= a) rc = dfm_parquet_read(p, rg, parquet_value, &c);
        c.row0 += dfm_parquet_rows(p, rg);
    }
    dfm_parquet_close(p);
    return rc;
}

int dfm_corpus_read_share(const dfm_input_list *l, int rank, int size, dfm_read_opts *o, dfm_doc_fn fn, void *user) {
    uint64_t lo = (uint64_t)((unsigned __int128)l->total_bytes * (unsigned)rank / (unsigned)size);
    uint64_t hi = (uint64_t)((unsigned __int128)l->total_bytes * (unsigned)(rank + 1) / (unsigned)size);
    for (int i = 0; i < l->n; i++) {
        const dfm_input *f = &l->files[i];
        uint64_t fs = f->start, fe = f->start + f->bytes;
        int rc = DFM_OK;
        int whole = compressed(f) || f->whole || f->kind == DFM_IN_TEXT;
        if (f->kind == DFM_IN_PARQUET && f->bytes > 0) {
            if (fe > lo && fs < hi) rc = read_parquet(f, i, lo > fs ? lo - fs : 0, hi - fs, o, fn, user);
        } else if (whole || f->bytes == 0) {
            /* a whole file (or an empty one) belongs to the rank whose range holds its first byte;
             * the last rank also takes files starting at the very end (empty files) */
            if ((fs >= lo && fs < hi) || (rank == size - 1 && fs == l->total_bytes)) {
                if (f->kind == DFM_IN_JSONL) rc = read_jsonl(f, i, 0, UINT64_MAX, o, fn, user);
                else if (f->kind == DFM_IN_TOKENS) rc = read_tokens(f, i, 0, UINT64_MAX, o, fn, user);
                else if (f->kind == DFM_IN_PARQUET) rc = read_parquet(f, i, 0, UINT64_MAX, o, fn, user);
                else rc = read_text(f, i, o, fn, user);
            }
        } else if (fe > lo && fs < hi) {
            uint64_t a = (lo > fs ? lo : fs) - fs, b = (hi < fe ? hi : fe) - fs;
            if (f->kind == DFM_IN_JSONL) {
                rc = read_jsonl(f, i, a, b, o, fn, user);
            } else { /* tokens: token t lives at byte 1024 + t*w; owned by the range holding that byte */
                int32_t h[3] = {0};
                FILE *fp = fopen(f->path, "rb");
                size_t okh = fp ? fread(h, sizeof h, 1, fp) : 0;
                if (fp) fclose(fp);
                uint64_t w = (h[0] == 20240801) ? 4 : 2;
                uint64_t t0 = a <= TOKBIN_HEADER_BYTES ? 0 : (a - TOKBIN_HEADER_BYTES + w - 1) / w;
                uint64_t t1 = b <= TOKBIN_HEADER_BYTES ? 0 : (b - TOKBIN_HEADER_BYTES + w - 1) / w;
                if (!okh || a == 0) t0 = 0; /* the rank holding the header validates it */
                if (t1 > t0 || a == 0) rc = read_tokens(f, i, t0, b == f->bytes ? UINT64_MAX : t1, o, fn, user);
            }
        }
        if (rc) return rc;
    }
    return DFM_OK;
}
