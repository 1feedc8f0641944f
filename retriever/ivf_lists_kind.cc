// ivf_lists_kind.cc — the C interface of ivf_lists_kind.h over FAISS's C++ classes (the C API's
// FaissIndexIVF is a faiss::IndexIVF).
#include "retriever/ivf_lists_kind.h"

#include <faiss/IndexIVF.h>
#include <faiss/invlists/InvertedLists.h>

#include <memory>
#include <typeinfo>

extern "C" int dfm_ivf_plain_lists(const FaissIndexIVF *civf) {
    if (!civf) return 0;
    const faiss::IndexIVF *ivf = reinterpret_cast<const faiss::IndexIVF *>(civf);
    // exactly the array lists: a subclass may store its lists otherwise
    if (!ivf->invlists || typeid(*ivf->invlists) != typeid(faiss::ArrayInvertedLists)) return 0;
    try {
        std::unique_ptr<faiss::InvertedListScanner> scanner(ivf->get_InvertedListScanner());
        return scanner != nullptr;
    } catch (...) {
        return 0;
    }
}
