/* corpus.h — input files, how ranks split them, and reading documents out of them.
 *
 * Input kinds (by file name):
 *   *.jsonl, *.json          one JSON object per line; the text is in --text-field (default "text")
 *   *.txt, anything else     plain UTF-8 text, the whole file is one document
 *   *.bin                    pretokenized llm.c token shard: 256 int32 header (magic 20240520 with
 *                            version 1 = uint16 tokens, or magic 20240801 with version 7 = uint32
 *                            tokens; header[2] = token count), then the tokens. Tokens pass into
 *                            the stream verbatim; a document starts at the file start and after
 *                            every EOS token.
 *   *.parquet                Apache Parquet: the string column named --text-field, one document a row,
 *                            row group by row group (parquet_text.h: codecs, encodings, refusals); a
 *                            null counts as an empty document
 *   any of the above + .zst  zstd-compressed, decompressed as a stream (never whole in memory)
 *   any of the above + .gz   gzip-compressed (one member, or several concatenated as pigz, bgzip or
 *                            `cat a.gz b.gz` write them), decompressed as a stream with ISA-L's igzip
 *                            (bench/corpus/bench_gunzip.c: 2.7-2.9x zlib's speed; libdeflate cannot stream); every
 *                            member's CRC-32 and length are checked
 *
 * Splitting: the inputs, in the order given, form one virtual byte space of total size T; rank r
 * takes [r*T/P, (r+1)*T/P). Uncompressed JSONL and .bin files are split inside (a JSONL line belongs
 * to the rank whose range holds its first byte; a token to the rank holding its first byte);
 * a Parquet row group belongs to the rank whose range holds the first byte of its text column chunk
 * (made non-decreasing over the file's row groups, so a rank's row groups are consecutive);
 * other files (compressed ones among them) go whole to the rank holding their first byte. Ranges are contiguous, so rank order
 * is stream order, and the documents seen in order over all ranks do not depend on P.
 *
 * Untrusted sizes: a document (a JSONL line, a text file, a Parquet value) longer than max_doc_bytes
 * (dfm chunk --max-doc-bytes, default DFM_MAX_DOC_BYTES) is refused naming the file and the line or row
 * (with skip_bad: skipped and counted in bad_lines), so a small compressed file cannot grow a reader's
 * buffers without bound: they stay within max_doc_bytes + 1 (a 4.4 MB gzip of one 4.5 GB line once grew a
 * rank to 4 GB). An empty .gz or .zst file, and a gzip member with reserved header flags (RFC 1952), are
 * refused.
 */
#ifndef DFM_CORPUS_H
#define DFM_CORPUS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { DFM_IN_JSONL, DFM_IN_TEXT, DFM_IN_TOKENS, DFM_IN_PARQUET } dfm_input_kind;

typedef struct {
    char *path;
    dfm_input_kind kind;
    int zst;        /* compressed with zstd */
    int gz;         /* compressed with gzip */
    int whole;      /* never split between ranks (set by the caller) */
    uint64_t bytes; /* size on disk */
    uint64_t start; /* offset in the virtual byte space */
} dfm_input;

typedef struct {
    dfm_input *files;
    int n;
    uint64_t total_bytes;
} dfm_input_list;

/* Expand patterns (files or globs; a glob's matches are sorted) into an input list. A pattern that
 * matches nothing, or a file that cannot be read, is DFM_ENOTFOUND / DFM_EIO naming it. */
int dfm_inputs_expand(char *const *patterns, int n, dfm_input_list *out);
void dfm_inputs_free(dfm_input_list *l);

/* One document handed to the callback. Exactly one of text/tokens is set. */
typedef struct {
    const char *text; /* UTF-8, not NUL-terminated */
    size_t text_len;
    const uint32_t *tokens; /* pretokenized input: a run of tokens (may end in EOS) */
    size_t n_tokens;
    int file;          /* index in the input list */
    uint64_t offset;   /* byte offset of the document (line) in the uncompressed file; Parquet: row index */
    int new_document;  /* tokens input: 1 if this run starts a document */
} dfm_doc;

/* Return DFM_OK to go on; any other code stops reading and is returned. */
typedef int (*dfm_doc_fn)(const dfm_doc *doc, void *user);

#define DFM_MAX_DOC_BYTES 33554432 /* 32 MiB: the longest document read by default (dfm chunk --max-doc-bytes) */

typedef struct {
    const char *text_field; /* JSONL field or Parquet column holding the text */
    int skip_bad;           /* count and skip malformed lines / documents instead of failing */
    uint64_t max_doc_bytes; /* longest document in bytes (0: DFM_MAX_DOC_BYTES); longer is malformed */
    uint32_t vocab_size;    /* for checking pretokenized ids */
    uint32_t eos_id;        /* document separator in pretokenized input */
    uint64_t bad_lines;     /* out: lines or documents skipped */
    uint64_t empty_docs;    /* out: documents with empty text (skipped, counted) */
    uint64_t bytes_read;    /* out */
} dfm_read_opts;

/* Read every document of this rank's share of the inputs, in order, calling fn for each.
 * Errors name the file, the line (computed on demand) and the byte offset. */
int dfm_corpus_read_share(const dfm_input_list *l, int rank, int size, dfm_read_opts *o, dfm_doc_fn fn, void *user);

/* The 1-based line number holding byte `offset` of an uncompressed file (for error messages). */
uint64_t dfm_line_of_offset(const char *path, uint64_t offset);

#endif
