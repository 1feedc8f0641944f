// parquet_text.cc — the C interface of parquet_text.h over Apache Arrow's C++ Parquet reader.
// The Makefile compiles it against the headers of the pyarrow package it finds (DFM_ARROW) and links
// that package's libparquet and libarrow with an rpath to them.
#include "pipeline/corpus/parquet_text.h"

extern "C" {
#include "common/error.h"
}

#include <arrow/memory_pool.h>
#include <arrow/status.h>
#include <parquet/column_reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>
#include <parquet/schema.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

// The allocations of one open file, capped: a size in a damaged or hostile file cannot make the
// library allocate more than the cap (the allocation fails, the library throws, we name the file).
class CappedPool : public arrow::MemoryPool {
  public:
    explicit CappedPool(int64_t cap) : base_(arrow::default_memory_pool()), cap_(cap) {}
    arrow::Status Allocate(int64_t size, int64_t alignment, uint8_t **out) override {
        if (!reserve(size)) return arrow::Status::OutOfMemory("dfm: Parquet reader memory cap");
        arrow::Status st = base_->Allocate(size, alignment, out);
        if (!st.ok()) used_ -= size;
        return st;
    }
    arrow::Status Reallocate(int64_t old_size, int64_t new_size, int64_t alignment, uint8_t **ptr) override {
        int64_t grow = new_size - old_size;
        if (grow > 0 && !reserve(grow)) return arrow::Status::OutOfMemory("dfm: Parquet reader memory cap");
        arrow::Status st = base_->Reallocate(old_size, new_size, alignment, ptr);
        if (!st.ok() && grow > 0) used_ -= grow;
        if (st.ok() && grow < 0) used_ += grow;
        return st;
    }
    void Free(uint8_t *buffer, int64_t size, int64_t alignment) override {
        base_->Free(buffer, size, alignment);
        used_ -= size;
    }
    int64_t bytes_allocated() const override { return used_; }
    int64_t total_bytes_allocated() const override { return base_->total_bytes_allocated(); }
    int64_t num_allocations() const override { return base_->num_allocations(); }
    std::string backend_name() const override { return base_->backend_name(); }
    bool refused() const { return refused_; }
    int64_t cap() const { return cap_; }

  private:
    bool reserve(int64_t n) {
        if (n < 0) return false;
        int64_t now = used_.load();
        do {
            if (n > cap_ - now) {
                refused_ = true;
                return false;
            }
        } while (!used_.compare_exchange_weak(now, now + n));
        return true;
    }
    arrow::MemoryPool *base_;
    int64_t cap_;
    std::atomic<int64_t> used_{0};
    std::atomic<bool> refused_{false};
};

}  // namespace

struct dfm_parquet {
    explicit dfm_parquet(int64_t cap) : pool(cap) {}
    std::string path;
    CappedPool pool;
    std::unique_ptr<parquet::ParquetFileReader> reader;
    std::shared_ptr<parquet::FileMetaData> md;
    int col = -1;
    int16_t max_def = 0;
    std::vector<uint64_t> offsets;
};

static int fail_exception(const dfm_parquet *p, const char *what, int rg, const std::exception &e) {
    char where[64] = "";
    if (rg >= 0) snprintf(where, sizeof where, ", row group %d", rg);
    if (p->pool.refused())
        return DFM_FAIL(DFM_EFORMAT, "%s%s: reading it would take more than %lld MiB of memory (a page or dictionary that large, or a damaged size). HINT: if the file is sound (pyarrow.parquet.read_table reads it), raise DFM_PARQUET_MAX_MB (now %lld)",
                        p->path.c_str(), where, (long long)(p->pool.cap() >> 20), (long long)(p->pool.cap() >> 20));
    return DFM_FAIL(DFM_EFORMAT, "%s%s: %s: %s. HINT: check the file with pyarrow.parquet.read_table; re-create or re-download it",
                    p->path.c_str(), where, what, e.what());
}

