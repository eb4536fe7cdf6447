/* A checkpoint's format (train/checkpoint_impl.h): its files' names, the
 * arrays of each tensor file (dense.bin, table.bin, optim.bin, hash.bin,
 * the journals) over a network, its optimizer and a store's view, or
 * streamed through a row source; paths and whole files' checksums; a run
 * directory's checkpoints by step, and the file a journal's table.bin links. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/crc32c.h"
#include "core/fsutil.h"
#include "backend/table_store.h"
#include "train/checkpoint_impl.h"

const char *const ckpt_etl_files[] = {"etl.json", "vocab.bin", NULL};

const char *const ckpt_file_names[N_FILES] = {"config.json", "etl/etl.json", "etl/vocab.bin",
                                              "dense.bin",   "table.bin",    "optim.bin",
                                              "journal.bin", "journal_optim.bin", "hash.bin"};

/* dense.bin's arrays: one per named tensor of the network, in plan order. */
int ckpt_dense_arrays(const dlrec_net *n, float *params, tensor_desc *out) {
  const dlrec_net_tensor *t = dlrec_net_tensors(n);
  uint32_t k = dlrec_net_n_tensors(n);
  for (uint32_t i = 0; i < k; i++) out[i] = tensor_array(t[i].name, TENSOR_F32, t[i].count, params + t[i].offset, 0);
  return (int)k;
}

/* The whole table and its optimizer state, wherever the network's store
 * keeps them (dlrec_store_map: for a tiered table, its file, flushed first).
 * A ram store's optimizer may have been made on its table directly rather
 * than through the store; its state is then the optimizer's own. Pair with
 * dlrec_store_unmap. */
dlrec_status ckpt_map_table(const dlrec_net *n, const dlrec_net_optim *opt, dlrec_store_view *v) {
  dlrec_store *store = dlrec_net_store(n);
  TRY(dlrec_store_map(store, v));
  if (opt && !v->optim.rows && dlrec_store_get_kind(store) == DLREC_STORE_RAM)
    dlrec_sparse_optim_state_view(opt->sparse, &v->optim);
  return DLREC_OK;
}

/* The arrays of optim.bin for this optimizer setup (none for SGD + SGD),
 * the sparse optimizer's state taken from v, as map_table shows it. */
int ckpt_optim_arrays(const dlrec_net_optim *opt, const dlrec_store_view *v, size_t n_params, tensor_desc *out) {
  const dlrec_sparse_optim_state st = v->optim;
  const int mapped = v->mapped;
  int n = 0;
  size_t dense_floats = dlrec_optim_state_floats(&opt->dense, n_params);
  if (dense_floats) out[n++] = tensor_array("dense_state", TENSOR_F32, dense_floats, opt->dense_state, 0);
  if (st.accum) out[n++] = tensor_array("sparse_accum", TENSOR_F32, st.rows, st.accum, mapped);
  if (st.m) out[n++] = tensor_array("sparse_m", TENSOR_F32, st.rows * st.stride, st.m, mapped);
  if (st.v) out[n++] = tensor_array("sparse_v", TENSOR_F32, st.rows * st.stride, st.v, mapped);
  if (st.steps) out[n++] = tensor_array("sparse_steps", TENSOR_U32, st.rows, st.steps, mapped);
  /* A 16-bit table's update counter keys its stochastic rounding: restoring
   * it makes a resumed run round as the uninterrupted one. One u64 stored as
   * two little-endian u32s. */
  if (st.updates) out[n++] = tensor_array("sparse_updates", TENSOR_U32, 2, st.updates, 0);
  return n;
}

/* table.bin's type: as the table stores its rows, so that a load into a
 * table of another dtype is refused naming both. */
tensor_dtype ckpt_table_tensor_dtype(const dlrec_table *t) {
  static const tensor_dtype of[] = {[DLREC_TABLE_FP32] = TENSOR_F32, [DLREC_TABLE_BF16] = TENSOR_BF16,
                                    [DLREC_TABLE_FP16] = TENSOR_F16};
  return of[dlrec_table_get_dtype(t)];
}

/* table.bin's one array (rows in v.table, as map_table shows them). */
tensor_desc ckpt_table_array(const dlrec_net *n, const dlrec_store_view *v) {
  const dlrec_table *t = dlrec_net_table_const(n);
  const uint64_t rows = v->rows ? v->rows : dlrec_store_rows(dlrec_net_store(n));
  return tensor_array("table", ckpt_table_tensor_dtype(t), rows * dlrec_table_stride(t), v->table, v->mapped);
}

