/* kvtier C ABI: the Runtime of kvtier.hpp for engines written in C, Rust, Go, Zig or anything
 * with a C FFI, through one shared library (libkvtier.so) whose only exported symbols are the
 * kvt_* functions below (a linker version script, KVTIER_0.1, hides the rest).
 *
 * It mirrors the C++ facade (include/kvtier/kvtier.hpp) call for call; read that header for what
 * each call does to the cache. This header only says how the calls look from C.
 *
 * Conventions:
 *
 * (1) Handles. kvt_runtime and kvt_step are opaque structs, created by one call and freed by its
 *     *_destroy pair. Every handle argument is looked up among the live handles of its type on
 *     entry, so a NULL, destroyed or foreign pointer (a kvt_step* cast to kvt_runtime*) is
 *     KVT_INVALID_ARGUMENT with a message, never a crash. Handle values are opaque tokens, not
 *     addresses, and never reused within a process: a destroyed handle stays invalid even after
 *     new handles are made. They are never dereferenced, yet look like aligned addresses (at
 *     least 0x100000, multiples of 16), so that runtimes which check the pointers they hold
 *     (Go's garbage collector rejects small ones) take them. Sequences and prefix pins are
 *     64-bit ids the runtime hands out; an unknown or closed id is KVT_NOT_FOUND.
 *
 * (2) Errors. Every call that can fail returns a kvt_status: KVT_OK (0) or a negative code that
 *     mirrors kvtier::StatusCode (KVT_INVALID_ARGUMENT = -1 ... KVT_INTERNAL = -12). On failure,
 *     kvt_last_error() returns this thread's message for that call, "<function>: <code name>:
 *     <what was wrong>", naming the key, sequence, step, file or YAML key path involved. Like
 *     errno, a successful call leaves it unchanged. Output parameters are written only on success,
 *     except the counts that say how large a buffer must be (kvt_chain_block_keys). No C++
 *     exception and no abort crosses this boundary: an allocation failure is
 *     KVT_RESOURCE_EXHAUSTED, anything unexpected KVT_INTERNAL.
 *
 * (3) Memory. The caller owns every buffer it passes, as a (pointer, count) pair; a count of 0
 *     allows a NULL pointer. The count of an array passed in (keys, tokens, items, requests,
 *     completions, overrides) is at most UINT32_MAX, as the batch, block and token counts
 *     reported back are 32-bit: a larger one is KVT_INVALID_ARGUMENT naming it, checked before
 *     the array is read. The library keeps no pointer into caller memory after a call
 *     returns. Memory the library hands out is owned by the handle it came from and its
 *     lifetime is written at the call (layer tables: until kvt_step_destroy; the HBM view:
 *     until the runtime is shut down). Nothing is ever to be released with free().
 *
 * (4) Threading. Every function may be called from any thread, on the same handle concurrently,
 *     with the guarantees of kvtier.hpp: calls that change the cache wait for the runtime's loop at
 *     most params.call_timeout_ms (KVT_DEADLINE_EXCEEDED, and no effect, after that);
 *     kvt_step_wait_layer blocks only its caller, at most params.wait_timeout_ms. A shutdown
 *     wakes the kvt_step_wait_layer calls in progress (KVT_CANCELLED), waits for the other calls
 *     in progress on other threads to return (each is bounded) and every later call on that
 *     runtime, or on its steps, is KVT_FAILED_PRECONDITION.
 *
 * (5) Types. Booleans are int32_t (0 false, anything else true). Times are int64_t milliseconds
 *     (timeouts, TTLs) or nanoseconds of CLOCK_MONOTONIC (kvt_clock_now_ns, hints). Timeouts and
 *     TTLs must be > 0 (KVT_INVALID_ARGUMENT naming the field otherwise); one longer than 100
 * years, INT64_MAX included, is taken as 100 years, i.e. no timeout in practice. Block keys are
 *     16-byte values (kvt_block_key), equal to kvtier::BlockKey field for field and byte for byte
 *     across processes and machines (the hash is documented in kvtier/block_key.hpp).
 *
 * (6) Compatibility. The library's SONAME is libkvtier.so.0 and stays so while the ABI only grows:
 *     symbols are versioned (KVTIER_0.1 in runtime/kvtier.map) and a later version adds its
 *     functions in a new version node that inherits this one, so a binary linked against an
 *     older libkvtier.so.0 runs against a newer one. Structs the caller passes in never change
 *     within an ABI version, except kvt_runtime_params, which grows only by appending fields and
 *     says how large the caller's copy is in its first field, struct_size: the caller's sizeof,
 *     written by kvt_runtime_default_params (an inline function, so it is compiled with the
 *     caller's header). The library takes any struct_size from that of the first version
 *     (KVT_RUNTIME_PARAMS_MIN_SIZE) up to its own sizeof, using the defaults for the fields a
 *     smaller (older) struct lacks, and a larger (newer) one when every byte past its own sizeof
 *     is zero, i.e. when the caller set none of the fields it does not know; otherwise
 *     KVT_INVALID_ARGUMENT naming params.struct_size. The struct has no tail padding (an
 *     appended field always changes its size) and a new field's zero means its default.
 *     kvt_version() reports the library actually loaded, which may differ from the KVT_VERSION_*
 *     macros this header was compiled with.
 */
