/* fuzz_file.h — the one helper the libFuzzer harnesses share: most dfm parsers take a path, so each
 * input is written to a file in a scratch folder of this process (under $TMPDIR, removed at exit).
 *
 *   const char *p = fuzz_file("x.safetensors", data, size);   // the path, or NULL if it cannot be written
 *
 * Names are relative to the folder; a name with a '/' writes into a subfolder the harness made with
 * fuzz_dir(). Harnesses are single-threaded, so one folder per process is enough.
 */
#ifndef DFM_FUZZ_FILE_H
#define DFM_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static char fuzz_root[512];

static void fuzz_cleanup(void) {
    if (!fuzz_root[0]) return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_root);
    if (system(cmd)) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_root);
}

/* The scratch folder joined with name (static buffer: valid until the next call). */
static const char *fuzz_path(const char *name) {
    static char path[1024];
    if (!fuzz_root[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fuzz_root, sizeof fuzz_root, "%s/dfm-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fuzz_root)) { perror("fuzz: mkdtemp"); abort(); }
        atexit(fuzz_cleanup);
    }
    snprintf(path, sizeof path, "%s/%s", fuzz_root, name);
    return path;
}

/* Make the subfolder name (a model folder, say); returns its path. */
__attribute__((unused)) static const char *fuzz_dir(const char *name) {
    const char *p = fuzz_path(name);
    mkdir(p, 0700);
    return p;
}

/* Write the input to name; returns the path (static buffer) or NULL. */
static const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
    const char *p = fuzz_path(name);
    FILE *f = fopen(p, "wb");
    if (!f) return NULL;
    size_t w = size ? fwrite(data, 1, size, f) : 0;
    if (fclose(f) || w != size) return NULL;
    return p;
}

/* The dfm binary formats guard their bytes with XXH3-64 checksums, which random mutation never gets
 * right: a harness that only fed raw bytes would test the checksum compare and little after it. So the
 * shard harnesses reseal a copy of the input before writing it: for a 128-byte header (chunk,
 * embedding and neighbour shards) the payload checksum at payload_off covers the bytes after the
 * header and the header checksum at 120 covers the 120 bytes before it. The caller frees the copy. */
__attribute__((unused)) static uint8_t *fuzz_reseal_128(const uint8_t *data, size_t size, size_t payload_off) {
    uint8_t *b = malloc(size ? size : 1);
    if (!b) return NULL;
    memcpy(b, data, size);
    if (size >= 128) {
        uint64_t pc = XXH3_64bits(b + 128, size - 128), hc;
        memcpy(b + payload_off, &pc, 8);
        hc = XXH3_64bits(b, 120);
        memcpy(b + 120, &hc, 8);
    }
    return b;
}

#endif