/* ---- rows from a dlrec_row_source ------------------------------------------ */


static dlrec_status stream_rows(void *ctx, uint64_t at, void *buf, size_t k) {
  const source_stream *x = ctx;
  if (at % x->row_bytes || k % x->row_bytes)
    return dlrec_error(DLREC_ERR_INTERNAL, "a chunk of %zu bytes at %llu is not rows of %llu bytes", k,
                       (unsigned long long)at, (unsigned long long)x->row_bytes);
  const uint64_t first = at / x->row_bytes, n = k / x->row_bytes;
  return x->write ? x->src->get(x->src->ctx, x->array, first, n, buf) : x->src->put(x->src->ctx, x->array, first, n, buf);
}

static tensor_desc streamed(const char *name, tensor_dtype dtype, uint64_t row_elems, uint64_t row_bytes,
                            const dlrec_row_source *src, dlrec_row_array a, int write, source_stream *x) {
  *x = (source_stream){src, a, row_bytes, write};
  tensor_desc d = tensor_array(name, dtype, src->rows * row_elems, NULL, 0);
  d.stream = stream_rows;
  d.stream_ctx = x;
  return d;
}

/* table.bin's array from src (write) or into it (read). */
tensor_desc ckpt_source_table(const dlrec_net *n, const dlrec_row_source *src, int write, source_stream *x) {
  const dlrec_table *t = dlrec_net_table_const(n);
  const uint32_t stride = dlrec_table_stride(t);
  return streamed("table", ckpt_table_tensor_dtype(t), stride,
                  (uint64_t)stride * dlrec_table_dtype_bytes(dlrec_table_get_dtype(t)), src, DLREC_ROWS_TABLE, write,
                  x);
}

/* optim.bin's arrays, in optim_arrays' order, the per-row ones through src
 * (the sparse optimizer's kind from cfg). x holds 4 streams. */
int ckpt_source_optim_arrays(const dlrec_train_config *cfg, const dlrec_net *n, const dlrec_net_optim *opt,
                             const dlrec_row_source *src, size_t n_params, int write, source_stream *x,
                             tensor_desc *out) {
  const uint64_t stride = dlrec_table_stride(dlrec_net_table_const(n));
  int k = 0;
  size_t dense_floats = dlrec_optim_state_floats(&opt->dense, n_params);
  if (dense_floats) out[k++] = tensor_array("dense_state", TENSOR_F32, dense_floats, opt->dense_state, 0);
  if (cfg->sparse.kind == DLREC_SPARSE_ROWWISE_ADAGRAD)
    out[k++] = streamed("sparse_accum", TENSOR_F32, 1, 4, src, DLREC_ROWS_ACCUM, write, &x[0]);
  if (cfg->sparse.kind == DLREC_SPARSE_LAZY_ADAM || cfg->sparse.kind == DLREC_SPARSE_ADAM) {
    out[k++] = streamed("sparse_m", TENSOR_F32, stride, 4 * stride, src, DLREC_ROWS_M, write, &x[1]);
    out[k++] = streamed("sparse_v", TENSOR_F32, stride, 4 * stride, src, DLREC_ROWS_V, write, &x[2]);
    out[k++] = streamed("sparse_steps", TENSOR_U32, 1, 4, src, DLREC_ROWS_STEPS, write, &x[3]);
  }
  if (src->updates) out[k++] = tensor_array("sparse_updates", TENSOR_U32, 2, src->updates, 0);
  return k;
}

/* hash.bin's arrays: a hash table's bookkeeping (dlrec_store_hash_arrays),
 * whose table.bin holds its resident rows: which key each row holds, when
 * it was last looked up, the free rows, the admission sketch, the scalars. */
int ckpt_hash_arrays(const dlrec_net *n, tensor_desc *out) {
  dlrec_hash_arrays a;
  if (dlrec_store_hash_arrays(dlrec_net_store(n), &a) != DLREC_OK) return 0;
  int k = 0;
  out[k++] = tensor_array("hash_meta", TENSOR_U32, a.meta_words, a.meta, 0);
  out[k++] = tensor_array("hash_free", TENSOR_U32, a.n_slots, a.free_slots, 0);
  if (a.sketch) out[k++] = tensor_array("hash_sketch", TENSOR_U32, a.sketch_words, a.sketch, 0);
  out[k++] = tensor_array("hash_scalars", TENSOR_U32, a.n_scalars, a.scalars, 0);
  return k;
}

/* ---- journals ---------------------------------------------------------------------- */

