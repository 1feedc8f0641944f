#include "pipeline/chunk/pack.h"

int dfm_pack_owner(const uint64_t *off, const uint64_t *n, int size, uint64_t S, uint64_t seq) {
    uint64_t pos = seq * S;
    for (int r = 0; r < size; r++)
        if (n[r] && off[r] <= pos && pos < off[r] + n[r]) return r;
    return -1;
}
