/* half.c — fp16 and bf16 conversions shared by every format that stores half-precision floats. */
#include "schemas/half.h"

#include <string.h>

/* fp32 -> fp16 after F. Giesen's float_to_half_fast3_rtne: normal numbers round by adding
 * 0xfff + (odd mantissa bit) before dropping 13 bits; subnormals by a float add of a magic constant,
 * which the FPU rounds to nearest even. */
uint16_t dfm_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    if (x >= f16max) {
        /* NaN: quiet, upper payload bits kept (as the F16C instruction does); else overflow to inf */
        o = (x > f32infty) ? (uint16_t)(0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00;
    } else if (x < (113u << 23)) {
        float v, m;
        memcpy(&v, &x, 4);
        memcpy(&m, &denorm_magic, 4);
        v += m;
        uint32_t r;
        memcpy(&r, &v, 4);
        o = (uint16_t)(r - denorm_magic);
    } else {
        uint32_t mant_odd = (x >> 13) & 1u;
        x += ((uint32_t)(15 - 127) << 23) + 0xfffu;
        x += mant_odd;
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

float dfm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    float f;
    if (e == 0) {
        f = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
        memcpy(&x, &f, 4);
        x |= sign;
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u); /* NaN comes out quiet, as with F16C */
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &x, 4);
    return f;
}

uint16_t dfm_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float dfm_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

