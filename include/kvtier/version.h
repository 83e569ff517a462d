/* kvtier version: the single source of truth (CMake reads the project version from here).
 * C-compatible so the C ABI (kvtier.h) and C++ API share it. kvt_version()/kvtier::version() report
 * the version of the library actually linked, which may differ from these compile-time macros. */
#ifndef KVTIER_VERSION_H_
#define KVTIER_VERSION_H_

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 1
#define KVT_VERSION_PATCH 0
#define KVT_VERSION_NUMBER (KVT_VERSION_MAJOR * 10000 + KVT_VERSION_MINOR * 100 + KVT_VERSION_PATCH)

#endif /* KVTIER_VERSION_H_ */