#ifndef KVTIER_KVTIER_H_
#define KVTIER_KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#include "kvtier/version.h"

#if defined(__GNUC__) || defined(__clang__)
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Handles, ids and values ------------------------------------------------------------- */

typedef struct kvt_runtime kvt_runtime;
typedef struct kvt_step kvt_step;

typedef uint64_t kvt_sequence_id;
typedef uint64_t kvt_step_id;
typedef uint64_t kvt_pin_id;

/* Negative error codes; the magnitudes are kvtier::StatusCode's values. */
typedef enum kvt_status {
  KVT_OK = 0,
  KVT_INVALID_ARGUMENT = -1,    /* bad input: a NULL pointer, a stale handle, a bad config key */
  KVT_NOT_FOUND = -2,           /* an unknown sequence, step, pin, key or file */
  KVT_ALREADY_EXISTS = -3,      /* a key or handle that already exists */
  KVT_FAILED_PRECONDITION = -4, /* an illegal transition: a sequence already in a step, a call
                                   after shutdown, a layer table before its layer is ready */
  KVT_RESOURCE_EXHAUSTED = -5,  /* no room: a step that cannot fit in HBM, a pin over quota */
  KVT_OUT_OF_RANGE = -6,        /* an index or count past its bound (a layer, a buffer size) */
  KVT_IO_ERROR = -7,            /* a failed system call or device I/O */
  KVT_DATA_LOSS = -8,           /* a checksum that does not match: the data was dropped */
  KVT_DEADLINE_EXCEEDED = -9,   /* a wait that ran past its deadline */
  KVT_CANCELLED = -10,          /* cancelled by shutdown or by its owner */
  KVT_UNAVAILABLE = -11,        /* a facility not present here (no GPU, io_uring refused) */
  KVT_INTERNAL = -12            /* a broken invariant inside kvtier, reported instead of a crash */
} kvt_status;

typedef enum kvt_tier { KVT_TIER_HBM = 0, KVT_TIER_HOST = 1, KVT_TIER_NVME = 2 } kvt_tier;
#define KVT_NUM_TIERS 3

typedef enum kvt_dtype {
  KVT_DTYPE_F32 = 0,
  KVT_DTYPE_F16 = 1,
  KVT_DTYPE_BF16 = 2,
  KVT_DTYPE_FP8_E4M3 = 3
} kvt_dtype;

/* A 128-bit chained content key of one full block (kvtier/block_key.hpp). */
typedef struct kvt_block_key {
  uint64_t lo;
  uint64_t hi; /* the top 16 bits are the namespace tag */
} kvt_block_key;

/* Runtime options; start from kvt_runtime_default_params(). Versioned by struct_size (convention
 * (6)): fields are only ever appended, each a multiple of 4 bytes on its natural alignment, so
 * that the struct never has tail padding. */
typedef struct kvt_runtime_params {
  uint32_t struct_size;        /* the caller's sizeof(kvt_runtime_params), set by
                                  kvt_runtime_default_params */
  int32_t use_environment;     /* 1: apply KVTIER_* environment variables (as kvtier-bench does);
                                  0: only the YAML and the overrides given. Default 1 */
  int64_t call_timeout_ms;     /* longest wait for the runtime's loop to take a call. 5000 */
  int64_t wait_timeout_ms;     /* longest kvt_step_wait_layer blocks. 30000 */
  int64_t shutdown_timeout_ms; /* longest shutdown waits for transfers. 60000 */
  int32_t persist_on_shutdown; /* 1: write cached blocks to NVMe at shutdown. Default 1 */
  int32_t reserved;            /* must be 0 (fills what would be tail padding) */
} kvt_runtime_params;

