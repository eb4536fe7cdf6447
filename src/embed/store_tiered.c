/* The tiered store (embed/store.h): the table and its optimizer state in a
 * file, the rows batches touch in a RAM cache.
 *
 * The file holds the ram layout, section by section, each at a 4 KiB
 * boundary: the table (rows, stride) in its dtype, then the optimizer's
 * arrays as dlrec_sparse_optim_state shows them (Adagrad's accum (rows);
 * Adam's m, v (rows, stride) and steps (rows)). A missing row is read with
 * a pread per section; an evicted dirty row goes to a write-back buffer,
 * swept to the file in row order through a shared mapping of it (below).
 * The blocks are allocated up front, so a write through the mapping never
 * needs one. A checkpoint reads the arrays in place, through the mapping.
 *
 * The cache is a dlrec_table of cache_rows slots (the resident table the
 * kernels use) with the optimizer's state beside it, an index from table
 * row to slot (open addressing, linear probing, deletion by backward shift)
 * and, per slot, its row, a reference bit, a dirty bit and the batch that
 * last used it. A miss takes a free slot or the CLOCK hand's victim: the
 * first slot, going round, whose reference bit is clear (the hand clears
 * the bits it passes) and that the current batch does not use. A dirty
 * victim is written back before the slot is reused. ETL's frequency order
 * puts each column's hottest rows first; CLOCK keeps them resident because
 * they are referenced again before the hand comes back.
 *
 * Resolving is sequential and in the batch's (column, sample, position)
 * order, so which rows live where, and hence the whole run, is a function
 * of the batch sequence alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "embed/slot_index.h"
#include "embed/store_impl.h"
#include "backend/table_store.h"

#define SLOT_EMPTY UINT64_MAX
#define FLAG_REF 1u
#define FLAG_DIRTY 2u
/* Rows initialized and written per pwrite by tiered_init_uniform. */
#define INIT_WINDOW_ROWS (16 * TABLE_INIT_CHUNK_ROWS)

/* One section of the file: an array of `rows` records of `bytes` each. */
typedef struct section {
  uint64_t at;    /* byte offset in the file */
  uint32_t bytes; /* per row */
} section;

enum { SEC_TABLE, SEC_ACCUM, SEC_M, SEC_V, SEC_STEPS, SEC_N };

/* Misses of one resolve below this move on one thread. */
#define PARALLEL_IO_MIN 256
/* The write-back buffer's least capacity, in records. */
#define WB_MIN 4096
/* Batches of fewer ids look their rows up on one thread. */
#define PARALLEL_FIND_MIN 4096

/* A row read into a slot, after the slot's previous row is written back
 * (evict: its row, SLOT_EMPTY when there is nothing to write). */
typedef struct move {
  uint64_t evict, row;
  uint32_t slot;
} move;

struct tiered {
  char *path;
  int fd;
  uint64_t file_bytes;
  section sec[SEC_N]; /* bytes 0: the section is absent */
  uint64_t cache_rows;
  uint64_t used; /* slots handed out so far; the rest are free */
  uint64_t hand; /* CLOCK */
  uint32_t batch; /* the current resolve's number, from 1 */
  uint64_t *slot_row;     /* (cache_rows) the row in the slot, SLOT_EMPTY if none */
  uint32_t *slot_batch;   /* (cache_rows) the resolve that last used the slot */
  uint8_t *slot_flags;    /* (cache_rows) FLAG_REF | FLAG_DIRTY */
  slot_index index;       /* row -> slot */
  uint32_t *ids;          /* the resolved ids, column after column */
  size_t ids_cap;
  const uint32_t *col_ids[DLREC_BAG_MAX_COLS];
  move *moves; /* the current resolve's rows to move between file and cache */
  size_t moves_cap;
  int broken; /* a read failed: the index may name rows that slots do not hold */
  char *base;  /* the whole file, mapped shared: write-back sweeps go through it */
  int viewing; /* between dlrec_store_map and dlrec_store_unmap */
  /* The write-back buffer: records (the sections' bytes of one row, in
   * section order) of rows evicted dirty, and an index from row to record. */
  uint64_t wb_cap, wb_n;
  uint64_t *wb_row;   /* (wb_cap) */
  char *wb_data;      /* (wb_cap, record_bytes) */
  uint64_t *wb_order; /* (wb_cap) the sweep's sort keys: row << 32 | record */
  slot_index wb_index; /* row -> record */
};

