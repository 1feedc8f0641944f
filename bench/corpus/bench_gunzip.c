/* bench_gunzip.c — which gzip library decompresses dfm's .gz inputs fastest (issue 33's choice).
 *
 *   build/bench/bench_gunzip FILE.gz [ROUNDS]
 *
 * Decompresses FILE.gz (one or more concatenated gzip members) ROUNDS times (default 5) with each
 * library, interleaved round by round: zlib (inflate, streaming), ISA-L (isal_inflate, streaming) and
 * libdeflate (whole-buffer only: it cannot stream, so it is given the whole input and an output buffer
 * as large as the output; dfm's bounded-memory reader could not use it as is). The compressed file is
 * read into memory first, so the figures are decompression alone. Every library must produce the same
 * bytes (length and XXH3 checksum), else the program fails. Prints per library and round: CPU seconds
 * (this thread), wall seconds, decompressed MB/s per CPU-second; then the median.
 */
#include <isa-l/igzip_lib.h>
#include <libdeflate.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>
#include <zlib.h>

#define OUT_CAP (1u << 20)

typedef struct {
    uint64_t bytes;
    XXH64_hash_t hash;
} result;

static double now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int run_zlib(const uint8_t *in, size_t n, uint8_t *out, result *r) {
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + 15) != Z_OK) return 1;
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    r->bytes = 0;
    for (;;) {
        z.next_out = out;
        z.avail_out = OUT_CAP;
        int e = inflate(&z, Z_NO_FLUSH);
        size_t got = OUT_CAP - z.avail_out;
        XXH64_update(h, out, got);
        r->bytes += got;
        if (e == Z_STREAM_END) {
            if (z.avail_in == 0) break;
            inflateReset(&z); /* the next member */
        } else if (e != Z_OK && !(e == Z_BUF_ERROR && got)) {
            fprintf(stderr, "zlib: error %d\n", e);
            return 1;
        }
    }
    inflateEnd(&z);
    r->hash = XXH64_digest(h);
    XXH64_freeState(h);
    return 0;
}

static int run_isal(const uint8_t *in, size_t n, uint8_t *out, result *r) {
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    struct inflate_state *s = malloc(sizeof *s);
    isal_inflate_init(s);
    s->crc_flag = ISAL_GZIP;
    s->next_in = (uint8_t *)in;
    s->avail_in = (uint32_t)n;
    r->bytes = 0;
    for (;;) {
        s->next_out = out;
        s->avail_out = OUT_CAP;
        int e = isal_inflate(s);
        size_t got = OUT_CAP - s->avail_out;
        XXH64_update(h, out, got);
        r->bytes += got;
        if (e != ISAL_DECOMP_OK) {
            fprintf(stderr, "isal: error %d\n", e);
            return 1;
        }
        if (s->block_state == ISAL_BLOCK_FINISH) {
            if (s->avail_in == 0) break;
            uint8_t *ni = s->next_in;
            uint32_t na = s->avail_in;
            isal_inflate_reset(s);
            s->crc_flag = ISAL_GZIP;
            s->next_in = ni;
            s->avail_in = na;
        }
    }
    free(s);
    r->hash = XXH64_digest(h);
    XXH64_freeState(h);
    return 0;
}

static int run_libdeflate(const uint8_t *in, size_t n, uint8_t *big, size_t big_cap, result *r) {
    struct libdeflate_decompressor *d = libdeflate_alloc_decompressor();
    size_t off = 0, pos = 0;
    while (off < n) { /* member by member, each wholly in memory */
        size_t in_used = 0, out_got = 0;
        enum libdeflate_result e = libdeflate_gzip_decompress_ex(d, in + off, n - off, big + pos, big_cap - pos, &in_used, &out_got);
        if (e != LIBDEFLATE_SUCCESS) {
            fprintf(stderr, "libdeflate: error %d\n", (int)e);
            return 1;
        }
        off += in_used;
        pos += out_got;
    }
    libdeflate_free_decompressor(d);
    r->bytes = pos;
    r->hash = XXH64(big, pos, 0);
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE.gz [ROUNDS]\n", argv[0]);
        return 2;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (rounds < 1) rounds = 1;
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) { perror(argv[1]); return 1; }
    fseeko(fp, 0, SEEK_END);
    size_t n = (size_t)ftello(fp);
    rewind(fp);
    uint8_t *in = malloc(n), *out = malloc(OUT_CAP);
    if (!in || !out || fread(in, 1, n, fp) != n) { fprintf(stderr, "cannot read %s\n", argv[1]); return 1; }
    fclose(fp);
    result ref;
    if (run_zlib(in, n, out, &ref)) return 1;
    uint8_t *big = malloc(ref.bytes + 1);
    if (!big) return 1;
    const char *names[3] = {"zlib " ZLIB_VERSION, "isa-l", "libdeflate " LIBDEFLATE_VERSION_STRING};
    double *cpu[3], *wall[3];
    for (int l = 0; l < 3; l++) { cpu[l] = calloc((size_t)rounds, sizeof(double)); wall[l] = calloc((size_t)rounds, sizeof(double)); }
    printf("file %s: %zu compressed bytes, %llu decompressed\n", argv[1], n, (unsigned long long)ref.bytes);
    for (int k = 0; k < rounds; k++) {
        for (int i = 0; i < 3; i++) {
            int l = (i + k) % 3; /* rotate the order each round */
            result r;
            double c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
            int e = l == 0 ? run_zlib(in, n, out, &r) : l == 1 ? run_isal(in, n, out, &r) : run_libdeflate(in, n, big, ref.bytes + 1, &r);
            cpu[l][k] = now(CLOCK_THREAD_CPUTIME_ID) - c0;
            wall[l][k] = now(CLOCK_MONOTONIC) - w0;
            if (e || r.bytes != ref.bytes || r.hash != ref.hash) {
                fprintf(stderr, "%s: output differs from zlib's (%llu bytes)\n", names[l], (unsigned long long)r.bytes);
                return 1;
            }
            printf("round %d %-18s cpu %.3f s  wall %.3f s  %.0f MB/s per CPU-s\n", k, names[l], cpu[l][k], wall[l][k],
                   (double)ref.bytes / 1e6 / cpu[l][k]);
        }
    }
    for (int l = 0; l < 3; l++) {
        qsort(cpu[l], (size_t)rounds, sizeof(double), cmp_d);
        qsort(wall[l], (size_t)rounds, sizeof(double), cmp_d);
        printf("median %-18s cpu %.3f s  wall %.3f s  %.0f MB/s per CPU-s\n", names[l], cpu[l][rounds / 2], wall[l][rounds / 2],
               (double)ref.bytes / 1e6 / cpu[l][rounds / 2]);
    }
    return 0;
}
