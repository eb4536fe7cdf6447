/* A bump allocator: blocks chained newest first.
 *
 * Under AddressSanitizer a block's unused space is poisoned and each
 * allocation unpoisoned as it is handed out, with a poisoned redzone between
 * allocations, so that an overrun of one arena array into the next (or into
 * the unused end of a block) is reported like a heap overflow instead of
 * silently landing in a neighbour. Release builds pack allocations as before.
 */
#include "core/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>

#include "core/status.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(ARENA_ASAN)
#define ARENA_ASAN 1
#endif

#ifdef ARENA_ASAN
#include <sanitizer/asan_interface.h>
/* ASan tracks addressability in 8-byte granules, each addressable only as a
 * prefix: allocations start on a granule and are kept REDZONE_BYTES apart so
 * that no granule is shared between two of them. */
#define MIN_ALIGN 8
#define REDZONE_BYTES 32
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define MIN_ALIGN 1
#define REDZONE_BYTES 0
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct dlrec_arena_block {
  dlrec_arena_block *next;
  size_t size; /* usable bytes after the header, or at ext */
  size_t used;
  int mapped;  /* from mmap: what was never handed out is still the kernel's zero pages */
  char *ext;   /* the block's memory when the arena's mem gave it; else data follows, aligned to 64 */
};

/* Blocks this large come from mmap, whose pages are zero until written: the
 * arena then hands them out without clearing them (a workspace of hundreds
 * of MiB is written once by its first step instead of twice). Smaller ones,
 * which a server's requests make and free by the thousand, stay with malloc
 * and its warm pages. */
#define MAPPED_MIN_BYTES ((size_t)2 << 20)

#define HEADER_BYTES 64
/* The header's padding after the struct, poisoned too (an underrun of the
 * block's first allocation); rounded up to a granule. */
#define HEADER_USED_BYTES ((sizeof(dlrec_arena_block) + 7) & ~(size_t)7)

static _Thread_local size_t g_thread_bytes;

size_t dlrec_arena_thread_bytes(void) { return g_thread_bytes; }

void dlrec_arena_init_in(dlrec_arena *a, size_t block_bytes, const dlrec_arena_memory *mem) {
  a->head = NULL;
  a->block_bytes = block_bytes ? block_bytes : (1u << 20);
  a->used_bytes = 0;
  a->mem = mem;
}

void dlrec_arena_init(dlrec_arena *a, size_t block_bytes) { dlrec_arena_init_in(a, block_bytes, NULL); }

static uintptr_t block_data(dlrec_arena_block *b) { return b->ext ? (uintptr_t)b->ext : (uintptr_t)b + HEADER_BYTES; }

void *dlrec_arena_alloc(dlrec_arena *a, size_t bytes, size_t align) {
  if (align == 0) align = 16;
  if ((align & (align - 1)) || align > 4096) {
    dlrec_error(DLREC_ERR_INTERNAL, "arena: bad alignment %zu", align);
    return NULL;
  }
  if (align < MIN_ALIGN) align = MIN_ALIGN;
  if (bytes > SIZE_MAX / 2 - align - REDZONE_BYTES - HEADER_BYTES) {
    dlrec_error(DLREC_ERR_NOMEM, "arena: %zu bytes is too large", bytes);
    return NULL;
  }
  dlrec_arena_block *b = a->head;
  if (b) {
    /* The gap after the previous allocation stays poisoned: the redzone. */
    const uintptr_t end = block_data(b) + b->size, from = block_data(b) + b->used + (b->used ? REDZONE_BYTES : 0);
    uintptr_t p = (from + align - 1) & ~(uintptr_t)(align - 1);
    /* Compared as a difference: p + bytes could wrap for a huge request. */
    if (p <= end && bytes <= end - p) {
      a->used_bytes += p + bytes - (block_data(b) + b->used);
      g_thread_bytes += p + bytes - (block_data(b) + b->used);
      b->used = p + bytes - block_data(b);
      if (b->ext) { /* another memory's: neither poisoned nor the host's to clear */
        if (a->mem->zero(a->mem->ctx, (void *)p, bytes) != 0) {
          dlrec_error_context("arena: clearing %zu bytes: ", bytes);
          return NULL;
        }
        return (void *)p;
      }
      UNPOISON((void *)p, bytes);
      /* Zeroed as handed out, not per block: a large block that is mostly
       * unused (a loader's 1 MiB for a small file) costs nothing to clear.
       * A mapped block's never-used bytes are zero already. */
      if (!b->mapped) memset((void *)p, 0, bytes);
      return (void *)p;
    }
  }
  size_t need = bytes + align;
  size_t size = need > a->block_bytes ? need : a->block_bytes;
  if (a->mem) {
    b = calloc(1, sizeof *b);
    if (b && !(b->ext = a->mem->alloc(a->mem->ctx, size))) {
      free(b);
      b = NULL;
    }
    if (!b) {
      dlrec_error(DLREC_ERR_NOMEM, "arena: cannot allocate %zu bytes", size);
      return NULL;
    }
    b->size = size;
    b->next = a->head;
    a->head = b;
    return dlrec_arena_alloc(a, bytes, align);
  }
  void *mem = NULL;
  const int mapped = HEADER_BYTES + size >= MAPPED_MIN_BYTES;
  if (mapped) {
    mem = mmap(NULL, HEADER_BYTES + size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) mem = NULL;
  } else if (posix_memalign(&mem, 64, HEADER_BYTES + size) != 0) {
    mem = NULL;
  }
  if (!mem) {
    dlrec_error(DLREC_ERR_NOMEM, "arena: cannot allocate %zu bytes", size);
    return NULL;
  }
  b = mem;
  b->size = size;
  b->used = 0;
  b->mapped = mapped;
  b->ext = NULL;
  b->next = a->head;
  a->head = b;
  POISON((char *)mem + HEADER_USED_BYTES, HEADER_BYTES - HEADER_USED_BYTES + size);
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
    if (b->ext) {
      a->mem->release(a->mem->ctx, b->ext);
      free(b);
      b = next;
      continue;
    }
    /* Handed back as it was received; free() poisons it again as freed
     * memory. */
    UNPOISON(b, HEADER_BYTES + b->size);
    if (b->mapped) munmap(b, HEADER_BYTES + b->size);
    else free(b);
    b = next;
  }
  a->head = NULL;
  a->used_bytes = 0;
}
