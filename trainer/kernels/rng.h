/* rng.h — the trainer's deterministic RNG (xorshift64*, as llm.c), saved in checkpoints. */
#ifndef DFM_TRAINER_RNG_H
#define DFM_TRAINER_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
    uint64_t state;
} dfm_rng;

static inline void rng_seed(dfm_rng *r, uint64_t seed) { r->state = seed * 0x9E3779B97F4A7C15ull + 1; }
static inline uint32_t rng_u32(dfm_rng *r) {
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return (uint32_t)((r->state * 0x2545F4914F6CDD1Dull) >> 32);
}
/* uniform in [0, 1) */
static inline float rng_f32(dfm_rng *r) { return (rng_u32(r) >> 8) / 16777216.0f; }
/* fill with normal(0, std) (Box-Muller) */
static inline void rng_normal(dfm_rng *r, float *out, size_t n, float std) {
    for (size_t i = 0; i < n; i += 2) {
        double u1 = (rng_u32(r) + 1.0) / 4294967297.0, u2 = rng_u32(r) / 4294967296.0;
        double rad = sqrt(-2.0 * log(u1));
        out[i] = (float)(rad * cos(2 * M_PI * u2)) * std;
        if (i + 1 < n) out[i + 1] = (float)(rad * sin(2 * M_PI * u2)) * std;
    }
}

#endif