static uint64_t align4k(uint64_t n) { return (n + 4095) & ~(uint64_t)4095; }

/* ---- file I/O ----------------------------------------------------------------- */

/* The resident copy of section k's record of the row in `slot`. */
static void *resident(dlrec_store *s, int k, uint32_t slot) {
  if (k == SEC_TABLE)
    return (char *)dlrec_table_raw(s->table) + (size_t)slot * s->stride * dlrec_table_dtype_bytes(s->dtype);
  dlrec_sparse_optim_state o;
  dlrec_sparse_optim_state_view(s->optim, &o);
  switch (k) {
  case SEC_ACCUM: return o.accum + slot;
  case SEC_M: return o.m + (size_t)slot * s->stride;
  case SEC_V: return o.v + (size_t)slot * s->stride;
  default: return o.steps + slot;
  }
}

/* Reads row's record of every section from the file into `slot` (preads:
 * a read fault on the mapping would map the whole large folio around the
 * row, and rows are scattered). Touches no counter, so that threads may
 * read different slots at once. */
static dlrec_status read_row(dlrec_store *s, uint64_t row, uint32_t slot) {
  tiered *t = s->tiered;
  for (int k = 0; k < SEC_N; k++) {
    const section *c = &t->sec[k];
    if (!c->bytes) continue;
    dlrec_status st = dlrec_pread_all(t->fd, resident(s, k, slot), c->bytes, c->at + row * c->bytes, t->path);
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

static uint64_t record_bytes(const tiered *t) {
  uint64_t n = 0;
  for (int k = 0; k < SEC_N; k++) n += t->sec[k].bytes;
  return n;
}

/* Grows the file to `bytes` (new bytes read as zeros) and maps all of it.
 * The blocks are allocated now (posix_fallocate): a write through the
 * mapping into a hole would need a block, and a full disk would then be a
 * SIGBUS in the middle of training instead of this error. */
static dlrec_status grow(tiered *t, uint64_t bytes) {
  int e = posix_fallocate(t->fd, 0, (off_t)bytes);
  if (e)
    return dlrec_error(DLREC_ERR_IO, "%s: cannot allocate %llu bytes for the table's file: %s", t->path,
                       (unsigned long long)bytes, strerror(e));
  if (t->base) munmap(t->base, (size_t)t->file_bytes);
  t->base = NULL;
  void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd, 0);
  if (p == MAP_FAILED)
    return dlrec_error(DLREC_ERR_IO, "%s: cannot map the table's file (%llu bytes): %s", t->path,
                       (unsigned long long)bytes, strerror(errno));
  /* Rows are scattered: reading ahead would fill the page cache with rows
   * no batch asked for. */
  (void)madvise(p, (size_t)bytes, MADV_RANDOM);
  t->base = p;
  t->file_bytes = bytes;
  return DLREC_OK;
}

/* Write-back sweeps drop the pages behind them every this many bytes of
 * the table's section (and the same rows of the others). */
#define DROP_BYTES (32ull << 20)

/* The pages of [from, to) of the mapping leave the process (they stay in
 * the page cache, and the file keeps what was written). */
static void drop_range(tiered *t, uint64_t from, uint64_t to) {
  from &= ~(uint64_t)4095;
  to &= ~(uint64_t)4095;
  if (to > from) (void)madvise(t->base + from, (size_t)(to - from), MADV_DONTNEED);
}

static void drop_pages(tiered *t) { drop_range(t, 0, t->file_bytes); }

/* ---- the write-back buffer ------------------------------------------------------ */

/* Rows evicted dirty go to a buffer in RAM, not straight to the file: a
 * pwrite per 64-byte record cost a syscall each, serialized on ext4's inode
 * lock, and a write through the mapping would map the whole large folio
 * around each scattered row into the process. When the buffer is full (and
 * at flush), its records are sorted by row and written through the mapping
 * in one ascending sweep, dropping the pages behind it every DROP_BYTES: the
 * sweep touches each page once and holds at most DROP_BYTES (and a folio)
 * per section. A row evicted again before the sweep overwrites its record;
 * a row read back before the sweep is read from the buffer. */

static int wb_find(const tiered *t, uint64_t row, uint32_t *pos) {
  return (*pos = slot_index_find(&t->wb_index, row)) != SLOT_INDEX_NONE;
}

static void wb_clear(tiered *t) {
  t->wb_n = 0;
  slot_index_clear(&t->wb_index);
}

static int by_row(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Writes every buffered record to the file, in row order, and empties the
 * buffer. */
static void wb_sweep(tiered *t) {
  if (!t->wb_n) return;
  for (uint64_t i = 0; i < t->wb_n; i++) t->wb_order[i] = t->wb_row[i] << 32 | i;
  qsort(t->wb_order, (size_t)t->wb_n, sizeof *t->wb_order, by_row);
  const uint64_t rec = record_bytes(t), row_bytes = t->sec[SEC_TABLE].bytes;
  uint64_t dropped_to = t->wb_order[0] >> 32; /* rows below were written and their pages dropped */
  for (uint64_t i = 0; i < t->wb_n; i++) {
    const uint64_t row = t->wb_order[i] >> 32;
    const char *r = t->wb_data + (t->wb_order[i] & 0xffffffffu) * rec;
    if ((row - dropped_to) * row_bytes >= DROP_BYTES) {
      for (int k = 0; k < SEC_N; k++)
        if (t->sec[k].bytes)
          drop_range(t, t->sec[k].at + dropped_to * t->sec[k].bytes, t->sec[k].at + row * t->sec[k].bytes);
      dropped_to = row;
    }
    for (int k = 0; k < SEC_N; k++) {
      const section *c = &t->sec[k];
      if (!c->bytes) continue;
      memcpy(t->base + c->at + row * c->bytes, r, c->bytes);
      r += c->bytes;
    }
  }
  const uint64_t last = (t->wb_order[t->wb_n - 1] >> 32) + 1;
  for (int k = 0; k < SEC_N; k++)
    if (t->sec[k].bytes)
      drop_range(t, t->sec[k].at + dropped_to * t->sec[k].bytes, t->sec[k].at + last * t->sec[k].bytes + 4095);
  wb_clear(t);
}

/* Buffers the record of `row` from `slot` (sweeping first when full). */
static void wb_put(dlrec_store *s, uint64_t row, uint32_t slot) {
  tiered *t = s->tiered;
  const uint64_t rec = record_bytes(t);
  uint32_t pos;
  if (!wb_find(t, row, &pos)) {
    if (t->wb_n == t->wb_cap) wb_sweep(t);
    pos = (uint32_t)t->wb_n++;
    t->wb_row[pos] = row;
    slot_index_insert(&t->wb_index, row, pos);
  }
  char *r = t->wb_data + pos * rec;
  for (int k = 0; k < SEC_N; k++) {
    if (!t->sec[k].bytes) continue;
    memcpy(r, resident(s, k, slot), t->sec[k].bytes);
    r += t->sec[k].bytes;
  }
  s->stats.bytes_written += rec;
}

/* (Re)sizes the buffer for the current record size: wb_cap records. */
static dlrec_status wb_alloc(tiered *t) {
  free(t->wb_data);
  t->wb_data = malloc(t->wb_cap * record_bytes(t));
  if (!t->wb_data) return dlrec_error(DLREC_ERR_NOMEM, "tiered table %s: out of memory for its write-back buffer", t->path);
  return DLREC_OK;
}

/* ---- lifetime ----------------------------------------------------------------- */

dlrec_status tiered_create(dlrec_store *s, const dlrec_store_config *c) {
  if (!c->path || !*c->path) return dlrec_error(DLREC_ERR_INVALID, "tiered table: no file path");
  if (c->cache_rows < 1)
    return dlrec_error(DLREC_ERR_INVALID, "tiered table %s: cache_rows must be at least 1", c->path);
  tiered *t = calloc(1, sizeof *t);
  if (!t) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  s->tiered = t;
  t->fd = -1;
  t->cache_rows = c->cache_rows < s->rows ? c->cache_rows : s->rows;
  if (!(t->path = strdup(c->path))) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  t->slot_row = malloc(t->cache_rows * sizeof *t->slot_row);
  t->slot_batch = calloc(t->cache_rows, sizeof *t->slot_batch);
  t->slot_flags = calloc(t->cache_rows, 1);
  if (!t->slot_row || !t->slot_batch || !t->slot_flags)
    return dlrec_error(DLREC_ERR_NOMEM, "tiered table %s: out of memory for a cache of %llu rows", c->path,
                       (unsigned long long)t->cache_rows);
  for (uint64_t i = 0; i < t->cache_rows; i++) t->slot_row[i] = SLOT_EMPTY;
  dlrec_status st = slot_index_init(&t->index, t->cache_rows, t->path);
  if (st != DLREC_OK) return st;
  st = dlrec_table_create_dtype(&s->table, t->cache_rows, s->dim, s->dtype);
  if (st != DLREC_OK) return dlrec_error_context("tiered table %s, its cache: ", c->path);
  t->fd = open(c->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (t->fd < 0) return dlrec_error(DLREC_ERR_IO, "tiered table %s: %s", c->path, strerror(errno));
  t->sec[SEC_TABLE] = (section){0, s->stride * dlrec_table_dtype_bytes(s->dtype)};
  /* The write-back buffer holds a quarter of the cache's rows (at least a
   * few thousand): a sweep of the file per that many evictions. */
  t->wb_cap = t->cache_rows / 4 > WB_MIN ? t->cache_rows / 4 : WB_MIN;
  if (t->wb_cap > UINT32_MAX) t->wb_cap = UINT32_MAX;
  t->wb_row = malloc(t->wb_cap * sizeof *t->wb_row);
  t->wb_order = malloc(t->wb_cap * sizeof *t->wb_order);
  if (!t->wb_row || !t->wb_order)
    return dlrec_error(DLREC_ERR_NOMEM, "tiered table %s: out of memory for its write-back buffer", c->path);
  if ((st = slot_index_init(&t->wb_index, t->wb_cap, t->path)) != DLREC_OK) return st;
  st = wb_alloc(t);
  if (st != DLREC_OK) return st;
  return grow(t, align4k(s->rows * t->sec[SEC_TABLE].bytes));
}

void tiered_free(tiered *t) {
  if (!t) return;
  if (t->base) munmap(t->base, (size_t)t->file_bytes);
  if (t->fd >= 0) {
    close(t->fd);
    unlink(t->path);
  }
  free(t->path);
  free(t->slot_row);
  free(t->slot_batch);
  free(t->slot_flags);
  slot_index_free(&t->index);
  free(t->ids);
  free(t->moves);
  free(t->wb_row);
  free(t->wb_data);
  free(t->wb_order);
  slot_index_free(&t->wb_index);
  free(t);
}

size_t tiered_overhead_bytes(const dlrec_store *s) {
  const tiered *t = s->tiered;
  return t->cache_rows * (sizeof *t->slot_row + sizeof *t->slot_batch + 1) +
         slot_index_bytes(&t->index) + t->ids_cap * sizeof *t->ids +
         t->moves_cap * sizeof *t->moves +
         t->wb_cap * (record_bytes(t) + sizeof *t->wb_row + sizeof *t->wb_order) +
         slot_index_bytes(&t->wb_index);
}

/* Empties the cache without writing anything back. */
static void drop_cache(tiered *t) {
  for (uint64_t i = 0; i < t->used; i++) t->slot_row[i] = SLOT_EMPTY;
  memset(t->slot_flags, 0, t->cache_rows);
  slot_index_clear(&t->index);
  t->used = 0;
  t->hand = 0;
  wb_clear(t);
}

dlrec_status tiered_init_uniform(dlrec_store *s, const dlrec_row_range *ranges, uint32_t n_ranges, uint64_t seed) {
  tiered *t = s->tiered;
  dlrec_table *w = NULL;
  const uint64_t n = s->rows < INIT_WINDOW_ROWS ? s->rows : INIT_WINDOW_ROWS;
  dlrec_status st = dlrec_table_create_dtype(&w, n, s->dim, s->dtype);
  const uint32_t bytes = t->sec[SEC_TABLE].bytes;
  for (uint64_t r0 = 0; st == DLREC_OK && r0 < s->rows; r0 += n) {
    const uint64_t k = s->rows - r0 < n ? s->rows - r0 : n;
    /* The window table initializes rows [r0, r0 + n); only k are the table's. */
    table_init_window(w, r0, ranges, n_ranges, seed);
    st = dlrec_pwrite_all(t->fd, dlrec_table_raw(w), (size_t)(k * bytes), t->sec[SEC_TABLE].at + r0 * bytes, t->path);
  }
  dlrec_table_free(w);
  drop_cache(t);
  return st;
}

dlrec_status tiered_optim_added(dlrec_store *s, dlrec_sparse_optim *o, const dlrec_sparse_optim_config *c) {
  tiered *t = s->tiered;
  /* A 16-bit row rounds as the same row of a ram table would. */
  dlrec_sparse_optim_set_row_keys(o, t->slot_row);
  uint64_t at = t->file_bytes;
  if (c->kind == DLREC_SPARSE_ROWWISE_ADAGRAD) {
    t->sec[SEC_ACCUM] = (section){at, sizeof(float)};
    at = align4k(at + s->rows * sizeof(float));
  } else if (c->kind == DLREC_SPARSE_LAZY_ADAM) {
    const uint32_t row = s->stride * (uint32_t)sizeof(float);
    t->sec[SEC_M] = (section){at, row};
    at = align4k(at + s->rows * row);
    t->sec[SEC_V] = (section){at, row};
    at = align4k(at + s->rows * row);
    t->sec[SEC_STEPS] = (section){at, sizeof(uint32_t)};
    at = align4k(at + s->rows * sizeof(uint32_t));
  }
  wb_sweep(t); /* records change size */
  dlrec_status st = grow(t, at);
  if (st == DLREC_OK) st = wb_alloc(t);
  /* Adagrad's accumulators start at initial_accumulator; the rest at the
   * new bytes' zeros. The rows resident now got theirs from the optimizer. */
  if (st == DLREC_OK && t->sec[SEC_ACCUM].bytes && c->initial_accumulator != 0.0f) {
    enum { CHUNK = 65536 };
    float *buf = malloc(CHUNK * sizeof *buf);
    if (!buf) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < CHUNK; i++) buf[i] = c->initial_accumulator;
    for (uint64_t r = 0; st == DLREC_OK && r < s->rows; r += CHUNK) {
      const uint64_t k = s->rows - r < CHUNK ? s->rows - r : CHUNK;
      st = dlrec_pwrite_all(t->fd, buf, (size_t)k * sizeof(float), t->sec[SEC_ACCUM].at + r * sizeof(float), t->path);
    }
    free(buf);
  }
  return st;
}

/* ---- resolving a batch --------------------------------------------------------- */

/* A slot for a row not resident: a free one, else CLOCK's victim, whose row
 * goes to *evict when it must be written back (SLOT_EMPTY otherwise).
 * UINT32_MAX with an error when every slot is used by this batch. */
static uint32_t take_slot(dlrec_store *s, uint64_t *evict) {
  tiered *t = s->tiered;
  *evict = SLOT_EMPTY;
  if (t->used < t->cache_rows) return (uint32_t)t->used++;
  /* Two turns: the first may only clear reference bits. */
  for (uint64_t seen = 0; seen < 2 * t->cache_rows; seen++) {
    const uint64_t i = t->hand;
    t->hand = t->hand + 1 == t->cache_rows ? 0 : t->hand + 1;
    if (t->slot_batch[i] == t->batch) continue;
    if (t->slot_flags[i] & FLAG_REF) {
      t->slot_flags[i] &= (uint8_t)~FLAG_REF;
      continue;
    }
    if (t->slot_flags[i] & FLAG_DIRTY) *evict = t->slot_row[i];
    slot_index_remove(&t->index, t->slot_row[i]);
    t->slot_row[i] = SLOT_EMPTY;
    t->slot_flags[i] = 0;
    s->stats.evictions++;
    return (uint32_t)i;
  }
  dlrec_error(DLREC_ERR_INVALID,
              "tiered table %s: a batch touches more distinct rows than the cache's %llu (raise cache_rows)",
              t->path, (unsigned long long)t->cache_rows);
  return UINT32_MAX;
}

/* Moves the rows planned by resolve: first every evicted dirty row into
 * the write-back buffer, then every new row into its slot, from the buffer
 * when its newest record is there, else from the file. In that order a row
 * evicted from one slot and wanted again by the same batch (in another) is
 * read after its write. The reads touch different slots and only read the
 * buffer, so threads share them. */
static dlrec_status move_rows(dlrec_store *s, size_t n) {
  tiered *t = s->tiered;
  const uint64_t rec = record_bytes(t);
  for (size_t i = 0; i < n; i++)
    if (t->moves[i].evict != SLOT_EMPTY) wb_put(s, t->moves[i].evict, t->moves[i].slot);
  int failed = 0;
  char msg[512] = "";
#pragma omp parallel for schedule(dynamic, 64) if (n >= PARALLEL_IO_MIN)
  for (size_t i = 0; i < n; i++) {
    const move *m = &t->moves[i];
    uint32_t pos;
    if (wb_find(t, m->row, &pos)) {
      const char *r = t->wb_data + pos * rec;
      for (int k = 0; k < SEC_N; k++) {
        if (!t->sec[k].bytes) continue;
        memcpy(resident(s, k, m->slot), r, t->sec[k].bytes);
        r += t->sec[k].bytes;
      }
      continue;
    }
    if (read_row(s, m->row, m->slot) == DLREC_OK) continue;
#pragma omp critical(dlrec_tiered_move)
    if (!failed) {
      snprintf(msg, sizeof msg, "%s", dlrec_last_error());
      failed = 1;
    }
  }
  s->stats.bytes_read += n * rec;
  if (!failed) return DLREC_OK;
  t->broken = 1;
  return dlrec_error(DLREC_ERR_IO, "%s (the tiered table's cache no longer matches its index: resume from the last "
                     "checkpoint)", msg);
}

/* Room for the batch's ids (their slots) and for its misses' moves (a
 * batch misses at most its ids and at most the cache's slots). */
static dlrec_status batch_room(tiered *t, const dlrec_bag_batch *in) {
  size_t need = 0;
  for (uint32_t c = 0; c < in->cols; c++) need += in->offsets[c][in->rows];
  if (need > t->ids_cap) {
    uint32_t *p = realloc(t->ids, need * sizeof *p);
    if (!p) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    t->ids = p;
    t->ids_cap = need;
  }
  const size_t max_moves = need < t->cache_rows ? need : (size_t)t->cache_rows;
  if (max_moves > t->moves_cap) {
    move *m = realloc(t->moves, max_moves * sizeof *m);
    if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    t->moves = m;
    t->moves_cap = max_moves;
  }
  return DLREC_OK;
}

/* Every id's slot as the cache stands into t->ids, on all threads (the
 * index is only read): a slot found is marked as used by this batch, so no
 * miss after evicts it, with the same values by every thread that finds it. */
static void find_slots(dlrec_store *s, const dlrec_bag_batch *in, uint8_t mark) {
  tiered *t = s->tiered;
  size_t need = 0;
  for (uint32_t c = 0; c < in->cols; c++) need += in->offsets[c][in->rows];
#pragma omp parallel for schedule(dynamic, 1) if (need >= PARALLEL_FIND_MIN)
  for (uint32_t c = 0; c < in->cols; c++) {
    const uint32_t *off = in->offsets[c], *ids = in->ids[c];
    uint32_t *col = t->ids;
    for (uint32_t d = 0; d < c; d++) col += in->offsets[d][in->rows];
    int sound = 1; /* offsets that decrease are left to plan_misses to report */
    for (uint32_t b = 0; sound && b < in->rows; b++) sound = off[b + 1] >= off[b];
    for (uint32_t k = off[0]; sound && k < off[in->rows]; k++) {
      const uint32_t slot = ids[k] < s->rows ? slot_index_find(&t->index, ids[k]) : SLOT_INDEX_NONE;
      col[k] = slot;
      if (slot == SLOT_INDEX_NONE) continue;
#pragma omp atomic write
      t->slot_batch[slot] = t->batch;
#pragma omp atomic update
      t->slot_flags[slot] |= mark;
    }
  }
}

/* The plan of the misses, in batch order: a slot for each, the moves listed
 * (*n_moves of them), the batch's ids rewritten as slots. A refusal midway
 * leaves the moves planned so far, which the index already promises. */
static dlrec_status plan_misses(dlrec_store *s, const dlrec_bag_batch *in, int write, uint8_t mark,
                                size_t *n_moves) {
  tiered *t = s->tiered;
  uint32_t *dst = t->ids;
  dlrec_status st = DLREC_OK;
  for (uint32_t c = 0; st == DLREC_OK && c < in->cols; c++) {
    const uint32_t *off = in->offsets[c], *ids = in->ids[c];
    /* Checked before any id is written: k stays below off[rows], the room
     * this column has in t->ids. */
    for (uint32_t b = 0; st == DLREC_OK && b < in->rows; b++)
      if (off[b + 1] < off[b])
        st = dlrec_error(DLREC_ERR_INVALID, "column %u: offsets decrease at sample %u (%u, then %u)", c, b, off[b],
                         off[b + 1]);
    for (uint32_t b = 0; st == DLREC_OK && b < in->rows; b++) {
      for (uint32_t k = off[b]; k < off[b + 1]; k++) {
        const uint64_t row = ids[k];
        if (row >= s->rows) {
          st = dlrec_error(DLREC_ERR_INVALID, "column %u, sample %u: id %llu is outside the table of %llu rows", c, b,
                           (unsigned long long)row, (unsigned long long)s->rows);
          break;
        }
        uint32_t slot = dst[k]; /* found by find_slots, or SLOT_INDEX_NONE */
        s->stats.lookups++;
        if (write) store_mark_changed(s, row);
        if (slot != SLOT_INDEX_NONE) continue;
        /* Taken in by an earlier miss of this batch, or not resident. */
        if ((slot = slot_index_find(&t->index, row)) == SLOT_INDEX_NONE) {
          uint64_t evict;
          if ((slot = take_slot(s, &evict)) == UINT32_MAX) {
            st = dlrec_last_status();
            break;
          }
          t->moves[(*n_moves)++] = (move){evict, row, slot};
          t->slot_row[slot] = row;
          slot_index_insert(&t->index, row, slot);
          s->stats.misses++;
        }
        t->slot_batch[slot] = t->batch;
        t->slot_flags[slot] |= mark;
        dst[k] = slot;
      }
    }
    t->col_ids[c] = dst;
    dst += off[in->rows];
  }
  return st;
}

dlrec_status tiered_resolve(dlrec_store *s, const dlrec_bag_batch *in, dlrec_bag_batch *out, int write) {
  tiered *t = s->tiered;
  if (t->viewing) return dlrec_error(DLREC_ERR_INVALID, "tiered table %s: resolve while mapped", t->path);
  if (t->broken)
    return dlrec_error(DLREC_ERR_IO, "tiered table %s: an earlier read of the file failed; resume from the last "
                       "checkpoint", t->path);
  if (in->cols < 1 || in->cols > DLREC_BAG_MAX_COLS || !in->offsets || !in->ids)
    return dlrec_error(DLREC_ERR_INVALID, "store_resolve: bad batch (%u columns)", in->cols);
  dlrec_status st = batch_room(t, in);
  if (st != DLREC_OK) return st;
  if (++t->batch == 0) { /* wrapped: no slot may look used by this batch */
    memset(t->slot_batch, 0, t->cache_rows * sizeof *t->slot_batch);
    t->batch = 1;
  }
  const uint8_t mark = (uint8_t)(FLAG_REF | (write ? FLAG_DIRTY : 0));
  find_slots(s, in, mark);
  size_t n_moves = 0;
  st = plan_misses(s, in, write, mark, &n_moves);
  s->stats.resident = t->used;
  /* A refusal midway still makes the moves planned so far, which the
   * index already promises. */
  if (st != DLREC_OK) {
    dlrec_error_copy e;
    dlrec_error_save(&e);
    return move_rows(s, n_moves) == DLREC_OK ? dlrec_error_restore(&e) : dlrec_last_status();
  }
  if ((st = move_rows(s, n_moves)) != DLREC_OK) return st;
  *out = *in;
  out->ids = t->col_ids;
  return DLREC_OK;
}

static dlrec_status tiered_flush(dlrec_store *s) {
  tiered *t = s->tiered;
  for (uint64_t i = 0; i < t->used; i++) {
    if (!(t->slot_flags[i] & FLAG_DIRTY)) continue;
    wb_put(s, t->slot_row[i], (uint32_t)i);
    t->slot_flags[i] &= (uint8_t)~FLAG_DIRTY;
  }
  wb_sweep(t);
  return DLREC_OK;
}

/* ---- the whole table, for checkpoints --------------------------------------------- */

dlrec_status tiered_map(dlrec_store *s, dlrec_store_view *v) {
  tiered *t = s->tiered;
  if (t->viewing) return dlrec_error(DLREC_ERR_INVALID, "tiered table %s: mapped twice", t->path);
  dlrec_status st = tiered_flush(s);
  if (st != DLREC_OK) return st;
  drop_cache(t);
  (void)madvise(t->base, (size_t)t->file_bytes, MADV_SEQUENTIAL);
  t->viewing = 1;
  v->mapped = 1;
  char *base = t->base;
  v->table = base + t->sec[SEC_TABLE].at;
  if (s->optim) {
    dlrec_sparse_optim_state_view(s->optim, &v->optim); /* for its update counter */
    v->optim.rows = s->rows;
    v->optim.accum = t->sec[SEC_ACCUM].bytes ? (float *)(base + t->sec[SEC_ACCUM].at) : NULL;
    v->optim.m = t->sec[SEC_M].bytes ? (float *)(base + t->sec[SEC_M].at) : NULL;
    v->optim.v = t->sec[SEC_V].bytes ? (float *)(base + t->sec[SEC_V].at) : NULL;
    v->optim.steps = t->sec[SEC_STEPS].bytes ? (uint32_t *)(base + t->sec[SEC_STEPS].at) : NULL;
  }
  return DLREC_OK;
}

/* The view's reads and writes touched the whole file: its pages leave the
 * process's resident memory (the page cache keeps them). */
void tiered_unmap(dlrec_store *s, dlrec_store_view *v) {
  tiered *t = s->tiered;
  (void)v;
  if (!t->viewing) return;
  (void)madvise(t->base, (size_t)t->file_bytes, MADV_RANDOM);
  drop_pages(t);
  t->viewing = 0;
}
