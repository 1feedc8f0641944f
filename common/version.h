/* version.h — the dfm version recorded in every manifest and artefact header. */
#ifndef DFM_VERSION_H
#define DFM_VERSION_H
#define DFM_VERSION "0.1.0"
#endif