static int check_magic(const char *path, uint64_t bytes) {
    if (bytes < 12)
        return DFM_FAIL(DFM_EFORMAT, "%s: %llu bytes, too short to be a Parquet file (12 bytes at least)", path,
                        (unsigned long long)bytes);
    FILE *fp = fopen(path, "rb");
    char head[4], tail[4];
    int ok = fp && fread(head, 1, 4, fp) == 4 && fseeko(fp, -4, SEEK_END) == 0 && fread(tail, 1, 4, fp) == 4;
    if (fp) fclose(fp);
    if (!ok) return DFM_FAIL(DFM_EIO, "cannot read %s", path);
    if (!memcmp(tail, "PARE", 4))
        return DFM_FAIL(DFM_EUNSUPPORTED, "%s: an encrypted Parquet file (encrypted footer, magic PARE); dfm reads only unencrypted files. HINT: decrypt it first (e.g. pyarrow.parquet with its decryption properties) and write it unencrypted",
                        path);
    if (memcmp(head, "PAR1", 4) || memcmp(tail, "PAR1", 4))
        return DFM_FAIL(DFM_EFORMAT, "%s: not a Parquet file (no PAR1 magic at its start and end)%s", path,
                        memcmp(tail, "PAR1", 4) ? "; a truncated copy?" : "");
    return DFM_OK;
}

