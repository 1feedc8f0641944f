/* half.h — IEEE fp16 and bfloat16 <-> fp32, one implementation for all of dfm (safetensors, embedding
 * shards, target records).
 *
 * fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even; overflow gives inf; NaN stays a quiet NaN
 * with its upper payload bits (as the x86 F16C instruction does, so the scalar and F16C paths of
 * schemas/target_record.c are bit-identical). fp16/bf16 -> fp32 is exact. Pure functions, thread-safe.
 */
#ifndef DFM_HALF_H
#define DFM_HALF_H

#include <stdint.h>

uint16_t dfm_f32_to_f16(float f);
float dfm_f16_to_f32(uint16_t h);
uint16_t dfm_f32_to_bf16(float f);
float dfm_bf16_to_f32(uint16_t h);

#endif
