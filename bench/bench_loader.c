/* Loader throughput on a page-cached .dlr file of Criteo shape (label, 13
 * dense f32, 26 one-hot u32 columns: 160 bytes per row).
 *
 *   bench_loader [--rows N] [--path FILE] [--seconds S] [--keep]
 *
 * Writes the file with the .dlr writer (default 5M rows, in groups of 65536),
 * reads it once so it is in the page cache, measures memcpy bandwidth over
 * the same bytes (the roofline), then samples/s for batch 2048 and 128 with
 * shuffling on (default window and slices), with slice_rows 1 (a full row
 * shuffle inside the window), and unshuffled, each with 1 and 2 assembling
 * threads. Each configuration first runs one untimed epoch (which also
 * verifies every row group's checksum), then is timed for S seconds. One
 * line per configuration. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dlr.h"
#include "data/loader.h"
#include "core/clock.h"
#include "core/progress.h"
#include "core/rng.h"

#define GROUP_ROWS 65536u
#define N_DENSE 13
#define N_SPARSE 26
#define IDS_PER_COL 100000u

static void criteo_schema(dlrec_schema *s) {
  memset(s, 0, sizeof *s);
  s->has_label = 1;
  strcpy(s->label_name, "label");
  s->n_dense = N_DENSE;
  for (int i = 0; i < N_DENSE; i++) snprintf(s->dense_names[i], DLREC_NAME_MAX, "I%d", i + 1);
  s->n_sparse = N_SPARSE;
  for (int c = 0; c < N_SPARSE; c++) {
    snprintf(s->sparse[c].name, DLREC_NAME_MAX, "C%d", c + 1);
    s->sparse[c].hotness = s->sparse[c].max_hotness = 1;
    s->sparse[c].id_begin = (uint64_t)c * IDS_PER_COL;
    s->sparse[c].id_end = (uint64_t)(c + 1) * IDS_PER_COL;
  }
  s->table_rows = (uint64_t)N_SPARSE * IDS_PER_COL;
}

static int write_file(const char *path, uint64_t rows) {
  dlrec_schema s;
  criteo_schema(&s);
  float *labels = malloc(GROUP_ROWS * 4), *dense = malloc((size_t)GROUP_ROWS * N_DENSE * 4);
  uint32_t *ids = malloc((size_t)GROUP_ROWS * N_SPARSE * 4);
  dlrec_dlr_writer *w;
  if (!labels || !dense || !ids || dlrec_dlr_writer_open(&w, path, &s) != DLREC_OK) {
    fprintf(stderr, "bench_loader: %s\n", dlrec_last_error());
    return 0;
  }
  dlrec_rng r;
  dlrec_rng_seed(&r, 1, 0);
  dlrec_progress *bar = dlrec_progress_start("write", rows, "rows");
  for (uint64_t done = 0; done < rows;) {
    uint32_t n = rows - done < GROUP_ROWS ? (uint32_t)(rows - done) : GROUP_ROWS;
    for (uint32_t i = 0; i < n; i++) {
      uint64_t x = dlrec_rng_u64(&r);
      labels[i] = (float)(x & 1);
      for (int k = 0; k < N_DENSE; k++) dense[(size_t)i * N_DENSE + k] = (float)((x >> (k * 4)) & 255) * 0.01f;
    }
    dlrec_rowgroup rg = {.rows = n, .labels = labels, .dense = dense};
    for (int c = 0; c < N_SPARSE; c++) {
      uint32_t *col = ids + (size_t)c * GROUP_ROWS;
      for (uint32_t i = 0; i < n; i++)
        col[i] = (uint32_t)(c * IDS_PER_COL) + (uint32_t)(dlrec_rng_u64(&r) % IDS_PER_COL);
      rg.ids[c] = col;
    }
    if (dlrec_dlr_writer_append(w, &rg) != DLREC_OK) {
      fprintf(stderr, "bench_loader: %s\n", dlrec_last_error());
      dlrec_dlr_writer_abort(w);
      return 0;
    }
    done += n;
    dlrec_progress_add(bar, n);
  }
  dlrec_progress_finish(bar);
  free(labels);
  free(dense);
  free(ids);
  if (dlrec_dlr_writer_finish(w) != DLREC_OK) {
    fprintf(stderr, "bench_loader: %s\n", dlrec_last_error());
    return 0;
  }
  return 1;
}

/* memcpy of every column of every group into a batch-sized buffer that
 * cycles (as the loader's ring does): the same bytes the loader moves, in
 * the largest runs possible. Returns bytes/s. Also brings the file into the
 * page cache and the mapping. */
static double memcpy_rate(const dlrec_dlr *f, double seconds) {
  const size_t dst_bytes = 2048ull * (4 + 4 * N_DENSE + 4 * N_SPARSE);
  char *dst = aligned_alloc(64, dst_bytes);
  uint64_t bytes = 0;
  double t0 = dlrec_now(), t;
  int passes = 0;
  do {
    for (uint32_t g = 0; g < dlrec_dlr_row_groups(f); g++) {
      dlrec_rowgroup rg;
      if (dlrec_dlr_row_group(f, g, &rg) != DLREC_OK) return 0;
      const void *src[2 + N_SPARSE];
      size_t len[2 + N_SPARSE];
      src[0] = rg.labels, len[0] = 4ull * rg.rows;
      src[1] = rg.dense, len[1] = 4ull * rg.rows * N_DENSE;
      for (int c = 0; c < N_SPARSE; c++) src[2 + c] = rg.ids[c], len[2 + c] = 4ull * rg.rows;
      for (int k = 0; k < 2 + N_SPARSE; k++)
        for (size_t off = 0; off < len[k]; off += dst_bytes) {
          size_t n = len[k] - off < dst_bytes ? len[k] - off : dst_bytes;
          memcpy(dst, (const char *)src[k] + off, n);
          bytes += n;
        }
    }
    passes++;
    t = dlrec_now() - t0;
  } while (t < seconds || passes < 2);
  volatile char sink = dst[dst_bytes / 3];
  (void)sink;
  free(dst);
  return (double)bytes / t;
}