extern "C" int dfm_parquet_open(const char *path, uint64_t file_bytes, const char *field, dfm_parquet **out) {
    *out = nullptr;
    DFM_TRY(check_magic(path, file_bytes));
    int64_t cap = (int64_t)DFM_PARQUET_MAX_MEMORY;
    if (const char *e = getenv("DFM_PARQUET_MAX_MB"); e && *e) {
        char *end = nullptr;
        long long mb = strtoll(e, &end, 10);
        if (*end || mb < 1 || mb > (1ll << 30))
            return DFM_FAIL(DFM_EARG, "DFM_PARQUET_MAX_MB='%s' is not a number of MiB between 1 and 2^30", e);
        cap = (int64_t)mb << 20;
    }
    dfm_parquet *p = new (std::nothrow) dfm_parquet(cap);
    if (!p) return DFM_FAIL(DFM_ENOMEM, "no memory");
    p->path = path;
    int rc = DFM_OK;
    try {
        parquet::ReaderProperties props(&p->pool);
        props.enable_buffered_stream();
        props.set_buffer_size(1 << 20);
        props.set_page_checksum_verification(true);
        p->reader = parquet::ParquetFileReader::OpenFile(path, false, props);
        p->md = p->reader->metadata();
    } catch (const std::exception &e) {
        rc = fail_exception(p, "unreadable Parquet footer", -1, e);
    } catch (...) {
        rc = DFM_FAIL(DFM_EFORMAT, "%s: unreadable Parquet footer (unknown exception)", path);
    }
    const parquet::SchemaDescriptor *schema = rc ? nullptr : p->md->schema();
    if (!rc && p->md->is_encryption_algorithm_set())
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: an encrypted Parquet file (plaintext footer, encrypted columns); dfm reads only unencrypted files. HINT: decrypt it first and write it unencrypted",
                      path);
    std::string nested;
    for (int i = 0; !rc && i < schema->num_columns(); i++) {
        std::vector<std::string> v = schema->Column(i)->path()->ToDotVector();
        if (v.size() == 1 && v[0] == field && p->col >= 0) // which one is meant? (pyarrow refuses it too)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: two columns are named \"%s\" (columns %d and %d); dfm cannot tell which holds the text. HINT: rename one when writing the file, or choose another column with --text-field",
                          path, field, p->col, i);
        else if (v.size() == 1 && v[0] == field) p->col = i;
        else if (v.size() > 1 && v[0] == field && nested.empty()) nested = schema->Column(i)->path()->ToDotString();
    }
    if (!rc && p->col < 0) {
        if (!nested.empty())
            rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: column \"%s\" is a list or a struct (its leaf %s), not a top-level string column. HINT: flatten it, or choose another column with --text-field",
                          path, field, nested.c_str());
        else {
            std::string names;
            for (int i = 0; i < schema->group_node()->field_count() && i < 20; i++)
                names += (i ? ", " : "") + schema->group_node()->field(i)->name();
            rc = DFM_FAIL(DFM_ENOTFOUND, "%s: no column \"%s\" (its columns: %s). HINT: choose the column with --text-field",
                          path, field, names.c_str());
        }
    }
    if (!rc) {
        const parquet::ColumnDescriptor *c = schema->Column(p->col);
        auto lt = c->logical_type();
        bool is_string = (lt && lt->is_string()) || c->converted_type() == parquet::ConvertedType::UTF8;
        if (c->max_repetition_level() > 0)
            rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: column \"%s\" is repeated (a list), not a string column. HINT: choose a string column with --text-field",
                          path, field);
        else if (c->physical_type() != parquet::Type::BYTE_ARRAY)
            rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: column \"%s\" holds %s%s%s values, not strings. HINT: choose a string column with --text-field",
                          path, field, parquet::TypeToString(c->physical_type()).c_str(), lt && !lt->is_none() ? " " : "",
                          lt && !lt->is_none() ? lt->ToString().c_str() : "");
        else if (!is_string)
            rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: column \"%s\" is binary (BYTE_ARRAY%s%s), not a string (UTF8/String). HINT: write it as a string column, or choose another with --text-field",
                          path, field, lt && !lt->is_none() ? " " : " without annotation",
                          lt && !lt->is_none() ? lt->ToString().c_str() : "");
        p->max_def = c->max_definition_level();
    }
    // every text column chunk inside the file (before the footer); its start is where the row group lies. An
    // empty row group is valid (pyarrow writes one, with data page offset 0, for an empty table): it has no
    // bytes to check and lies where the one before it does.
    struct span { int64_t start, end; int rg; };
    std::vector<span> spans;
    for (int rg = 0; !rc && rg < p->md->num_row_groups(); rg++) {
        try {
            std::unique_ptr<parquet::RowGroupMetaData> g = p->md->RowGroup(rg);
            if (g->num_rows() == 0) {
                p->offsets.push_back(p->offsets.empty() ? 4 : p->offsets.back());
                continue;
            }
            std::unique_ptr<parquet::ColumnChunkMetaData> cc = g->ColumnChunk(p->col);
            if (cc->crypto_metadata()) {
                rc = DFM_FAIL(DFM_EUNSUPPORTED, "%s: row group %d: column \"%s\" is encrypted; dfm reads only unencrypted files", path, rg, field);
                break;
            }
            int64_t start = cc->data_page_offset();
            if (cc->has_dictionary_page() && cc->dictionary_page_offset() > 0 && cc->dictionary_page_offset() < start)
                start = cc->dictionary_page_offset();
            int64_t len = cc->total_compressed_size();
            if (g->num_rows() < 0 || start < 4 || len < 0 || (uint64_t)start > file_bytes || (uint64_t)len > file_bytes - (uint64_t)start) {
                rc = DFM_FAIL(DFM_EFORMAT, "%s: row group %d: column \"%s\" claims bytes [%lld, +%lld) but the file has %llu (damaged footer)",
                              path, rg, field, (long long)start, (long long)len, (unsigned long long)file_bytes);
                break;
            }
            p->offsets.push_back((uint64_t)start);
            spans.push_back({start, start + len, rg});
        } catch (const std::exception &e) {
            rc = fail_exception(p, "unreadable row group metadata", rg, e);
        } catch (...) {
            rc = DFM_FAIL(DFM_EFORMAT, "%s, row group %d: unreadable row group metadata (unknown exception)", path, rg);
        }
    }
    // no two row groups share text bytes: a file whose row groups all point at one chunk was read once per
    // row group (10,000 row groups of a 382 KB file gave 400,000 documents)
    std::sort(spans.begin(), spans.end(), [](const span &a, const span &b) { return a.start < b.start; });
    for (size_t i = 1; !rc && i < spans.size(); i++)
        if (spans[i].start < spans[i - 1].end)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: row groups %d and %d: their \"%s\" column chunks overlap (bytes [%lld, %lld) and [%lld, %lld)); each row group must have its own bytes (a damaged or hostile file). HINT: re-create the file with a Parquet writer",
                          path, std::min(spans[i - 1].rg, spans[i].rg), std::max(spans[i - 1].rg, spans[i].rg), field,
                          (long long)spans[i - 1].start, (long long)spans[i - 1].end, (long long)spans[i].start,
                          (long long)spans[i].end);
    if (rc) {
        delete p;
        return rc;
    }
    *out = p;
    return DFM_OK;
}

