/* ivf_lists_kind.h — what FAISS's C API cannot tell about an IVF index: whether its inverted lists are the
 * plain array lists (faiss::ArrayInvertedLists) and whether it has a list scanner, the two things
 * faiss_IndexIVF_search_preassigned and dfm's list sharding (retriever/ivf.c) rely on.
 *
 * Why: FAISS 1.7.3's fast-scan IVF (IVF...,PQ...x4fs) keeps block-packed lists and has no scanner, and
 * IndexIVF::search_preassigned uses the scanner unchecked, so routing such an index there crashes
 * (SIGSEGV); other list kinds (on-disk, block) are not the "ilar" records dfm parses. Implemented in C++
 * (ivf_lists_kind.cc) against the FAISS headers of the library dfm links. */
#ifndef DFM_RETRIEVER_IVF_LISTS_KIND_H
#define DFM_RETRIEVER_IVF_LISTS_KIND_H

#include <faiss/c_api/IndexIVF_c.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if ivf's inverted lists are exactly faiss::ArrayInvertedLists and FAISS returns an inverted-list
 * scanner for it (so search_preassigned can search it); 0 otherwise, also for NULL. Never throws. */
int dfm_ivf_plain_lists(const FaissIndexIVF *ivf);

#ifdef __cplusplus
}
#endif

#endif