/* The struct_size of the first kvt_runtime_params (kvtier 0.1.0), which ended with
 * persist_on_shutdown: the smallest the library takes. */
#define KVT_RUNTIME_PARAMS_MIN_SIZE 36u
/* The largest struct_size the library reads (a newer struct's unknown tail is checked for zeros
 * up to there): a bound on what an uninitialised struct_size makes it read. */
#define KVT_RUNTIME_PARAMS_MAX_SIZE 1024u

/* The model's KV shape. A page is [K|V][page_tokens][kv_heads][head_dim] of one layer. */
typedef struct kvt_geometry {
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t page_tokens;
  int32_t dtype; /* kvt_dtype */
  uint32_t dtype_size;
  uint64_t token_bytes; /* K (or V) of one token of one layer */
  uint64_t page_bytes;  /* 2 * page_tokens * token_bytes */
  uint64_t block_bytes; /* layers * page_bytes */
} kvt_geometry;

/* The cached prefix of a key chain, per tier (the slowest tier each block loads from). */
typedef struct kvt_match {
  uint32_t blocks;
  uint32_t by_tier[KVT_NUM_TIERS];
} kvt_match;

typedef struct kvt_opened_sequence {
  kvt_sequence_id id;
  uint64_t reused_tokens;    /* reused_blocks * page_tokens: prefill starts here */
  uint32_t prompt_blocks;    /* keys given */
  uint32_t matched_blocks;   /* cached prefix found */
  uint32_t reused_blocks;    /* what the sequence reuses */
  uint32_t recompute_blocks; /* matched, but cheaper to recompute than to load */
  uint32_t reused_by_tier[KVT_NUM_TIERS];
} kvt_opened_sequence;

typedef struct kvt_step_item {
  kvt_sequence_id sequence;
  uint32_t new_tokens; /* tokens whose K/V the engine writes this step */
} kvt_step_item;

typedef struct kvt_step_info {
  kvt_step_id id;
  uint32_t layers;
  uint32_t window; /* layers pinned at once (== layers when the batch fits in HBM) */
  int32_t windowed;
  uint32_t batch; /* items, in request order */
} kvt_step_info;

typedef struct kvt_step_item_info {
  kvt_sequence_id sequence;
  uint64_t context_tokens;    /* tokens with K/V before this step; writing starts here */
  uint32_t new_tokens;        /* tokens to write, recomputed_tokens included */
  uint32_t recomputed_tokens; /* given back: a prefix too slow to load, or lost to a failed read */
  uint32_t pages;             /* pages per layer this item reads and writes */
} kvt_step_item_info;

/* One layer's block table, CSR: item i's pages are indices[indptr[i] .. indptr[i+1]), HBM frame
 * indices, the last holding last_page_len[i] tokens. The arrays belong to the step handle. */
typedef struct kvt_layer_table {
  uint32_t batch;
  uint32_t n_indices;
  const int32_t* indptr;        /* [batch + 1] */
  const int32_t* indices;       /* [n_indices] */
  const int32_t* last_page_len; /* [batch] */
} kvt_layer_table;

typedef struct kvt_step_completion {
  kvt_sequence_id sequence;
  /* Keys of the blocks this step filled, in order from the block holding the step's first
   * token (prompt blocks included, which must match); see StepCompletion in step_types.hpp. */
  const kvt_block_key* full_block_keys;
  size_t n_keys;
} kvt_step_completion;

typedef struct kvt_hinted_request {
  uint64_t request_id;
  int64_t expected_start_ns; /* CLOCK_MONOTONIC, see kvt_clock_now_ns */
  const kvt_block_key* keys;
  size_t n_keys;
} kvt_hinted_request;

/* Frame f of the HBM arena starts at base + f * frame_stride and holds one page. */
typedef struct kvt_hbm_view {
  void* base;
  uint64_t frame_stride;
  uint64_t page_bytes;
  uint32_t frames;
  int32_t on_device; /* 1: CUDA device memory; 0: host memory (emulated HBM) */
} kvt_hbm_view;