extern "C" void dfm_parquet_close(dfm_parquet *p) { delete p; }

extern "C" int dfm_parquet_row_groups(const dfm_parquet *p) { return (int)p->offsets.size(); }

extern "C" uint64_t dfm_parquet_rows(const dfm_parquet *p, int rg) { return (uint64_t)p->md->RowGroup(rg)->num_rows(); }

extern "C" uint64_t dfm_parquet_offset(const dfm_parquet *p, int rg) { return p->offsets[(size_t)rg]; }

extern "C" int dfm_parquet_read(dfm_parquet *p, int rg, dfm_parquet_value_fn fn, void *user) {
    const int64_t batch = 1024;
    uint64_t rows = 0, row = 0;
    try {
        rows = dfm_parquet_rows(p, rg);
        if (rows == 0) return DFM_OK; // an empty row group: no pages to read (its offsets may be 0)
        std::shared_ptr<parquet::RowGroupReader> g = p->reader->RowGroup(rg);
        std::shared_ptr<parquet::ColumnReader> col = g->Column(p->col);
        auto *br = dynamic_cast<parquet::ByteArrayReader *>(col.get());
        if (!br) return DFM_FAIL(DFM_EINTERNAL, "%s: the text column has no byte-array reader", p->path.c_str());
        std::vector<int16_t> def((size_t)batch);
        std::vector<parquet::ByteArray> vals((size_t)batch);
        while (br->HasNext()) {
            int64_t nvals = 0;
            int64_t nlev = br->ReadBatch(batch, p->max_def ? def.data() : nullptr, nullptr, vals.data(), &nvals);
            if (nlev <= 0) break;
            int64_t v = 0;
            for (int64_t i = 0; i < nlev; i++, row++) {
                if (row >= rows)
                    return DFM_FAIL(DFM_EFORMAT, "%s, row group %d: the pages hold more values than the footer's %llu rows (damaged file)",
                                    p->path.c_str(), rg, (unsigned long long)rows);
                int rc;
                if (p->max_def && def[(size_t)i] < p->max_def) {
                    rc = fn(nullptr, 0, 1, row, user);
                } else {
                    if (v >= nvals)
                        return DFM_FAIL(DFM_EFORMAT, "%s, row group %d, row %llu: definition levels and values disagree (damaged file)",
                                        p->path.c_str(), rg, (unsigned long long)row);
                    rc = fn((const char *)vals[(size_t)v].ptr, vals[(size_t)v].len, 0, row, user);
                    v++;
                }
                if (rc) return rc;
            }
        }
    } catch (const std::exception &e) {
        char what[80];
        snprintf(what, sizeof what, "undecodable data near row %llu", (unsigned long long)row);
        return fail_exception(p, what, rg, e);
    } catch (...) {
        return DFM_FAIL(DFM_EFORMAT, "%s, row group %d: undecodable data near row %llu (unknown exception)", p->path.c_str(), rg,
                        (unsigned long long)row);
    }
    if (row != rows)
        return DFM_FAIL(DFM_EFORMAT, "%s, row group %d: the footer says %llu rows but the pages hold %llu (damaged file)",
                        p->path.c_str(), rg, (unsigned long long)rows, (unsigned long long)row);
    return DFM_OK;
}
