/* A bump allocator: blocks chained newest first. */
#include "dlrec/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlrec/status.h"

struct dlrec_arena_block {
  dlrec_arena_block *next;
  size_t size; /* usable bytes after the header */
  size_t used;
  /* data follows, aligned to 64 */
};

#define HEADER_BYTES 64

void dlrec_arena_init(dlrec_arena *a, size_t block_bytes) {
  a->head = NULL;
  a->block_bytes = block_bytes ? block_bytes : (1u << 20);
  a->used_bytes = 0;
}

static uintptr_t block_data(dlrec_arena_block *b) { return (uintptr_t)b + HEADER_BYTES; }

void *dlrec_arena_alloc(dlrec_arena *a, size_t bytes, size_t align) {
  if (align == 0) align = 16;
  if ((align & (align - 1)) || align > 4096) {
    dlrec_error(DLREC_ERR_INTERNAL, "arena: bad alignment %zu", align);
    return NULL;
  }
  dlrec_arena_block *b = a->head;
  if (b) {
    uintptr_t p = (block_data(b) + b->used + align - 1) & ~(uintptr_t)(align - 1);
    if (p + bytes <= block_data(b) + b->size) {
      a->used_bytes += p + bytes - (block_data(b) + b->used);
      b->used = p + bytes - block_data(b);
      return (void *)p;
    }
  }
  if (bytes > SIZE_MAX - align - HEADER_BYTES) {
    dlrec_error(DLREC_ERR_NOMEM, "arena: %zu bytes is too large", bytes);
    return NULL;
  }
  size_t need = bytes + align;
  size_t size = need > a->block_bytes ? need : a->block_bytes;
  void *mem = NULL;
  if (posix_memalign(&mem, 64, HEADER_BYTES + size) != 0) {
    dlrec_error(DLREC_ERR_NOMEM, "arena: cannot allocate %zu bytes", size);
    return NULL;
  }
  memset(mem, 0, HEADER_BYTES + size);
  b = mem;
  b->size = size;
  b->used = 0;
  b->next = a->head;
  a->head = b;
  return dlrec_arena_alloc(a, bytes, align);
}

char *dlrec_arena_strdup(dlrec_arena *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = dlrec_arena_alloc(a, n, 1);
  if (d) memcpy(d, s, n);
  return d;
}

void dlrec_arena_free(dlrec_arena *a) {
  dlrec_arena_block *b = a->head;
  while (b) {
    dlrec_arena_block *next = b->next;
    free(b);
    b = next;
  }
  a->head = NULL;
  a->used_bytes = 0;
}
