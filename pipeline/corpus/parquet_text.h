/* parquet_text.h — the text column of a Parquet file, row group by row group (a C interface to Apache
 * Arrow's C++ Parquet reader, the libparquet that the pyarrow wheel ships; parquet_text.cc).
 *
 * Why Arrow's reader: Debian 12 packages no Parquet library (no Arrow, no DuckDB); the pyarrow wheel on
 * PyPI ships libarrow and libparquet with their headers for every Linux x86-64/aarch64, so `pip install
 * pyarrow` is the whole install on a cluster too. It is the reference implementation (every codec,
 * dictionary and plain encodings, data pages v1 and v2, page CRCs) and is fuzzed upstream in OSS-Fuzz
 * (arrow's parquet-arrow-fuzz target). The alternatives cost more: Arrow's C GLib must be built from
 * source (with Arrow C++ under it), and DuckDB's wheel (2.0.1) exports its C API only from its 69 MB
 * Python extension module, with no duckdb.h and no libduckdb on PyPI or in Debian, and would run a SQL
 * engine to read one column. Install: `pip install pyarrow==26.0.1` into any Python, `make DFM_ARROW=DIR`.
 *
 * What is read: one top-level column, named like the JSONL --text-field, whose type is a string
 * (BYTE_ARRAY annotated UTF8/String; also large_string). Every row of every row group is handed out in
 * order; a null is handed out as is_null = 1 (the caller counts it as an empty document).
 *
 * Refused with DFM_EUNSUPPORTED / DFM_EFORMAT, the file and the reason named: an encrypted file (footer
 * magic PARE, or encrypted column chunks in a plaintext footer), a missing column, two top-level columns of
 * that name, a nested or repeated column, a column that is not a string (binary, numbers, ...), row groups
 * whose text column chunks overlap (each would be read again: an amplification bomb), a file that is not
 * Parquet or is damaged. Row groups of 0 rows are valid and skipped (their column metadata is not read).
 *
 * Untrusted input: sizes in the footer and page headers come from the file. Thrift fields are bounded by
 * the library (100 MB strings, 1 M container entries); column chunks must lie inside the file; every
 * allocation the library makes for a file goes through a pool capped at DFM_PARQUET_MAX_MEMORY bytes
 * live, or $DFM_PARQUET_MAX_MB MiB when set (a page that claims a huge uncompressed size is refused, not
 * allocated; a corpus with legitimately larger pages or dictionaries raises it). Column chunks are read
 * through a 1 MiB buffered stream, never whole, so memory per reader is the pool's use: about one page
 * (compressed and uncompressed) and the dictionary. Page CRCs are verified when the writer wrote them.
 * tests/fuzz/fuzz_parquet.c drives this interface on mutated files.
 */
#ifndef DFM_PARQUET_TEXT_H
#define DFM_PARQUET_TEXT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DFM_PARQUET_MAX_MEMORY (1ull << 30) /* live bytes the library may allocate for one open file */

typedef struct dfm_parquet dfm_parquet;

/* Open path (file_bytes: its size) and find its top-level string column `field`. */
int dfm_parquet_open(const char *path, uint64_t file_bytes, const char *field, dfm_parquet **out);
void dfm_parquet_close(dfm_parquet *p);

int dfm_parquet_row_groups(const dfm_parquet *p);
/* Rows of row group rg. */
uint64_t dfm_parquet_rows(const dfm_parquet *p, int rg);
/* Byte offset in the file where row group rg's text column chunk begins (its dictionary page, else
 * its first data page), checked to lie inside the file. */
uint64_t dfm_parquet_offset(const dfm_parquet *p, int rg);

/* One value: text (not NUL-terminated, valid until fn returns), or is_null. row is the row's index
 * inside its row group. Return DFM_OK to go on. */
typedef int (*dfm_parquet_value_fn)(const char *text, size_t len, int is_null, uint64_t row, void *user);

/* Every row of row group rg, in order. Errors name the file, the row group and the reason. */
int dfm_parquet_read(dfm_parquet *p, int rg, dfm_parquet_value_fn fn, void *user);

#ifdef __cplusplus
}
#endif

#endif
