/* The C ABI end to end, from C11: open a runtime from YAML text over a store in a temporary
 * directory, prefill a prompt by writing K/V bytes into HBM frames through the HBM view, close it,
 * reopen it and find it cached with the same bytes, again after a restart (from NVMe); then bad
 * input — each a clear code and kvt_last_error() text — calls after shutdown, and a shutdown on
 * one thread that wakes a wait_layer blocked on another.
 * Exit status: 0 all checks passed, 1 a check failed, 77 skipped (the NVMe store cannot be
 * opened here). */
#define _XOPEN_SOURCE 700

#include <ftw.h>
#include <kvtier/kvtier.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kSkip = 77, kBlocks = 6, kPageTokens = 16, kTokens = kBlocks * kPageTokens };

static int failures = 0;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* A call that must succeed; on failure the test cannot go on meaningfully. */
#define MUST(call)                                                              \
  do {                                                                          \
    kvt_status must_status_ = (call);                                           \
    if (must_status_ != KVT_OK) {                                               \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, \
              kvt_status_name(must_status_), kvt_last_error());                 \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* A call that must fail with `code`, naming `function` and containing `text`. */
static void expect_error(int line, kvt_status got, kvt_status code, const char* function,
                         const char* text) {
  const char* message = kvt_last_error();
  if (got != code) {
    fprintf(stderr, "%s:%d: expected %s, got %s (%s)\n", __FILE__, line, kvt_status_name(code),
            kvt_status_name(got), message);
    ++failures;
    return;
  }
  if (strncmp(message, function, strlen(function)) != 0 ||
      strstr(message, kvt_status_name(code)) == NULL || strstr(message, text) == NULL) {
    fprintf(stderr, "%s:%d: the message \"%s\" should start with %s, name %s and say \"%s\"\n",
            __FILE__, line, message, function, kvt_status_name(code), text);
    ++failures;
  }
}
#define EXPECT_ERROR(call, code, function, text) \
  expect_error(__LINE__, (call), (code), (function), (text))

/* The K/V bytes a token contributes to a page: a function of its content and position only. */
static uint8_t kv_byte(uint32_t token, uint64_t position, uint32_t layer, int value, size_t i) {
  uint64_t x = ((uint64_t)token << 32) ^ (position * 0x9E3779B97F4A7C15ull) ^
               ((uint64_t)layer << 56) ^ (value ? 0xABCDull : 0) ^ (i * 0x2545F491ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return (uint8_t)x;
}

static uint8_t* token_slot(const kvt_hbm_view* view, const kvt_geometry* g,
                           const kvt_layer_table* t, uint32_t item, uint64_t pos, int value) {
  const int32_t frame = t->indices[t->indptr[item] + (int32_t)(pos / g->page_tokens)];
  uint8_t* page = (uint8_t*)view->base + (size_t)frame * view->frame_stride;
  const size_t slot = (size_t)(pos % g->page_tokens) + (value ? g->page_tokens : 0);
  return page + slot * g->token_bytes;
}

static void write_tokens(const kvt_hbm_view* view, const kvt_geometry* g, const kvt_layer_table* t,
                         uint32_t layer, const uint32_t* tokens, uint64_t first, uint64_t count) {
  for (uint64_t pos = first; pos < first + count; ++pos) {
    for (int value = 0; value < 2; ++value) {
      uint8_t* dst = token_slot(view, g, t, 0, pos, value);
      for (size_t i = 0; i < g->token_bytes; ++i)
        dst[i] = kv_byte(tokens[pos], pos, layer, value, i);
    }
  }
}

/* The first position in [0, count) whose bytes differ, or -1. */
static int64_t check_tokens(const kvt_hbm_view* view, const kvt_geometry* g,
                            const kvt_layer_table* t, uint32_t layer, const uint32_t* tokens,
                            uint64_t count) {
  for (uint64_t pos = 0; pos < count; ++pos) {
    for (int value = 0; value < 2; ++value) {
      const uint8_t* src = token_slot(view, g, t, 0, pos, value);
      for (size_t i = 0; i < g->token_bytes; ++i) {
        if (src[i] != kv_byte(tokens[pos], pos, layer, value, i)) return (int64_t)pos;
      }
    }
  }
  return -1;
}

/* One step for one sequence: checks the `context` tokens already there, writes `n_new` more. */
static void run_step(kvt_runtime* rt, kvt_sequence_id seq, const uint32_t* tokens, uint64_t context,
                     uint32_t n_new) {
  kvt_geometry g;
  kvt_hbm_view view;
  MUST(kvt_runtime_geometry(rt, &g));
  MUST(kvt_runtime_hbm_view(rt, &view));
  CHECK(view.on_device == 0, "the test writes frames from the CPU");
  const kvt_step_item item = {seq, n_new};
  kvt_step* step = NULL;
  MUST(kvt_step_begin(rt, &item, 1, &step));
  kvt_step_info info;
  MUST(kvt_step_get_info(step, &info));
  kvt_step_item_info item_info;
  MUST(kvt_step_get_item(step, 0, &item_info));
  CHECK(item_info.context_tokens == context, "context %llu, expected %llu",
        (unsigned long long)item_info.context_tokens, (unsigned long long)context);
  CHECK(info.batch == 1 && info.layers == g.layers, "batch %u layers %u", info.batch, info.layers);
  for (uint32_t l = 0; l < info.layers; ++l) {
    MUST(kvt_step_wait_layer(step, l));
    kvt_layer_table table;
    MUST(kvt_step_layer_table(step, l, &table));
    CHECK(table.batch == 1 && table.indptr[1] - table.indptr[0] == (int32_t)item_info.pages,
          "layer %u: %u items, %d pages", l, table.batch, table.indptr[1] - table.indptr[0]);
    const int64_t bad = check_tokens(&view, &g, &table, l, tokens, context);
    CHECK(bad < 0, "layer %u: token %lld differs from what was written", l, (long long)bad);
    write_tokens(&view, &g, &table, l, tokens, context, n_new);
    MUST(kvt_step_end_layer(step, l));
  }
  MUST(kvt_step_end(step, NULL, 0));
  MUST(kvt_step_destroy(step));
}

static char yaml[4096];

static kvt_status open_runtime(kvt_runtime** rt) {
  static const char* overrides[] = {"policies.pin_quota=0.5", "metrics.listen=off"};
  kvt_runtime_params params;
  kvt_runtime_default_params(&params);
  params.use_environment = 0;
  return kvt_runtime_open_yaml(yaml, overrides, 2, &params, rt);
}

/* Called from kvtier's threads. */
static atomic_int log_lines = 0;
/* Opens a sequence whose prompt is the first block of `tokens`; `keys` (kBlocks of them) gets the
 * keys of every block of `tokens`. */
static kvt_opened_sequence open_one_block(kvt_runtime* rt, const uint32_t* tokens,
                                          kvt_block_key* keys) {
  size_t n_keys = 0;
  MUST(kvt_runtime_block_keys(rt, tokens, kTokens, keys, kBlocks, &n_keys));
  kvt_opened_sequence seq;
  MUST(kvt_sequence_open(rt, keys, 1, &seq));
  return seq;
}

static void count_log_lines(int32_t level, const char* message, void* user) {
  (void)level;
  (void)message;
  atomic_fetch_add((atomic_int*)user, 1);
}

static int remove_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void test_version_and_keys(void) {
  char expected[64];
  snprintf(expected, sizeof expected, "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
           KVT_VERSION_PATCH);
  CHECK(strcmp(kvt_version(), expected) == 0, "kvt_version() %s, header %s", kvt_version(),
        expected);
  CHECK(kvt_version_number() == KVT_VERSION_NUMBER, "%d", kvt_version_number());
  CHECK(strcmp(kvt_status_name(KVT_NOT_FOUND), "not_found") == 0, "%s",
        kvt_status_name(KVT_NOT_FOUND));
  CHECK(strcmp(kvt_status_name((kvt_status)5), "unknown") == 0, "a positive code");

  uint32_t tokens[40];
  for (uint32_t i = 0; i < 40; ++i) tokens[i] = i * 7u + 1u;
  size_t n = 0;
  EXPECT_ERROR(kvt_chain_block_keys("ns", tokens, 40, 16, NULL, 0, &n), KVT_OUT_OF_RANGE,
               "kvt_chain_block_keys", "2 are needed");
  CHECK(n == 2, "a short buffer still reports the count (%zu)", n);
  kvt_block_key keys[2];
  MUST(kvt_chain_block_keys("ns", tokens, 40, 16, keys, 2, &n));
  CHECK(keys[0].lo != keys[1].lo || keys[0].hi != keys[1].hi, "chained keys differ");
  CHECK((keys[0].hi >> 48) == (keys[1].hi >> 48) && (keys[0].hi >> 48) != 0,
        "one namespace tag, never 0");
  char text[33];
  EXPECT_ERROR(kvt_block_key_format(&keys[0], text, 10), KVT_OUT_OF_RANGE, "kvt_block_key_format",
               "33 bytes");
  /* Convention (3): a count of 0 allows NULL, so this is a buffer that is too small. */
  EXPECT_ERROR(kvt_block_key_format(&keys[0], NULL, 0), KVT_OUT_OF_RANGE, "kvt_block_key_format",
               "33 bytes");
  EXPECT_ERROR(kvt_block_key_format(&keys[0], NULL, 33), KVT_INVALID_ARGUMENT,
               "kvt_block_key_format", "buf is NULL");
  MUST(kvt_block_key_format(&keys[0], text, sizeof text));
  CHECK(strlen(text) == 32, "%s", text);
  EXPECT_ERROR(kvt_chain_block_keys(NULL, tokens, 40, 16, keys, 2, &n), KVT_INVALID_ARGUMENT,
               "kvt_chain_block_keys", "key_namespace is NULL");
  EXPECT_ERROR(kvt_chain_block_keys("ns", NULL, 40, 16, keys, 2, &n), KVT_INVALID_ARGUMENT,
               "kvt_chain_block_keys", "tokens is NULL");
  EXPECT_ERROR(kvt_set_log_level(7), KVT_INVALID_ARGUMENT, "kvt_set_log_level", "level 7");
}

static void test_bad_configs(void) {
  kvt_runtime* rt = NULL;
  kvt_runtime_params params;
  kvt_runtime_default_params(&params);
  params.use_environment = 0;
  EXPECT_ERROR(kvt_runtime_open_yaml("tiers:\n  host:\n    capcity: 1GiB\n", NULL, 0, &params, &rt),
               KVT_INVALID_ARGUMENT, "kvt_runtime_open_yaml",
               "<yaml text>:3:5: tiers.host.capcity");
  const char* bad_override[] = {"tiers.host.capacity=abc"};
  EXPECT_ERROR(kvt_runtime_open_yaml("", bad_override, 1, &params, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "tiers.host.capacity=abc");
  const char* null_override[] = {NULL};
  EXPECT_ERROR(kvt_runtime_open_yaml("", null_override, 1, &params, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "overrides[0] is NULL");
  EXPECT_ERROR(kvt_runtime_open_file("/nonexistent/kvtier.yaml", NULL, 0, &params, &rt),
               KVT_NOT_FOUND, "kvt_runtime_open_file", "/nonexistent/kvtier.yaml");
  kvt_runtime_params zeroed;
  memset(&zeroed, 0, sizeof zeroed);
  EXPECT_ERROR(kvt_runtime_open_yaml("", NULL, 0, &zeroed, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "kvt_runtime_default_params");
  params.wait_timeout_ms = 0;
  EXPECT_ERROR(kvt_runtime_open_yaml("", NULL, 0, &params, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "params.wait_timeout_ms is 0");
  kvt_runtime_default_params(&params);
  params.use_environment = 0;
  params.call_timeout_ms = -1;
  EXPECT_ERROR(kvt_runtime_open_yaml("", NULL, 0, &params, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "params.call_timeout_ms is -1");
  EXPECT_ERROR(kvt_runtime_open_yaml(NULL, NULL, 0, NULL, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "yaml_text is NULL");
  CHECK(rt == NULL, "no handle comes out of a failed open");
}

/* INT64_MAX milliseconds (the usual "never time out") is a very long wait, not one overflowed into
 * a negative number of nanoseconds: calls are taken, a pin with that TTL holds, shutdown waits for
 * its (idle) transfers and succeeds. */
static void test_largest_timeouts(const uint32_t* tokens) {
  const char* overrides[] = {"tiers.nvme.enabled=false", "metrics.listen=off",
                             "policies.pin_quota=0.5"};
  kvt_runtime_params params;
  kvt_runtime_default_params(&params);
  params.use_environment = 0;
  params.call_timeout_ms = INT64_MAX;
  params.wait_timeout_ms = INT64_MAX;
  params.shutdown_timeout_ms = INT64_MAX;
  kvt_runtime* rt = NULL;
  MUST(kvt_runtime_open_yaml(yaml, overrides, 3, &params, &rt));
  kvt_block_key keys[kBlocks];
  size_t n_keys = 0;
  MUST(kvt_runtime_block_keys(rt, tokens, kTokens, keys, kBlocks, &n_keys));
  kvt_opened_sequence seq;
  MUST(kvt_sequence_open(rt, keys, 2, &seq));
  run_step(rt, seq.id, tokens, 0, 2 * kPageTokens);
  MUST(kvt_sequence_close(rt, seq.id));
  kvt_pin_id pin = 0;
  MUST(kvt_prefix_pin(rt, keys, 2, INT64_MAX, &pin));
  kvt_stats stats;
  MUST(kvt_runtime_stats(rt, &stats));
  CHECK(stats.pinned_prefix_blocks == 2, "%llu pinned blocks",
        (unsigned long long)stats.pinned_prefix_blocks);
  EXPECT_ERROR(kvt_prefix_pin(rt, keys, 2, -3, &pin), KVT_INVALID_ARGUMENT, "kvt_prefix_pin",
               "ttl_ms is -3");
  MUST(kvt_prefix_unpin(rt, pin));
  MUST(kvt_runtime_shutdown(rt));
  MUST(kvt_runtime_destroy(rt));
}

/* Prefill, close, reopen and find the prompt cached (bytes equal); pins and hints. */
static void test_prefill_and_reuse(kvt_runtime* rt, const uint32_t* tokens) {
  kvt_geometry g;
  MUST(kvt_runtime_geometry(rt, &g));
  CHECK(g.layers == 4 && g.page_tokens == kPageTokens && g.dtype == KVT_DTYPE_BF16 &&
            g.page_bytes == 8192,
        "geometry from the YAML text: %u layers, %u page tokens, %llu page bytes", g.layers,
        g.page_tokens, (unsigned long long)g.page_bytes);

  size_t n_keys = 0;
  kvt_block_key keys[kBlocks];
  MUST(kvt_runtime_block_keys(rt, tokens, kTokens, keys, kBlocks, &n_keys));
  CHECK(n_keys == kBlocks, "%zu keys", n_keys);
  kvt_block_key root;
  kvt_block_key first;
  MUST(kvt_runtime_namespace_root(rt, &root));
  MUST(kvt_runtime_block_key(rt, &root, tokens, kPageTokens, &first));
  CHECK(first.lo == keys[0].lo && first.hi == keys[0].hi, "block_key(root) == block_keys[0]");

  kvt_opened_sequence seq;
  MUST(kvt_sequence_open(rt, keys, kBlocks, &seq));
  CHECK(seq.reused_blocks == 0 && seq.prompt_blocks == kBlocks, "a cold cache reuses nothing");
  run_step(rt, seq.id, tokens, 0, kTokens);
  MUST(kvt_sequence_close(rt, seq.id));

  kvt_match m;
  MUST(kvt_runtime_match(rt, keys, kBlocks, &m));
  CHECK(m.blocks == kBlocks, "the closed prompt is cached (%u blocks)", m.blocks);
  MUST(kvt_sequence_open(rt, keys, kBlocks, &seq));
  CHECK(seq.reused_blocks == kBlocks && seq.reused_tokens == kTokens, "reused %u blocks",
        seq.reused_blocks);
  run_step(rt, seq.id, tokens, seq.reused_tokens, 1); /* reads the reused bytes back */
  /* Closed telling how much the request generated (one token): as kvt_sequence_close. */
  MUST(kvt_sequence_finish(rt, seq.id, 1));
  EXPECT_ERROR(kvt_sequence_finish(rt, seq.id, 1), KVT_NOT_FOUND, "kvt_sequence_finish", "");
  MUST(kvt_runtime_match(rt, keys, kBlocks, &m));
  CHECK(m.blocks == kBlocks, "the finished prompt stays cached (%u blocks)", m.blocks);

  kvt_pin_id pin = 0;
  MUST(kvt_prefix_pin(rt, keys, kBlocks, 60000, &pin));
  kvt_stats stats;
  MUST(kvt_runtime_stats(rt, &stats));
  CHECK(stats.pinned_prefix_blocks == kBlocks, "%llu pinned blocks",
        (unsigned long long)stats.pinned_prefix_blocks);
  MUST(kvt_prefix_unpin(rt, pin));
  EXPECT_ERROR(kvt_prefix_unpin(rt, pin), KVT_NOT_FOUND, "kvt_prefix_unpin", "");
  EXPECT_ERROR(kvt_prefix_pin(rt, keys, kBlocks, 0, &pin), KVT_INVALID_ARGUMENT, "kvt_prefix_pin",
               "ttl_ms is 0");

  const kvt_hinted_request waiting = {42, kvt_clock_now_ns() + 1000000, keys, kBlocks};
  MUST(kvt_runtime_hint(rt, &waiting, 1));
  MUST(kvt_runtime_hint(rt, NULL, 0));

  MUST(kvt_runtime_stats(rt, &stats));
  CHECK(stats.open_sequences == 0, "%llu open", (unsigned long long)stats.open_sequences);
  CHECK(stats.hit_tokens[KVT_TIER_HBM] + stats.hit_tokens[KVT_TIER_HOST] +
                stats.hit_tokens[KVT_TIER_NVME] >=
            kTokens,
        "the reuse was counted as hits");
  for (int t = 0; t < KVT_NUM_TIERS; ++t) {
    CHECK(stats.used_bytes[t] <= stats.capacity_bytes[t], "tier %d over capacity", t);
  }

  /* Counters by name: the fields of kvt_stats read the same, and the ones added since. */
  uint64_t counter[KVT_NUM_TIERS] = {7, 7, 7};
  int32_t per_tier = -1;
  MUST(kvt_runtime_counter(rt, "hit_tokens", counter, &per_tier));
  CHECK(per_tier == 1, "hit_tokens is kept per tier (%d)", per_tier);
  for (int t = 0; t < KVT_NUM_TIERS; ++t) {
    CHECK(counter[t] == stats.hit_tokens[t], "hit_tokens[%d] %llu, kvt_stats %llu", t,
          (unsigned long long)counter[t], (unsigned long long)stats.hit_tokens[t]);
  }
  MUST(kvt_runtime_counter(rt, "open_sequences", counter, &per_tier));
  CHECK(per_tier == 0 && counter[0] == stats.open_sequences && counter[1] == 0 && counter[2] == 0,
        "open_sequences %llu (per tier %d)", (unsigned long long)counter[0], per_tier);
  /* The waiting prefix was in HBM already: the hint loaded nothing. */
  MUST(kvt_runtime_counter(rt, "hinted_loads", counter, NULL));
  CHECK(counter[KVT_TIER_HBM] == 0 && counter[KVT_TIER_HOST] == 0, "hinted loads %llu / %llu",
        (unsigned long long)counter[KVT_TIER_HBM], (unsigned long long)counter[KVT_TIER_HOST]);
  MUST(kvt_runtime_counter(rt, "hinted_loads_reused", counter, NULL));
  EXPECT_ERROR(kvt_runtime_counter(rt, "hit_rate", counter, NULL), KVT_NOT_FOUND,
               "kvt_runtime_counter", "no counter is named 'hit_rate' (there are lookup_tokens, ");
  EXPECT_ERROR(kvt_runtime_counter(rt, NULL, counter, NULL), KVT_INVALID_ARGUMENT,
               "kvt_runtime_counter", "name is NULL");
  EXPECT_ERROR(kvt_runtime_counter(rt, "io_errors", NULL, NULL), KVT_INVALID_ARGUMENT,
               "kvt_runtime_counter", "out is NULL");
  MUST(kvt_runtime_audit(rt));
}

static void test_bad_input(kvt_runtime* rt, const uint32_t* tokens) {
  kvt_block_key keys[kBlocks];
  size_t n_keys = 0;
  MUST(kvt_runtime_block_keys(rt, tokens, kTokens, keys, kBlocks, &n_keys));

  /* Unknown and closed sequences. */
  EXPECT_ERROR(kvt_sequence_close(rt, 12345), KVT_NOT_FOUND, "kvt_sequence_close", "12345");
  kvt_opened_sequence seq;
  MUST(kvt_sequence_open(rt, keys, 2, &seq));
  MUST(kvt_sequence_close(rt, seq.id));
  EXPECT_ERROR(kvt_sequence_close(rt, seq.id), KVT_NOT_FOUND, "kvt_sequence_close", "");
  kvt_step* step = NULL;
  const kvt_step_item closed = {seq.id, 1};
  EXPECT_ERROR(kvt_step_begin(rt, &closed, 1, &step), KVT_NOT_FOUND, "kvt_step_begin", "");
  CHECK(step == NULL, "no step handle from a failed begin");

  /* A step over a sequence twice: in one batch, and while it is in another step. */
  MUST(kvt_sequence_open(rt, keys, 2, &seq));
  const kvt_step_item twice[2] = {{seq.id, 1}, {seq.id, 1}};
  EXPECT_ERROR(kvt_step_begin(rt, twice, 2, &step), KVT_INVALID_ARGUMENT, "kvt_step_begin", "");
  const kvt_step_item one = {seq.id, 1};
  MUST(kvt_step_begin(rt, &one, 1, &step));
  kvt_step* again = NULL;
  EXPECT_ERROR(kvt_step_begin(rt, &one, 1, &again), KVT_FAILED_PRECONDITION, "kvt_step_begin", "");
  kvt_layer_table table;
  EXPECT_ERROR(kvt_step_layer_table(step, 99, &table), KVT_OUT_OF_RANGE, "kvt_step_layer_table",
               "layer 99");
  EXPECT_ERROR(kvt_step_wait_layer(step, 99), KVT_OUT_OF_RANGE, "kvt_step_wait_layer", "99");
  kvt_step_item_info item;
  EXPECT_ERROR(kvt_step_get_item(step, 3, &item), KVT_OUT_OF_RANGE, "kvt_step_get_item", "item 3");
  MUST(kvt_step_abort(step));
  EXPECT_ERROR(kvt_step_end(step, NULL, 0), KVT_NOT_FOUND, "kvt_step_end", "");
  MUST(kvt_step_destroy(step));
  /* The destroyed handle, a handle of another type, NULL handles and NULL outputs. */
  EXPECT_ERROR(kvt_step_wait_layer(step, 0), KVT_INVALID_ARGUMENT, "kvt_step_wait_layer",
               "not a live kvt_step handle");
  EXPECT_ERROR(kvt_step_destroy(step), KVT_INVALID_ARGUMENT, "kvt_step_destroy", "not a live");
  kvt_stats stats;
  EXPECT_ERROR(kvt_runtime_stats((const kvt_runtime*)(const void*)step, &stats),
               KVT_INVALID_ARGUMENT, "kvt_runtime_stats", "not a live kvt_runtime handle");
  EXPECT_ERROR(kvt_runtime_stats(rt, NULL), KVT_INVALID_ARGUMENT, "kvt_runtime_stats",
               "out is NULL");
  EXPECT_ERROR(kvt_sequence_open(NULL, keys, 2, &seq), KVT_INVALID_ARGUMENT, "kvt_sequence_open",
               "runtime is NULL");
  EXPECT_ERROR(kvt_sequence_open(rt, NULL, 2, &seq), KVT_INVALID_ARGUMENT, "kvt_sequence_open",
               "keys is NULL");
  CHECK(kvt_step_destroy(NULL) == KVT_OK, "destroying NULL is a no-op");
  MUST(kvt_sequence_close(rt, one.sequence));

  /* Keys of another namespace. */
  kvt_block_key foreign[kBlocks];
  MUST(kvt_chain_block_keys("another-model", tokens, kTokens, kPageTokens, foreign, kBlocks,
                            &n_keys));
  EXPECT_ERROR(kvt_sequence_open(rt, foreign, kBlocks, &seq), KVT_INVALID_ARGUMENT,
               "kvt_sequence_open", "another namespace");
  kvt_match m;
  EXPECT_ERROR(kvt_runtime_match(rt, foreign, kBlocks, &m), KVT_INVALID_ARGUMENT,
               "kvt_runtime_match", "another namespace");

  /* A step that cannot fit: one layer needs more than the 64 HBM frames. */
  enum { kHuge = 80 * kPageTokens };
  uint32_t* long_prompt = malloc(sizeof(uint32_t) * kHuge);
  for (uint32_t i = 0; i < kHuge; ++i) long_prompt[i] = 1000u + i;
  kvt_block_key* long_keys = malloc(sizeof(kvt_block_key) * 80);
  MUST(kvt_runtime_block_keys(rt, long_prompt, kHuge, long_keys, 80, &n_keys));
  MUST(kvt_sequence_open(rt, long_keys, 80, &seq));
  const kvt_step_item huge = {seq.id, kHuge};
  EXPECT_ERROR(kvt_step_begin(rt, &huge, 1, &step), KVT_RESOURCE_EXHAUSTED, "kvt_step_begin", "");
  MUST(kvt_sequence_close(rt, seq.id));
  free(long_keys);
  free(long_prompt);

  MUST(kvt_runtime_stats(rt, &stats));
  CHECK(stats.open_sequences == 0, "%llu sequences left open",
        (unsigned long long)stats.open_sequences);
}

/* A destroyed step's pointer stays invalid: the next kvt_step_begin, which the allocator may give
 * the freed object's address, never hands out the same pointer, and calls on the stale one are
 * KVT_INVALID_ARGUMENT rather than acting on the live step. Also a step passed as a runtime. */
enum { kStepCycles = 200 };
static void test_stale_step_handles(kvt_runtime* rt, const uint32_t* tokens) {
  kvt_block_key keys[kBlocks];
  kvt_opened_sequence seq = open_one_block(rt, tokens, keys);
  const kvt_step_item one = {seq.id, 1};
  kvt_step* stale = NULL;
  int same_pointer = 0;
  int stale_accepted = 0;
  for (int i = 0; i < kStepCycles; ++i) {
    kvt_step* step = NULL;
    MUST(kvt_step_begin(rt, &one, 1, &step));
    if (stale != NULL) {
      if (step == stale) ++same_pointer;
      kvt_step_info info;
      const kvt_status got = kvt_step_get_info(stale, &info);
      if (got != KVT_INVALID_ARGUMENT || strstr(kvt_last_error(), "not a live kvt_step") == NULL) {
        ++stale_accepted;
      }
    }
    if (i == 0) {
      kvt_stats stats;
      EXPECT_ERROR(kvt_runtime_stats((kvt_runtime*)step, &stats), KVT_INVALID_ARGUMENT,
                   "kvt_runtime_stats", "not a live kvt_runtime handle");
    }
    MUST(kvt_step_abort(step));
    MUST(kvt_step_destroy(step));
    stale = step;
  }
  CHECK(same_pointer == 0, "%d of %d new steps reused a destroyed step's pointer", same_pointer,
        kStepCycles - 1);
  CHECK(stale_accepted == 0, "%d of %d calls on a destroyed step were not KVT_INVALID_ARGUMENT",
        stale_accepted, kStepCycles - 1);
  EXPECT_ERROR(kvt_step_destroy(stale), KVT_INVALID_ARGUMENT, "kvt_step_destroy",
               "not a live kvt_step handle");
  MUST(kvt_sequence_close(rt, seq.id));
}

/* Shutdown with a step still open, then every call fails cleanly. */
static void test_after_shutdown(kvt_runtime* rt, const uint32_t* tokens) {
  kvt_block_key keys[kBlocks];
  kvt_opened_sequence seq = open_one_block(rt, tokens, keys);
  const kvt_step_item one = {seq.id, 1};
  kvt_step* step = NULL;
  MUST(kvt_step_begin(rt, &one, 1, &step));
  MUST(kvt_step_abort(step));
  MUST(kvt_sequence_close(rt, seq.id));

  MUST(kvt_runtime_shutdown(rt));
  MUST(kvt_runtime_shutdown(rt)); /* idempotent */
  kvt_stats stats;
  EXPECT_ERROR(kvt_runtime_stats(rt, &stats), KVT_FAILED_PRECONDITION, "kvt_runtime_stats",
               "shut down");
  kvt_hbm_view view;
  EXPECT_ERROR(kvt_runtime_hbm_view(rt, &view), KVT_FAILED_PRECONDITION, "kvt_runtime_hbm_view",
               "shut down");
  EXPECT_ERROR(kvt_sequence_open(rt, keys, kBlocks, &seq), KVT_FAILED_PRECONDITION,
               "kvt_sequence_open", "shut down");
  EXPECT_ERROR(kvt_runtime_audit(rt), KVT_FAILED_PRECONDITION, "kvt_runtime_audit", "shut down");
  EXPECT_ERROR(kvt_step_begin(rt, &one, 1, &step), KVT_FAILED_PRECONDITION, "kvt_step_begin",
               "shut down");
  EXPECT_ERROR(kvt_step_wait_layer(step, 0), KVT_FAILED_PRECONDITION, "kvt_step_wait_layer",
               "shut down");
  MUST(kvt_step_destroy(step));
  MUST(kvt_runtime_destroy(rt));
  EXPECT_ERROR(kvt_runtime_stats(rt, &stats), KVT_INVALID_ARGUMENT, "kvt_runtime_stats",
               "not a live kvt_runtime handle");
  CHECK(kvt_runtime_destroy(NULL) == KVT_OK, "destroying NULL is a no-op");
}

/* Calls racing with a shutdown on other threads: each returns KVT_OK or, once the shutdown has
 * begun, KVT_FAILED_PRECONDITION; none reads the runtime's freed state. */
enum { kRacers = 4, kCallsBeforeShutdown = 200 };
static atomic_int calls_done = 0;

static void* race_calls(void* arg) {
  kvt_runtime* rt = arg;
  const kvt_block_key key = {1, 0};
  for (long i = 0;; ++i) {
    kvt_stats stats;
    kvt_hbm_view view;
    kvt_match m;
    const kvt_status got[3] = {kvt_runtime_stats(rt, &stats), kvt_runtime_hbm_view(rt, &view),
                               kvt_runtime_match(rt, &key, 0, &m)};
    int stopped = 0;
    for (int c = 0; c < 3; ++c) {
      if (got[c] == KVT_FAILED_PRECONDITION) {
        stopped = 1;
      } else if (got[c] != KVT_OK) {
        fprintf(stderr, "racing call %d returned %s: %s\n", c, kvt_status_name(got[c]),
                kvt_last_error());
        return (void*)1;
      }
    }
    if (stopped) return NULL;
    atomic_fetch_add(&calls_done, 1);
  }
}

static void test_calls_racing_shutdown(void) {
  const char* overrides[] = {"tiers.nvme.enabled=false", "metrics.listen=off"};
  kvt_runtime_params params;
  kvt_runtime_default_params(&params);
  params.use_environment = 0;
  kvt_runtime* rt = NULL;
  MUST(kvt_runtime_open_yaml(yaml, overrides, 2, &params, &rt));
  pthread_t threads[kRacers];
  for (int i = 0; i < kRacers; ++i) pthread_create(&threads[i], NULL, race_calls, rt);
  while (atomic_load(&calls_done) < kCallsBeforeShutdown) sched_yield();
  MUST(kvt_runtime_shutdown(rt));
  for (int i = 0; i < kRacers; ++i) {
    void* result = NULL;
    pthread_join(threads[i], &result);
    CHECK(result == NULL, "racer %d saw an unexpected status", i);
  }
  MUST(kvt_runtime_destroy(rt));
}

/* Shutdown or destroy on one thread while an engine thread is blocked in kvt_step_wait_layer on a
 * layer that cannot become ready: the waiter is woken with KVT_CANCELLED saying the runtime is
 * shutting down, and neither waits for it. Both would otherwise return only when the wait ran out
 * (KVT_DEADLINE_EXCEEDED after the 60 s wait_timeout_ms). The last layer of a windowed step is not
 * even planned until the engine ends the layers before it, so it is never ready here. */
enum { kWindowBlocks = 40, kWindowTokens = kWindowBlocks * kPageTokens, kLongWaitMs = 60000 };

struct blocked_wait {
  kvt_step* step;
  uint32_t layer;
  kvt_status got;
  char error[512];
};

static void* wait_for_layer(void* arg) {
  struct blocked_wait* w = arg;
  w->got = kvt_step_wait_layer(w->step, w->layer);
  snprintf(w->error, sizeof w->error, "%s", kvt_last_error());
  return NULL;
}

static void test_shutdown_wakes_blocked_waiter(int destroy) {
  const char* name = destroy ? "kvt_runtime_destroy" : "kvt_runtime_shutdown";
  const char* overrides[] = {"tiers.nvme.enabled=false", "metrics.listen=off"};
  kvt_runtime_params params;
  kvt_runtime_default_params(&params);
  params.use_environment = 0;
  params.wait_timeout_ms = kLongWaitMs;
  kvt_runtime* rt = NULL;
  MUST(kvt_runtime_open_yaml(yaml, overrides, 2, &params, &rt));
  uint32_t* tokens = malloc(sizeof(uint32_t) * kWindowTokens);
  kvt_block_key* keys = malloc(sizeof(kvt_block_key) * kWindowBlocks);
  for (uint32_t i = 0; i < kWindowTokens; ++i) tokens[i] = 5000u + i * 3u;
  size_t n_keys = 0;
  MUST(kvt_runtime_block_keys(rt, tokens, kWindowTokens, keys, kWindowBlocks, &n_keys));
  kvt_opened_sequence seq;
  MUST(kvt_sequence_open(rt, keys, n_keys, &seq));
  const kvt_step_item item = {seq.id, kWindowTokens};
  kvt_step* step = NULL;
  MUST(kvt_step_begin(rt, &item, 1, &step));
  kvt_step_info info;
  MUST(kvt_step_get_info(step, &info));
  CHECK(info.windowed == 1, "%s: 40 blocks of 64 HBM frames per layer make a windowed step", name);

  struct blocked_wait w = {step, info.layers - 1, KVT_OK, ""};
  pthread_t waiter;
  pthread_create(&waiter, NULL, wait_for_layer, &w);
  /* Give the waiter time to block (were it late, it would see KVT_FAILED_PRECONDITION instead). */
  const struct timespec pause = {0, 200 * 1000 * 1000};
  nanosleep(&pause, NULL);
  const uint64_t start = kvt_clock_now_ns();
  const kvt_status closed = destroy ? kvt_runtime_destroy(rt) : kvt_runtime_shutdown(rt);
  CHECK(closed == KVT_OK, "%s returned %s: %s", name, kvt_status_name(closed), kvt_last_error());
  pthread_join(waiter, NULL);
  const double seconds = (double)(kvt_clock_now_ns() - start) / 1e9;
  CHECK(w.got == KVT_CANCELLED || w.got == KVT_FAILED_PRECONDITION,
        "%s: the blocked wait returned %s (%s), not a shut-down code", name, kvt_status_name(w.got),
        w.error);
  CHECK(w.got != KVT_CANCELLED || strstr(w.error, "shutting down") != NULL,
        "%s: the cancelled wait should say the runtime is shutting down: %s", name, w.error);
  CHECK(seconds < 20.0, "%s and the woken wait took %.1f s (wait_timeout_ms is %d ms)", name,
        seconds, kLongWaitMs);
  EXPECT_ERROR(kvt_step_wait_layer(step, 0), KVT_FAILED_PRECONDITION, "kvt_step_wait_layer",
               "shut down");
  MUST(kvt_step_destroy(step));
  if (!destroy) MUST(kvt_runtime_destroy(rt));
  free(keys);
  free(tokens);
}

/* kvt_runtime_params grows by appending fields (convention (6)): a caller compiled against an older
 * header passes a smaller struct_size and gets the defaults for what its struct lacks; one compiled
 * against a newer header passes a larger one, taken when the fields this library does not know
 * are all zero. kvt_runtime_default_params_sized never writes past the size it is given. */
enum { kGuard = 0xA5 };
struct newer_params {
  kvt_runtime_params known;
  int64_t appended; /* a field of some later version */
};
union params_with_guard {
  kvt_runtime_params params;
  unsigned char bytes[sizeof(kvt_runtime_params) + 16];
};

static int bytes_are(const unsigned char* p, size_t n, unsigned char value) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != value) return 0;
  }
  return 1;
}

static void test_params_sizes(void) {
  const char* overrides[] = {"tiers.nvme.enabled=false", "metrics.listen=off"};
  /* The first version's kvt_runtime_params ends with persist_on_shutdown. */
  const size_t first_size = offsetof(kvt_runtime_params, persist_on_shutdown) + sizeof(int32_t);
  kvt_runtime* rt = NULL;

  kvt_runtime_params current;
  memset(&current, kGuard, sizeof current);
  kvt_runtime_default_params(&current);
  CHECK(current.struct_size == sizeof current && current.reserved == 0,
        "default params: struct_size %u, reserved %d", current.struct_size, current.reserved);
  CHECK(offsetof(kvt_runtime_params, reserved) + sizeof(int32_t) == sizeof(kvt_runtime_params),
        "kvt_runtime_params has tail padding, so struct_size cannot tell versions apart");

  /* An older, smaller struct: filled only up to its size, opened with defaults for the rest (the
   * guard bytes where `reserved` would be are never read, or the open would refuse them). */
  union params_with_guard older;
  memset(older.bytes, kGuard, sizeof older.bytes);
  MUST(kvt_runtime_default_params_sized(&older.params, first_size));
  CHECK(bytes_are(older.bytes + first_size, sizeof older.bytes - first_size, kGuard),
        "kvt_runtime_default_params_sized(%zu) wrote past the size it was given", first_size);
  CHECK(older.params.struct_size == first_size && older.params.use_environment == 1 &&
            older.params.call_timeout_ms == current.call_timeout_ms &&
            older.params.persist_on_shutdown == current.persist_on_shutdown,
        "an older struct gets the defaults: struct_size %u", older.params.struct_size);
  older.params.use_environment = 0;
  MUST(kvt_runtime_open_yaml(yaml, overrides, 2, &older.params, &rt));
  MUST(kvt_runtime_destroy(rt));
  rt = NULL;

  /* Smaller than any version: refused, and nothing is written. */
  memset(older.bytes, kGuard, sizeof older.bytes);
  EXPECT_ERROR(kvt_runtime_default_params_sized(&older.params, first_size - 4),
               KVT_INVALID_ARGUMENT, "kvt_runtime_default_params_sized", "struct_size");
  CHECK(bytes_are(older.bytes, sizeof older.bytes, kGuard),
        "a refused kvt_runtime_default_params_sized wrote into the struct");
  EXPECT_ERROR(kvt_runtime_default_params_sized(NULL, sizeof current), KVT_INVALID_ARGUMENT,
               "kvt_runtime_default_params_sized", "params is NULL");
  kvt_runtime_params shrunk = current;
  shrunk.struct_size = (uint32_t)first_size - 4;
  EXPECT_ERROR(kvt_runtime_open_yaml(yaml, overrides, 2, &shrunk, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "params.struct_size is 32");

  /* A newer, larger struct: the appended field is zeroed, and taken while it stays zero. */
  struct newer_params newer;
  memset(&newer, kGuard, sizeof newer);
  MUST(kvt_runtime_default_params_sized(&newer.known, sizeof newer));
  CHECK(newer.known.struct_size == sizeof newer && newer.appended == 0,
        "a newer struct: struct_size %u, unknown tail %lld", newer.known.struct_size,
        (long long)newer.appended);
  newer.known.use_environment = 0;
  MUST(kvt_runtime_open_yaml(yaml, overrides, 2, &newer.known, &rt));
  MUST(kvt_runtime_destroy(rt));
  rt = NULL;
  newer.appended = 7;
  EXPECT_ERROR(kvt_runtime_open_yaml(yaml, overrides, 2, &newer.known, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "params.struct_size");
  newer.appended = 0;
  newer.known.reserved = 1;
  EXPECT_ERROR(kvt_runtime_open_yaml(yaml, overrides, 2, &newer.known, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "params.reserved");
  /* An uninitialised struct_size (garbage) is refused rather than read that far. */
  kvt_runtime_params garbage = current;
  garbage.struct_size = 0xA5A5A5A5u;
  EXPECT_ERROR(kvt_runtime_open_yaml(yaml, overrides, 2, &garbage, &rt), KVT_INVALID_ARGUMENT,
               "kvt_runtime_open_yaml", "params.struct_size");
  CHECK(rt == NULL, "no handle comes out of a refused open");
}

/* Handles are opaque tokens, but Go's runtime checks every pointer-typed value it finds on a
 * goroutine stack: one below 4096 (or misaligned) throws "invalid pointer found on stack". */
static void check_handle_value(const void* handle, const char* what) {
  const uintptr_t value = (uintptr_t)handle;
  CHECK(value >= 0x10000u && value % 16u == 0, "%s handle %p is small or not 16-aligned", what,
        handle);
}

static void test_handle_values(kvt_runtime* rt, const uint32_t* tokens) {
  check_handle_value(rt, "runtime");
  kvt_block_key keys[kBlocks];
  kvt_opened_sequence seq = open_one_block(rt, tokens, keys);
  const kvt_step_item one = {seq.id, 1};
  for (int i = 0; i < 3; ++i) {
    kvt_step* step = NULL;
    MUST(kvt_step_begin(rt, &one, 1, &step));
    check_handle_value(step, "step");
    MUST(kvt_step_destroy(step));
  }
  MUST(kvt_sequence_close(rt, seq.id));
}

/* A layer table after end_layer is still served (as Runtime::layer_table does: the arrays stay
 * readable, naming frames that may hold other pages by now); once the step has ended or been
 * aborted it is KVT_FAILED_PRECONDITION, while the arrays already handed out stay valid until
 * kvt_step_destroy. */
static void test_layer_table_after_end(kvt_runtime* rt, const uint32_t* tokens) {
  kvt_block_key keys[kBlocks];
  kvt_opened_sequence seq = open_one_block(rt, tokens, keys);
  const kvt_step_item one = {seq.id, 1};
  for (int abort = 0; abort < 2; ++abort) {
    kvt_step* step = NULL;
    MUST(kvt_step_begin(rt, &one, 1, &step));
    MUST(kvt_step_wait_layer(step, 0));
    kvt_layer_table table;
    MUST(kvt_step_layer_table(step, 0, &table));
    MUST(kvt_step_end_layer(step, 0));
    kvt_layer_table again;
    MUST(kvt_step_layer_table(step, 0, &again));
    CHECK(again.indptr == table.indptr && again.indices == table.indices,
          "the arrays of a layer table are handed out once and kept");
    kvt_step_info info;
    MUST(kvt_step_get_info(step, &info));
    for (uint32_t l = 1; l < info.layers && !abort; ++l) {
      MUST(kvt_step_wait_layer(step, l));
      MUST(kvt_step_end_layer(step, l));
    }
    if (abort) {
      MUST(kvt_step_abort(step));
    } else {
      MUST(kvt_step_end(step, NULL, 0));
    }
    const char* how = abort ? "aborted" : "ended";
    EXPECT_ERROR(kvt_step_layer_table(step, 0, &again), KVT_FAILED_PRECONDITION,
                 "kvt_step_layer_table", how);
    EXPECT_ERROR(kvt_step_layer_table(step, info.layers - 1, &again), KVT_FAILED_PRECONDITION,
                 "kvt_step_layer_table", how);
    CHECK(table.batch == 1 && table.indptr[0] == 0 && table.indptr[1] >= 1,
          "the arrays handed out stay readable until kvt_step_destroy");
    MUST(kvt_step_destroy(step));
  }
  MUST(kvt_sequence_close(rt, seq.id));
}

/* Counts past UINT32_MAX (what kvt_step_info.batch and the block counts hold) are refused, naming
 * the count, before anything is allocated or read: never KVT_INTERNAL (std::length_error), an
 * attempt to allocate terabytes, or a count silently truncated. The arrays hold one element; the
 * count is checked first. */
static void test_huge_counts(kvt_runtime* rt, const uint32_t* tokens) {
  kvt_block_key keys[kBlocks];
  kvt_opened_sequence seq = open_one_block(rt, tokens, keys);
  const kvt_step_item one = {seq.id, 1};
  kvt_step* open_step = NULL;
  MUST(kvt_step_begin(rt, &one, 1, &open_step));
  const char* override_text = "metrics.listen=off";
#if SIZE_MAX > UINT32_MAX
  const size_t counts[] = {SIZE_MAX / 4, (size_t)UINT32_MAX + 1};
#else
  const size_t counts[] = {SIZE_MAX / 4};
#endif
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; ++c) {
    const size_t n = counts[c];
    kvt_opened_sequence opened;
    kvt_match m;
    kvt_pin_id pin = 0;
    kvt_step* step = NULL;
    kvt_runtime* other = NULL;
    size_t n_keys = 0;
    EXPECT_ERROR(kvt_sequence_open(rt, keys, n, &opened), KVT_INVALID_ARGUMENT, "kvt_sequence_open",
                 "n_keys is");
    EXPECT_ERROR(kvt_runtime_match(rt, keys, n, &m), KVT_INVALID_ARGUMENT, "kvt_runtime_match",
                 "n_keys is");
    EXPECT_ERROR(kvt_prefix_pin(rt, keys, n, 1000, &pin), KVT_INVALID_ARGUMENT, "kvt_prefix_pin",
                 "n_keys is");
    EXPECT_ERROR(kvt_step_begin(rt, &one, n, &step), KVT_INVALID_ARGUMENT, "kvt_step_begin",
                 "n_items is");
    const kvt_hinted_request request = {7, kvt_clock_now_ns(), keys, 1};
    EXPECT_ERROR(kvt_runtime_hint(rt, &request, n), KVT_INVALID_ARGUMENT, "kvt_runtime_hint",
                 "n_requests is");
    const kvt_hinted_request long_request = {7, kvt_clock_now_ns(), keys, n};
    EXPECT_ERROR(kvt_runtime_hint(rt, &long_request, 1), KVT_INVALID_ARGUMENT, "kvt_runtime_hint",
                 "requests[0].n_keys is");
    const kvt_step_completion completion = {seq.id, keys, 1};
    EXPECT_ERROR(kvt_step_end(open_step, &completion, n), KVT_INVALID_ARGUMENT, "kvt_step_end",
                 "n_completions is");
    const kvt_step_completion long_completion = {seq.id, keys, n};
    EXPECT_ERROR(kvt_step_end(open_step, &long_completion, 1), KVT_INVALID_ARGUMENT, "kvt_step_end",
                 "completions[0].n_keys is");
    EXPECT_ERROR(kvt_runtime_open_yaml("", &override_text, n, NULL, &other), KVT_INVALID_ARGUMENT,
                 "kvt_runtime_open_yaml", "n_overrides is");
    EXPECT_ERROR(kvt_runtime_block_keys(rt, tokens, n, keys, kBlocks, &n_keys),
                 KVT_INVALID_ARGUMENT, "kvt_runtime_block_keys", "n_tokens is");
    EXPECT_ERROR(kvt_chain_block_keys("ns", tokens, n, kPageTokens, keys, kBlocks, &n_keys),
                 KVT_INVALID_ARGUMENT, "kvt_chain_block_keys", "n_tokens is");
    kvt_block_key root;
    kvt_block_key child;
    MUST(kvt_runtime_namespace_root(rt, &root));
    EXPECT_ERROR(kvt_runtime_block_key(rt, &root, tokens, n, &child), KVT_INVALID_ARGUMENT,
                 "kvt_runtime_block_key", "n_tokens is");
    CHECK(step == NULL && other == NULL, "no handle from a refused count");
  }
  MUST(kvt_step_abort(open_step));
  MUST(kvt_step_destroy(open_step));
  MUST(kvt_sequence_close(rt, seq.id));
}

/* After a restart the prompt is found on NVMe and its bytes come back. */
static void test_restart(const uint32_t* tokens) {
  kvt_runtime* rt = NULL;
  MUST(open_runtime(&rt));
  kvt_stats stats;
  MUST(kvt_runtime_stats(rt, &stats));
  CHECK(stats.nvme_recovered_blocks >= kBlocks, "%llu blocks recovered",
        (unsigned long long)stats.nvme_recovered_blocks);
  kvt_block_key keys[kBlocks];
  size_t n_keys = 0;
  MUST(kvt_runtime_block_keys(rt, tokens, kTokens, keys, kBlocks, &n_keys));
  kvt_match m;
  MUST(kvt_runtime_match(rt, keys, kBlocks, &m));
  CHECK(m.blocks == kBlocks && m.by_tier[KVT_TIER_NVME] == kBlocks, "%u blocks cached, %u on nvme",
        m.blocks, m.by_tier[KVT_TIER_NVME]);
  kvt_opened_sequence seq;
  MUST(kvt_sequence_open(rt, keys, kBlocks, &seq));
  CHECK(seq.reused_blocks == kBlocks, "the prefix is loaded, not recomputed (%u reused)",
        seq.reused_blocks);
  run_step(rt, seq.id, tokens, seq.reused_tokens, 1);
  MUST(kvt_sequence_close(rt, seq.id));
  MUST(kvt_runtime_destroy(rt));
}

int main(void) {
  const char* tmp = getenv("TMPDIR");
  char dir[512];
  snprintf(dir, sizeof dir, "%s/kvtier-capi-XXXXXX", tmp != NULL && *tmp != '\0' ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(yaml, sizeof yaml,
           "model:\n"
           "  name: c-api-test\n"
           "  layers: 4\n"
           "  kv_heads: 2\n"
           "  head_dim: 64\n"
           "  dtype: bf16\n"
           "  page_tokens: %d\n"
           "tiers:\n"
           "  hbm: {backend: emulated, capacity: 512KiB}\n"
           "  host: {capacity: 2MiB, huge_pages: false, lock_memory: false}\n"
           "  nvme: {capacity: 16MiB, paths: [\"%s/store0.kvs\"], queue_depth: 16}\n",
           kPageTokens, dir);

  uint32_t tokens[kTokens + 1];
  uint32_t x = 12345u;
  for (int i = 0; i <= kTokens; ++i) {
    x = x * 1664525u + 1013904223u;
    tokens[i] = (x >> 8) % 32000u;
  }

  test_version_and_keys();
  test_bad_configs();
  test_params_sizes();

  kvt_runtime* rt = NULL;
  const kvt_status opened = open_runtime(&rt);
  if (opened == KVT_UNAVAILABLE || opened == KVT_IO_ERROR) {
    fprintf(stderr, "skipped: the NVMe store cannot be opened here: %s\n", kvt_last_error());
    return kSkip;
  }
  MUST(opened);
  test_prefill_and_reuse(rt, tokens);
  test_bad_input(rt, tokens);
  test_stale_step_handles(rt, tokens);
  test_handle_values(rt, tokens);
  test_layer_table_after_end(rt, tokens);
  test_huge_counts(rt, tokens);
  test_after_shutdown(rt, tokens);

  test_calls_racing_shutdown();
  test_shutdown_wakes_blocked_waiter(0);
  test_shutdown_wakes_blocked_waiter(1);
  test_largest_timeouts(tokens);

  kvt_set_log_callback(count_log_lines, &log_lines);
  test_restart(tokens);
  kvt_set_log_callback(NULL, NULL);
  CHECK(atomic_load(&log_lines) > 0, "the restart's recovery line reached the log callback");

  if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) perror("removing the store");
  if (failures > 0) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("c_api_test: all checks passed (kvtier %s)\n", kvt_version());
  return 0;
}
