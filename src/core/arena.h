/* A bump allocator for memory planned once and freed together.
 *
 * Blocks are allocated as needed; dlrec_arena_alloc never moves earlier
 * allocations. Everything is released by dlrec_arena_free. Not thread-safe.
 */
#ifndef DLREC_ARENA_H
#define DLREC_ARENA_H

#include <stddef.h>

typedef struct dlrec_arena_block dlrec_arena_block;

/* Where an arena's blocks come from when they are not the host's: memory
 * the host does not read or write (a GPU's). alloc returns NULL on failure;
 * zero clears bytes at p, returning 0 on success. The arena keeps its
 * bookkeeping on the host. */
typedef struct dlrec_arena_memory {
  void *(*alloc)(void *ctx, size_t bytes);
  void (*release)(void *ctx, void *p);
  int (*zero)(void *ctx, void *p, size_t bytes);
  void *ctx;
} dlrec_arena_memory;

typedef struct dlrec_arena {
  dlrec_arena_block *head;       /* newest block */
  size_t block_bytes;            /* default size of a new block */
  size_t used_bytes;             /* bytes handed out, padding included */
  const dlrec_arena_memory *mem; /* NULL: host memory */
} dlrec_arena;

/* Initializes an empty arena whose blocks are at least block_bytes. */
void dlrec_arena_init(dlrec_arena *a, size_t block_bytes);
/* The same with blocks from mem (NULL: host memory, as dlrec_arena_init),
 * which must outlive the arena. Its allocations are zeroed by mem->zero. */
void dlrec_arena_init_in(dlrec_arena *a, size_t block_bytes, const dlrec_arena_memory *mem);

/* Returns `bytes` of zeroed memory aligned to `align` (a power of two up to
 * 4096), valid until dlrec_arena_free; NULL with an error set on failure. */
void *dlrec_arena_alloc(dlrec_arena *a, size_t bytes, size_t align);

/* The bytes every arena of the calling thread has handed out so far,
 * padding included; it never decreases, so its difference across a call
 * measures what the call placed in arenas (dlrec_net_ws_bytes). */
size_t dlrec_arena_thread_bytes(void);

/* Copies a string into the arena. */
char *dlrec_arena_strdup(dlrec_arena *a, const char *s);

/* Releases every block; the arena can be reused after dlrec_arena_init. */
void dlrec_arena_free(dlrec_arena *a);

#endif