static void run_config(const char *path, uint32_t batch, int shuffle, uint32_t slice, uint32_t threads, double seconds,
                       double memcpy_bps) {
  dlrec_loader_opts o;
  dlrec_loader_opts_default(&o);
  o.batch_rows = batch;
  o.shuffle = shuffle;
  if (slice) o.slice_rows = slice;
  o.threads = threads;
  o.epochs = 0;
  dlrec_loader *l;
  if (dlrec_loader_open(&l, &path, 1, &o) != DLREC_OK) {
    fprintf(stderr, "bench_loader: %s\n", dlrec_last_error());
    return;
  }
  const dlrec_batch *b;
  uint64_t rows = 0;
  double sum = 0;
  /* One untimed epoch: checksums are verified on first use of each group. */
  double t0 = dlrec_now();
  while (rows < dlrec_loader_epoch_rows(l) && dlrec_loader_next(l, &b) == DLREC_OK) rows += b->rows;
  double first = dlrec_now() - t0;
  uint64_t first_rows = rows;
  rows = 0;
  t0 = dlrec_now();
  double t;
  do {
    for (int k = 0; k < 16; k++) {
      if (dlrec_loader_next(l, &b) != DLREC_OK) {
        fprintf(stderr, "bench_loader: %s\n", dlrec_last_error());
        dlrec_loader_close(l);
        return;
      }
      rows += b->rows;
      sum += b->labels[b->rows - 1]; /* touch the batch, as a consumer would */
    }
    t = dlrec_now() - t0;
  } while (t < seconds);
  dlrec_loader_close(l);
  double rate = (double)rows / t, bps = rate * (4 + 4 * N_DENSE + 4 * N_SPARSE);
  char what[64];
  if (!shuffle)
    snprintf(what, sizeof what, "unshuffled");
  else
    snprintf(what, sizeof what, "shuffle w%u s%u", o.window_groups, o.slice_rows);
  printf(
      "loader batch %5u %-16s threads %u: %7.2fM samples/s  %6.2f GB/s  %.2f of memcpy  (first epoch, "
      "verifying: %.2fM/s)%s\n",
      batch, what, threads, rate / 1e6, bps / 1e9, bps / memcpy_bps, (double)first_rows / first / 1e6,
      sum < 0 ? "!" : "");
  fflush(stdout);
}

int main(int argc, char **argv) {
  uint64_t rows = 5000000;
  const char *path = "/tmp/dlrec_bench_loader.dlr";
  double seconds = 1.0;
  int keep = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--rows") && i + 1 < argc)
      rows = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--path") && i + 1 < argc)
      path = argv[++i];
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--keep"))
      keep = 1;
    else {
      fprintf(stderr, "usage: bench_loader [--rows N] [--path FILE] [--seconds S] [--keep]\n");
      return 2;
    }
  }
  if (rows < 4096 || seconds <= 0) {
    fprintf(stderr, "bench_loader: --rows must be at least 4096 and --seconds positive\n");
    return 2;
  }
  double t0 = dlrec_now();
  if (!write_file(path, rows)) return 1;
  double wt = dlrec_now() - t0;
  dlrec_dlr *f;
  if (dlrec_dlr_open(&f, path) != DLREC_OK) {
    fprintf(stderr, "bench_loader: %s\n", dlrec_last_error());
    return 1;
  }
  printf("file %s: %llu rows, %u row groups, %.1f MB, written in %.2fs (%.2fM rows/s)\n", path,
         (unsigned long long)rows, dlrec_dlr_row_groups(f), (double)dlrec_dlr_file_bytes(f) / 1e6, wt,
         (double)rows / wt / 1e6);
  t0 = dlrec_now();
  for (uint32_t g = 0; g < dlrec_dlr_row_groups(f); g++)
    if (dlrec_dlr_verify(f, g) != DLREC_OK) {
      fprintf(stderr, "bench_loader: %s\n", dlrec_last_error());
      return 1;
    }
  double vt = dlrec_now() - t0;
  double bw = memcpy_rate(f, seconds);
  printf(
      "verify (crc32c + id ranges): %.2f GB/s; memcpy of the same columns: %.2f GB/s = %.1fM rows/s at %d bytes/row\n",
      (double)dlrec_dlr_file_bytes(f) / vt / 1e9, bw / 1e9, bw / (4 + 4 * N_DENSE + 4 * N_SPARSE) / 1e6,
      4 + 4 * N_DENSE + 4 * N_SPARSE);
  dlrec_dlr_close(f);
  fflush(stdout);

  const uint32_t batches[] = {2048, 128};
  for (int bi = 0; bi < 2; bi++)
    for (uint32_t threads = 1; threads <= 2; threads++) {
      run_config(path, batches[bi], 1, 0, threads, seconds, bw);
      run_config(path, batches[bi], 1, 1, threads, seconds, bw);
      run_config(path, batches[bi], 0, 0, threads, seconds, bw);
    }
  if (!keep) unlink(path);
  return 0;
}