/* Counters; each exact on its own, not one atomic cut. Arrays are indexed by kvt_tier. */
typedef struct kvt_stats {
  uint64_t lookup_tokens;
  uint64_t hit_tokens[KVT_NUM_TIERS];
  uint64_t used_bytes[KVT_NUM_TIERS];
  uint64_t capacity_bytes[KVT_NUM_TIERS];
  uint64_t promotions[KVT_NUM_TIERS];
  uint64_t demotions[KVT_NUM_TIERS];
  uint64_t evictions[KVT_NUM_TIERS];
  uint64_t recompute_tokens;
  uint64_t stall_nanos;
  uint64_t late_prefetches;
  uint64_t failed_loads;
  uint64_t checksum_failures;
  uint64_t io_errors;
  uint64_t nvme_recovered_blocks;
  uint64_t open_sequences;
  uint64_t pinned_prefix_blocks;
} kvt_stats;

/* kvtier's log lines (level 0 debug, 1 info, 2 warn, 3 error), called from any kvtier thread. */
typedef void (*kvt_log_fn)(int32_t level, const char* message, void* user);

/* ---- Version, errors, logging ------------------------------------------------------------ */

/* "MAJOR.MINOR.PATCH" of the loaded library; a static string. */
KVT_API const char* kvt_version(void);
/* MAJOR * 10000 + MINOR * 100 + PATCH of the loaded library (compare with KVT_VERSION_NUMBER). */
KVT_API int kvt_version_number(void);
/* This thread's message for its last failed call ("" when none failed yet). Valid until the next
 * failing kvt_* call on this thread. */
KVT_API const char* kvt_last_error(void);
/* "ok", "invalid_argument", ... ; "unknown" for a value that is no kvt_status. A static string. */
KVT_API const char* kvt_status_name(kvt_status status);
/* Routes log lines to `fn` (NULL restores stderr). `fn` must be thread-safe and must not call
 * back into kvt_*. */
KVT_API void kvt_set_log_callback(kvt_log_fn fn, void* user);
/* Drops log lines below `level` (0..3); KVT_INVALID_ARGUMENT outside that range. */
KVT_API kvt_status kvt_set_log_level(int32_t level);
/* Now on the runtime's clock (CLOCK_MONOTONIC), in nanoseconds: the base of hint start times. */
KVT_API int64_t kvt_clock_now_ns(void);

/* ---- Block keys (no runtime needed) ------------------------------------------------------ */

/* Keys of every full block of `tokens` (n_tokens / block_tokens of them) in `key_namespace`.
 * *n_keys receives the number of keys, also when `capacity` is too small (KVT_OUT_OF_RANGE), so
 * a first call with capacity 0 sizes the buffer. */
KVT_API kvt_status kvt_chain_block_keys(const char* key_namespace, const uint32_t* tokens,
                                        size_t n_tokens, uint32_t block_tokens, kvt_block_key* keys,
                                        size_t capacity, size_t* n_keys);
/* 32 lower-case hex digits (hi then lo) and a NUL: `buf_size` must be at least 33
 * (KVT_OUT_OF_RANGE, the message giving the size needed, for a smaller one, NULL with 0 too). */
KVT_API kvt_status kvt_block_key_format(const kvt_block_key* key, char* buf, size_t buf_size);

/* ---- Runtime: create, destroy, describe --------------------------------------------------- */

/* Writes the defaults into the first `struct_size` bytes of `*params` (zeros past the library's
 * own sizeof) and sets params->struct_size to `struct_size`; writes nothing past them.
 * KVT_INVALID_ARGUMENT, writing nothing, for a NULL `params` or a `struct_size` outside
 * [KVT_RUNTIME_PARAMS_MIN_SIZE, KVT_RUNTIME_PARAMS_MAX_SIZE]. Call kvt_runtime_default_params. */
KVT_API kvt_status kvt_runtime_default_params_sized(kvt_runtime_params* params, size_t struct_size);
/* The defaults, for a struct of this header's size. Inline, so sizeof is the caller's (a binary
 * built against an older, smaller header never gets a larger struct written over its own). */
static inline void kvt_runtime_default_params(kvt_runtime_params* params) {
  (void)kvt_runtime_default_params_sized(params, sizeof(kvt_runtime_params));
}
/* Opens a runtime from a YAML file over the embedded default, then `overrides` ("key.path=value",
 * YAML values, the last one winning). `params` may be NULL (defaults). */
KVT_API kvt_status kvt_runtime_open_file(const char* yaml_path, const char* const* overrides,
                                         size_t n_overrides, const kvt_runtime_params* params,
                                         kvt_runtime** out);