/* d restricted to the n rows listed (of the table's `table_rows`): its
 * count elements become n rows of count / table_rows elements each. */
static tensor_desc gathered(tensor_desc d, const uint32_t *rows, uint64_t n, uint64_t table_rows) {
  d.row_elems = d.count / table_rows;
  d.count = n * d.row_elems;
  d.rows = rows;
  return d;
}

/* journal.bin's arrays: "rows" (the changed rows, ascending), then "table",
 * those rows of table.bin's array. check_only: the rows' data are not
 * copied (a read that checks them). */
int ckpt_journal_table_arrays(const dlrec_net *n, void *table, int mapped, uint32_t *rows, uint64_t n_rows,
                              int check_only, tensor_desc *out) {
  const uint64_t table_rows = dlrec_store_changes_space(dlrec_net_store(n));
  const dlrec_store_view v = {.rows = table_rows, .table = table, .mapped = mapped};
  out[0] = tensor_array("rows", TENSOR_U32, n_rows, rows, 0);
  out[1] = gathered(ckpt_table_array(n, &v), rows, n_rows, table_rows);
  if (check_only) out[1].data = NULL, out[1].rows = NULL;
  return 2;
}

/* journal_optim.bin's arrays: optim.bin's, each per-row one restricted to
 * the changed rows, the others (the dense optimizer's state, the update
 * counter) whole. */
int ckpt_journal_optim_arrays(const dlrec_net_optim *opt, const dlrec_store_view *v, size_t n_params,
                              uint64_t table_rows, const uint32_t *rows, uint64_t n_rows, tensor_desc *out) {
  int k = ckpt_optim_arrays(opt, v, n_params, out);
  for (int i = 0; i < k; i++)
    if (strcmp(out[i].name, "dense_state") && strcmp(out[i].name, "sparse_updates"))
      out[i] = gathered(out[i], rows, n_rows, table_rows);
  return k;
}

dlrec_status ckpt_join(char *out, size_t n, const char *dir, const char *name) {
  return dlrec_path_join(out, n, dir, name);
}

/* Checkpoint names sort by step: ckpt-%012llu. */
int ckpt_step(const char *name, uint64_t *step) {
  unsigned long long v;
  int len = 0;
  if (sscanf(name, "ckpt-%12llu%n", &v, &len) != 1 || len != 17 || name[len]) return 0;
  *step = v;
  return 1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

size_t ckpt_list_steps(const char *run_dir, uint64_t *steps, size_t max) {
  DIR *d = opendir(run_dir);
  if (!d) return 0;
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < max)
    if (ckpt_step(e->d_name, &steps[n])) n++;
  closedir(d);
  qsort(steps, n, sizeof *steps, cmp_u64);
  return n;
}

dlrec_status ckpt_step_dir(const char *run_dir, uint64_t step, char *out, size_t out_size) {
  char name[64];
  snprintf(name, sizeof name, "ckpt-%012" PRIu64, step);
  return ckpt_join(out, out_size, run_dir, name);
}

int ckpt_table_id(const char *dir, uint64_t id[2]) {
  char path[4096];
  struct stat st;
  if (ckpt_join(path, sizeof path, dir, ckpt_file_names[F_TABLE]) != DLREC_OK || stat(path, &st) != 0) return 0;
  id[0] = (uint64_t)st.st_dev;
  id[1] = (uint64_t)st.st_ino;
  return 1;
}

int ckpt_file_size(const char *path, uint64_t *bytes) {
  struct stat st;
  if (stat(path, &st) != 0) return -1;
  *bytes = (uint64_t)st.st_size;
  return 0;
}

/* The size and CRC32C of a whole file. */
dlrec_status ckpt_file_crc(const char *path, uint64_t *bytes, uint32_t *crc) {
  FILE *f = fopen(path, "rb");
  if (!f) return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  enum { CHUNK = 1 << 20 };
  char *buf = malloc(CHUNK);
  uint32_t c = 0;
  uint64_t n = 0;
  size_t k;
  while (buf && (k = fread(buf, 1, CHUNK, f)) > 0) {
    c = dlrec_crc32c(c, buf, k);
    n += k;
  }
  dlrec_status s = !buf ? dlrec_error(DLREC_ERR_NOMEM, "out of memory")
                   : ferror(f) ? dlrec_error(DLREC_ERR_IO, "%s: read failed", path)
                               : DLREC_OK;
  free(buf);
  fclose(f);
  *bytes = n;
  *crc = c;
  return s;
}