/* The same from YAML text (NUL-terminated; "" is the embedded default alone). Error locations name
 * the text as "<yaml text>:line:col". */
KVT_API kvt_status kvt_runtime_open_yaml(const char* yaml_text, const char* const* overrides,
                                         size_t n_overrides, const kvt_runtime_params* params,
                                         kvt_runtime** out);
/* Finishes or cancels transfers, persists cached blocks (params.persist_on_shutdown) and stops
 * the runtime; the handle stays valid and every later call on it is KVT_FAILED_PRECONDITION.
 * Idempotent. KVT_DEADLINE_EXCEEDED when transfers outlived shutdown_timeout_ms (cancelled). */
KVT_API kvt_status kvt_runtime_shutdown(kvt_runtime* runtime);
/* Shuts down (when not yet done) and frees the handle. Steps made by it must still be destroyed
 * (calls on them then fail). NULL is a no-op returning KVT_OK, as free(NULL) is. */
KVT_API kvt_status kvt_runtime_destroy(kvt_runtime* runtime);

KVT_API kvt_status kvt_runtime_geometry(const kvt_runtime* runtime, kvt_geometry* out);
/* Where the HBM frames are. `base` is valid until the runtime is shut down; when on_device is 1
 * it is a CUDA device pointer. */
KVT_API kvt_status kvt_runtime_hbm_view(const kvt_runtime* runtime, kvt_hbm_view* out);
KVT_API kvt_status kvt_runtime_stats(const kvt_runtime* runtime, kvt_stats* out);
/* One counter by name: any field of kvt_stats ("stall_nanos", "hit_tokens") and those added since
 * that struct was fixed ("hinted_loads", "hinted_loads_reused": blocks the waiting queue's hints
 * brought into hbm and host memory ahead of their request, and of those the blocks a request
 * reused). The names and values are those of the Python binding's stats() dict. A counter kept
 * per tier fills out[KVT_TIER_*] and sets *per_tier (when not NULL) to 1; one that is not fills
 * out[0], zeroes the rest and sets it to 0. KVT_NOT_FOUND for a name that is no counter. */
KVT_API kvt_status kvt_runtime_counter(const kvt_runtime* runtime, const char* name,
                                       uint64_t out[KVT_NUM_TIERS], int32_t* per_tier);
/* The port the metrics endpoint listens on (0 when metrics are off). */
KVT_API kvt_status kvt_runtime_metrics_port(const kvt_runtime* runtime, uint16_t* port);
/* Checks kvtier's own invariants between two of its decisions (every frame owned by one copy,
 * counts equal to a recount, each tier's eviction policy tracking exactly the blocks it holds).
 * KVT_INTERNAL names the first broken one. Walks the whole page table: for tests and debugging. */
KVT_API kvt_status kvt_runtime_audit(kvt_runtime* runtime);

/* Keys in the runtime's namespace (config model.namespace, or the model name); sized as
 * kvt_chain_block_keys. */
KVT_API kvt_status kvt_runtime_block_keys(const kvt_runtime* runtime, const uint32_t* tokens,
                                          size_t n_tokens, kvt_block_key* keys, size_t capacity,
                                          size_t* n_keys);
/* The key of one full block (page_tokens tokens) after `parent` (a key or the namespace root). */
KVT_API kvt_status kvt_runtime_block_key(const kvt_runtime* runtime, const kvt_block_key* parent,
                                         const uint32_t* block_tokens, size_t n_tokens,
                                         kvt_block_key* out);
KVT_API kvt_status kvt_runtime_namespace_root(const kvt_runtime* runtime, kvt_block_key* out);

/* ---- Cache ---------------------------------------------------------------------------------- */

/* The cached prefix of `keys`, per tier. A peek: counts no lookup or hit and takes no references
   (kvt_sequence_open counts the request once). */
KVT_API kvt_status kvt_runtime_match(kvt_runtime* runtime, const kvt_block_key* keys, size_t n_keys,
                                     kvt_match* out);
/* Opens a sequence over a prompt's keys, reusing (and starting to load) its cached prefix. */
KVT_API kvt_status kvt_sequence_open(kvt_runtime* runtime, const kvt_block_key* keys, size_t n_keys,
                                     kvt_opened_sequence* out);
/* Releases the sequence; its full blocks stay cached until evicted. */
KVT_API kvt_status kvt_sequence_close(kvt_runtime* runtime, kvt_sequence_id sequence);
/* kvt_sequence_close, telling the policies how many tokens the request generated after its prompt
   (the lookahead policy learns from it which prompts come back). */
KVT_API kvt_status kvt_sequence_finish(kvt_runtime* runtime, kvt_sequence_id sequence,
                                       uint64_t generated_tokens);
/* The requests waiting in the engine's queue, in the order they will start (replaces the previous
 * hint: hint the whole queue whenever it changes). */
KVT_API kvt_status kvt_runtime_hint(kvt_runtime* runtime, const kvt_hinted_request* requests,
                                    size_t n_requests);
/* Keeps the cached blocks of `keys` in HBM until kvt_prefix_unpin or `ttl_ms` passes, within the
 * pin quota (KVT_RESOURCE_EXHAUSTED over it; KVT_NOT_FOUND when a key is not cached). */
KVT_API kvt_status kvt_prefix_pin(kvt_runtime* runtime, const kvt_block_key* keys, size_t n_keys,
                                  int64_t ttl_ms, kvt_pin_id* out);
KVT_API kvt_status kvt_prefix_unpin(kvt_runtime* runtime, kvt_pin_id pin);

/* ---- Steps ---------------------------------------------------------------------------------
 * begin -> for each layer: wait_layer, layer_table, (write K/V, attention), end_layer -> end (or
 * abort) -> destroy. end_layer is required for every layer of a windowed step: a windowed step
 * pins `window` layers at a time, so a layer's frames belong to it only between its wait_layer
 * and its end_layer; the table's arrays stay readable after that, but name frames that may
 * already hold other pages. */

/* Pins what `items` read and write this step and schedules the loads still needed. */
KVT_API kvt_status kvt_step_begin(kvt_runtime* runtime, const kvt_step_item* items, size_t n_items,
                                  kvt_step** out);
KVT_API kvt_status kvt_step_get_info(const kvt_step* step, kvt_step_info* out);
/* Batch item `index` (request order); KVT_OUT_OF_RANGE past the batch. */
KVT_API kvt_status kvt_step_get_item(const kvt_step* step, size_t index, kvt_step_item_info* out);
/* Blocks until the layer's pages are in HBM: KVT_OK, the load's error (the layer must then be
 * recomputed), KVT_UNAVAILABLE when a failed NVMe write or read, or writes to NVMe paused after
 * failing (tiers.nvme.pause_after_failed_writes), left the step without the HBM room it was
 * admitted with, or a read it needs from NVMe finds host memory full of pages only the engine can
 * free, or a block it reuses left NVMe before its read started (another read of it failed, or its
 * drive was taken out of service) (abort it and begin it again: it then fits or is refused at
 * once, and recomputes what it lost),
 * KVT_DEADLINE_EXCEEDED after params.wait_timeout_ms, or sooner when a read it needs from NVMe
 * went unanswered past tiers.nvme.io_timeout_ms (a hung drive; the message says "unanswered":
 * abort the step and begin it again, it then recomputes the block), or KVT_CANCELLED when the step
 * is aborted or the runtime shuts down meanwhile (a shutdown wakes every such wait at once). */
KVT_API kvt_status kvt_step_wait_layer(kvt_step* step, uint32_t layer);
/* The layer's block table: KVT_FAILED_PRECONDITION until wait_layer returned KVT_OK, and once the
 * step has ended or been aborted (after end_layer it is still given, as the Steps note above
 * says). The arrays are owned by the step and valid until kvt_step_destroy, also after the step
 * has ended. */
KVT_API kvt_status kvt_step_layer_table(kvt_step* step, uint32_t layer, kvt_layer_table* out);
/* The engine has read and written `layer`. */
KVT_API kvt_status kvt_step_end_layer(kvt_step* step, uint32_t layer);
/* Unpins, completes what the engine wrote and publishes the blocks it filled. Without a completion
 * for a sequence, the prompt keys given at open name its blocks. */
KVT_API kvt_status kvt_step_end(kvt_step* step, const kvt_step_completion* completions,
                                size_t n_completions);
/* Unpins and forgets what this step would have written. */
KVT_API kvt_status kvt_step_abort(kvt_step* step);
/* Frees the handle, aborting the step first if it was neither ended nor aborted. NULL is a no-op
 * returning KVT_OK. */
KVT_API kvt_status kvt_step_destroy(kvt_step* step);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVTIER_KVTIER_H_ */
