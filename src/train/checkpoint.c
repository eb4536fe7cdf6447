/* Checkpoints: an atomic directory per save, a `latest` pointer, pruning,
 * and loading for resume, evaluation, prediction and serving. */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/crc32c.h"
#include "core/fsutil.h"
#include "core/json.h"
#include "core/log.h"
#include "backend/table_impl.h"
#include "train/etl_match.h"
#include "train/tensor_file.h"

#define TRY(expr)                    \
  do {                               \
    dlrec_status st_ = (expr);       \
    if (st_ != DLREC_OK) return st_; \
  } while (0)

static const char *const ETL_FILES[] = {"etl.json", "vocab.bin", NULL};

/* The files a checkpoint may hold, as the manifest names them. Each is
 * listed with its size and the CRC32C of all its bytes, and the manifest
 * carries a CRC32C of itself, so that every byte of a checkpoint is covered. */
enum { F_CONFIG, F_ETL_JSON, F_ETL_VOCAB, F_DENSE, F_TABLE, F_OPTIM, F_JOURNAL, F_JOURNAL_OPTIM, F_HASH, N_FILES };
static const char *const FILE_NAMES[N_FILES] = {"config.json", "etl/etl.json", "etl/vocab.bin",
                                                "dense.bin",   "table.bin",    "optim.bin",
                                                "journal.bin", "journal_optim.bin", "hash.bin"};

typedef struct manifest {
  dlrec_train_progress p;
  int has[N_FILES];
  uint64_t bytes[N_FILES];
  uint32_t crc[N_FILES];
  /* The model: its type and its named dense tensors (names and shapes; the
   * offsets and counts follow from the shapes), as dense.bin holds them. */
  char type[DLREC_NET_TYPE_MAX];
  uint32_t n_tensors;
  dlrec_net_tensor tensors[DLREC_NET_MAX_TENSORS];
  /* A journaled checkpoint (has[F_JOURNAL]): the step of the full
   * checkpoint whose table.bin and optim.bin it links, and the rows its
   * journal holds. */
  uint64_t journal_base, journal_rows;
} manifest;

static dlrec_status read_tensors(const char *dir, const manifest *m, int i, const tensor_desc *arrays, int n);
static dlrec_status read_manifest(const char *dir, manifest *m);

/* "(3, 4)" or "(4)": a tensor's shape for messages. */
static const char *shape_str(const dlrec_net_tensor *t, char *buf, size_t n) {
  if (t->ndim == 2) snprintf(buf, n, "(%u, %u)", t->shape[0], t->shape[1]);
  else snprintf(buf, n, "(%u)", t->shape[0]);
  return buf;
}

/* dense.bin's arrays: one per named tensor of the network, in plan order. */
static int dense_arrays(const dlrec_net *n, float *params, tensor_desc *out) {
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
static dlrec_status map_table(const dlrec_net *n, const dlrec_net_optim *opt, dlrec_store_view *v) {
  dlrec_store *store = dlrec_net_store(n);
  TRY(dlrec_store_map(store, v));
  if (opt && !v->optim.rows && dlrec_store_get_kind(store) == DLREC_STORE_RAM)
    dlrec_sparse_optim_state_view(opt->sparse, &v->optim);
  return DLREC_OK;
}

/* The arrays of optim.bin for this optimizer setup (none for SGD + SGD),
 * the sparse optimizer's state taken from v, as map_table shows it. */
static int optim_arrays(const dlrec_net_optim *opt, const dlrec_store_view *v, size_t n_params, tensor_desc *out) {
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
static tensor_dtype table_tensor_dtype(const dlrec_table *t) {
  static const tensor_dtype of[] = {[DLREC_TABLE_FP32] = TENSOR_F32, [DLREC_TABLE_BF16] = TENSOR_BF16,
                                    [DLREC_TABLE_FP16] = TENSOR_F16};
  return of[dlrec_table_get_dtype(t)];
}

/* table.bin's one array (rows in v.table, as map_table shows them). */
static tensor_desc table_array(const dlrec_net *n, const dlrec_store_view *v) {
  const dlrec_table *t = dlrec_net_table_const(n);
  const uint64_t rows = v->rows ? v->rows : dlrec_store_rows(dlrec_net_store(n));
  return tensor_array("table", table_tensor_dtype(t), rows * dlrec_table_stride(t), v->table, v->mapped);
}

/* ---- rows from a dlrec_row_source ------------------------------------------ */

/* One array of table.bin or optim.bin streamed through a row source: byte
 * chunks become whole rows (the chunks are multiples of a row's bytes). */
typedef struct source_stream {
  const dlrec_row_source *src;
  dlrec_row_array array;
  uint64_t row_bytes;
  int write;
} source_stream;

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
static tensor_desc source_table(const dlrec_net *n, const dlrec_row_source *src, int write, source_stream *x) {
  const dlrec_table *t = dlrec_net_table_const(n);
  const uint32_t stride = dlrec_table_stride(t);
  return streamed("table", table_tensor_dtype(t), stride,
                  (uint64_t)stride * dlrec_table_dtype_bytes(dlrec_table_get_dtype(t)), src, DLREC_ROWS_TABLE, write,
                  x);
}

/* optim.bin's arrays, in optim_arrays' order, the per-row ones through src
 * (the sparse optimizer's kind from cfg). x holds 4 streams. */
static int source_optim_arrays(const dlrec_train_config *cfg, const dlrec_net *n, const dlrec_net_optim *opt,
                               const dlrec_row_source *src, size_t n_params, int write, source_stream *x,
                               tensor_desc *out) {
  const uint64_t stride = dlrec_table_stride(dlrec_net_table_const(n));
  int k = 0;
  size_t dense_floats = dlrec_optim_state_floats(&opt->dense, n_params);
  if (dense_floats) out[k++] = tensor_array("dense_state", TENSOR_F32, dense_floats, opt->dense_state, 0);
  if (cfg->sparse.kind == DLREC_SPARSE_ROWWISE_ADAGRAD)
    out[k++] = streamed("sparse_accum", TENSOR_F32, 1, 4, src, DLREC_ROWS_ACCUM, write, &x[0]);
  if (cfg->sparse.kind == DLREC_SPARSE_LAZY_ADAM) {
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
static int hash_arrays(const dlrec_net *n, tensor_desc *out) {
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
static int journal_table_arrays(const dlrec_net *n, void *table, int mapped, uint32_t *rows, uint64_t n_rows,
                                int check_only, tensor_desc *out) {
  const uint64_t table_rows = dlrec_store_changes_space(dlrec_net_store(n));
  const dlrec_store_view v = {.rows = table_rows, .table = table, .mapped = mapped};
  out[0] = tensor_array("rows", TENSOR_U32, n_rows, rows, 0);
  out[1] = gathered(table_array(n, &v), rows, n_rows, table_rows);
  if (check_only) out[1].data = NULL, out[1].rows = NULL;
  return 2;
}

/* journal_optim.bin's arrays: optim.bin's, each per-row one restricted to
 * the changed rows, the others (the dense optimizer's state, the update
 * counter) whole. */
static int journal_optim_arrays(const dlrec_net_optim *opt, const dlrec_store_view *v, size_t n_params,
                                uint64_t table_rows, const uint32_t *rows, uint64_t n_rows, tensor_desc *out) {
  int k = optim_arrays(opt, v, n_params, out);
  for (int i = 0; i < k; i++)
    if (strcmp(out[i].name, "dense_state") && strcmp(out[i].name, "sparse_updates"))
      out[i] = gathered(out[i], rows, n_rows, table_rows);
  return k;
}

static dlrec_status join(char *out, size_t n, const char *dir, const char *name) {
  return dlrec_path_join(out, n, dir, name);
}

static int file_size(const char *path, uint64_t *bytes) {
  struct stat st;
  if (stat(path, &st) != 0) return -1;
  *bytes = (uint64_t)st.st_size;
  return 0;
}

/* The size and CRC32C of a whole file. */
static dlrec_status file_crc(const char *path, uint64_t *bytes, uint32_t *crc) {
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

static dlrec_status write_manifest(const char *dir, const manifest *m) {
  const dlrec_train_progress *p = &m->p;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "format", "dlrec-checkpoint");
  cJSON_AddNumberToObject(j, "version", DLREC_CHECKPOINT_VERSION);
  cJSON_AddNumberToObject(j, "step", (double)p->step);
  cJSON_AddNumberToObject(j, "samples", (double)p->samples);
  cJSON *pos = cJSON_AddObjectToObject(j, "position");
  cJSON_AddNumberToObject(pos, "epoch", (double)p->position.epoch);
  cJSON_AddNumberToObject(pos, "row", (double)p->position.row);
  /* The fingerprint is a full 64-bit value: JSON numbers are doubles, so it
   * is stored as a hex string. */
  char hex[32];
  snprintf(hex, sizeof hex, "%016" PRIx64, p->position.fingerprint);
  cJSON_AddStringToObject(pos, "fingerprint", hex);
  if (p->follow_file[0]) cJSON_AddStringToObject(pos, "follow_file", p->follow_file);
  if (!isnan(p->valid_auc)) cJSON_AddNumberToObject(j, "valid_auc", p->valid_auc);
  /* cJSON prints a double with enough digits to read back the same bits. */
  cJSON *loss = cJSON_AddObjectToObject(j, "loss");
  cJSON_AddNumberToObject(loss, "sum", p->loss_sum);
  cJSON_AddNumberToObject(loss, "rows", (double)p->loss_rows);
  if (p->loss_scale > 0 || p->skipped_steps) {
    cJSON *ls = cJSON_AddObjectToObject(j, "loss_scale");
    cJSON_AddNumberToObject(ls, "scale", p->loss_scale);
    cJSON_AddNumberToObject(ls, "good_steps", p->loss_scale_good_steps);
    cJSON_AddNumberToObject(ls, "skipped_steps", (double)p->skipped_steps);
  }
  /* The validation state, so that a resumed run's early stopping, plateau
   * and best selection continue exactly; NaN ("none yet") is left out, and
   * so is the whole state before the first validation (a reader then starts
   * from dlrec_valid_state_init, whatever a caller left in it). */
  const dlrec_valid_state *v = &p->valid;
  if (v->validations) {
    cJSON *vj = cJSON_AddObjectToObject(j, "valid");
    cJSON_AddNumberToObject(vj, "validations", (double)v->validations);
    if (!isnan(v->best)) cJSON_AddNumberToObject(vj, "best", v->best);
    cJSON_AddNumberToObject(vj, "best_step", (double)v->best_step);
    if (!isnan(v->stop_best)) cJSON_AddNumberToObject(vj, "stop_best", v->stop_best);
    cJSON_AddNumberToObject(vj, "stop_bad", v->stop_bad);
    if (!isnan(v->plateau_best)) cJSON_AddNumberToObject(vj, "plateau_best", v->plateau_best);
    cJSON_AddNumberToObject(vj, "plateau_bad", v->plateau_bad);
    cJSON_AddNumberToObject(vj, "plateau_cooldown", v->plateau_cooldown);
    cJSON_AddNumberToObject(vj, "plateau_scale", v->plateau_scale);
  }
  cJSON *model = cJSON_AddObjectToObject(j, "model");
  cJSON_AddStringToObject(model, "type", m->type);
  cJSON *tensors = cJSON_AddArrayToObject(model, "tensors");
  for (uint32_t i = 0; i < m->n_tensors; i++) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "name", m->tensors[i].name);
    cJSON *shape = cJSON_AddArrayToObject(t, "shape");
    for (uint32_t d = 0; d < m->tensors[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber(m->tensors[i].shape[d]));
    cJSON_AddItemToArray(tensors, t);
  }
  if (m->has[F_JOURNAL]) {
    cJSON *jo = cJSON_AddObjectToObject(j, "journal");
    cJSON_AddNumberToObject(jo, "base_step", (double)m->journal_base);
    cJSON_AddNumberToObject(jo, "rows", (double)m->journal_rows);
  }
  cJSON *fl = cJSON_AddObjectToObject(j, "files");
  for (int i = 0; i < N_FILES; i++) {
    if (!m->has[i]) continue;
    cJSON *f = cJSON_AddObjectToObject(fl, FILE_NAMES[i]);
    cJSON_AddNumberToObject(f, "bytes", (double)m->bytes[i]);
    snprintf(hex, sizeof hex, "%08" PRIx32, m->crc[i]);
    cJSON_AddStringToObject(f, "crc32c", hex);
  }
  /* Sealed: the CRC32C of its own bytes covers every field (see json.h). */
  char path[4096];
  dlrec_status s = join(path, sizeof path, dir, "manifest.json");
  if (s == DLREC_OK) s = dlrec_json_write_sealed(path, j, "checksum");
  cJSON_Delete(j);
  return s;
}

/* Records file i of the checkpoint in tmp: its size and CRC32C (computed by
 * reading it back unless the writer reported it). */
static dlrec_status note_file(manifest *m, const char *tmp, int i, const uint32_t *crc) {
  char path[4096];
  TRY(join(path, sizeof path, tmp, FILE_NAMES[i]));
  m->has[i] = 1;
  if (!crc) return file_crc(path, &m->bytes[i], &m->crc[i]);
  m->crc[i] = *crc;
  if (file_size(path, &m->bytes[i]) != 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  return DLREC_OK;
}

/* Checkpoint names sort by step: ckpt-%012llu. */
static int ckpt_step(const char *name, uint64_t *step) {
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

static dlrec_status read_pointer(const char *run_dir, const char *name, char *probe, size_t probe_size,
                                 uint64_t *step);

/* Removes all but the newest `keep` checkpoints (by step), and never the one
 * RUN/best names. */
static void prune(const char *run_dir, uint32_t keep) {
  char probe[4096];
  uint64_t best = 0;
  int has_best = read_pointer(run_dir, "best", probe, sizeof probe, &best) == DLREC_OK;
  DIR *d = opendir(run_dir);
  if (!d) return;
  uint64_t steps[4096];
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 4096)
    if (ckpt_step(e->d_name, &steps[n])) n++;
  closedir(d);
  qsort(steps, n, sizeof *steps, cmp_u64);
  for (size_t i = 0; i + keep < n; i++) {
    char path[4096];
    if (has_best && steps[i] == best) continue;
    if (snprintf(path, sizeof path, "%s/ckpt-%012" PRIu64, run_dir, steps[i]) >= (int)sizeof path) continue;
    if (dlrec_remove_tree(path) != DLREC_OK) DLREC_WARN("could not remove old checkpoint: %s", dlrec_last_error());
  }
}

/* A journaled checkpoint's table.bin and optim.bin: hard links to the
 * base's (j->base), recorded with the sizes and checksums the base's sealed
 * manifest gives them (that manifest's read checks the sizes). */
static dlrec_status link_base(const dlrec_checkpoint_journal *j, const char *tmp, manifest *man) {
  manifest base;
  TRY(read_manifest(j->base, &base));
  const uint64_t step = base.has[F_JOURNAL] ? base.journal_base : base.p.step;
  if (!base.has[F_OPTIM] || step != j->base_step)
    return dlrec_error(DLREC_ERR_INVALID, "%s: not the base of step %llu any more", j->base,
                       (unsigned long long)j->base_step);
  for (int i = F_TABLE; i <= F_OPTIM; i++) {
    char from[4096], to[4096];
    TRY(join(from, sizeof from, j->base, FILE_NAMES[i]));
    TRY(join(to, sizeof to, tmp, FILE_NAMES[i]));
    if (link(from, to) != 0) return dlrec_error(DLREC_ERR_IO, "cannot link %s to %s: %s", from, to, strerror(errno));
    man->has[i] = 1;
    man->bytes[i] = base.bytes[i];
    man->crc[i] = base.crc[i];
  }
  return DLREC_OK;
}

/* The journal of a journaled checkpoint: journal.bin (the changed rows and
 * their table rows) and journal_optim.bin (their optimizer state, and the
 * dense optimizer's), from the view v. */
static dlrec_status write_journal(const char *tmp, const dlrec_net *m, const dlrec_net_optim *opt,
                                  const dlrec_store_view *v, size_t n_params, uint64_t n_rows, manifest *man) {
  dlrec_store *store = dlrec_net_store(m);
  uint32_t *rows = malloc((n_rows ? n_rows : 1) * sizeof *rows);
  if (!rows) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for a journal of %llu rows", (unsigned long long)n_rows);
  dlrec_store_changes(store, rows);
  char path[4096];
  uint32_t crc = 0;
  tensor_desc a[8];
  int k = journal_table_arrays(m, v->table, v->mapped, rows, n_rows, 0, a);
  dlrec_status s = join(path, sizeof path, tmp, FILE_NAMES[F_JOURNAL]);
  if (s == DLREC_OK) s = tensor_file_write(path, a, k, &crc);
  if (s == DLREC_OK) s = note_file(man, tmp, F_JOURNAL, &crc);
  k = journal_optim_arrays(opt, v, n_params, dlrec_store_changes_space(store), rows, n_rows, a);
  if (s == DLREC_OK) s = join(path, sizeof path, tmp, FILE_NAMES[F_JOURNAL_OPTIM]);
  if (s == DLREC_OK) s = tensor_file_write(path, a, k, &crc);
  if (s == DLREC_OK) s = note_file(man, tmp, F_JOURNAL_OPTIM, &crc);
  man->journal_rows = n_rows;
  free(rows);
  return s;
}

dlrec_status dlrec_checkpoint_save(const char *run_dir, const dlrec_train_config *cfg, const char *etl_dir,
                                   const dlrec_net *m, const dlrec_net_optim *opt,
                                   const dlrec_train_progress *p, uint32_t keep, dlrec_checkpoint_journal *j) {
  return dlrec_checkpoint_save_rows(run_dir, cfg, etl_dir, m, opt, p, keep, j, NULL);
}

dlrec_status dlrec_checkpoint_save_rows(const char *run_dir, const dlrec_train_config *cfg, const char *etl_dir,
                                        const dlrec_net *m, const dlrec_net_optim *opt, const dlrec_train_progress *p,
                                        uint32_t keep, dlrec_checkpoint_journal *j, const dlrec_row_source *src) {
  char name[64], final_dir[4096], tmp[4096], path[4096], from[4096];
  snprintf(name, sizeof name, "ckpt-%012" PRIu64, p->step);
  TRY(dlrec_mkdirs(run_dir));
  TRY(join(final_dir, sizeof final_dir, run_dir, name));
  if (snprintf(tmp, sizeof tmp, "%s.tmp", final_dir) >= (int)sizeof tmp) return dlrec_error(DLREC_ERR_INVALID, "path too long");
  TRY(dlrec_remove_tree(tmp)); /* a leftover of a crash mid-save */
  TRY(dlrec_mkdirs(tmp));

  manifest man = {.p = *p};
  cJSON *cj = dlrec_train_config_to_json(cfg);
  dlrec_status s = join(path, sizeof path, tmp, "config.json");
  if (s == DLREC_OK) s = dlrec_json_write(path, cj);
  cJSON_Delete(cj);
  if (s == DLREC_OK) s = note_file(&man, tmp, F_CONFIG, NULL);
  char etl_out[4096];
  if (s == DLREC_OK) s = join(etl_out, sizeof etl_out, tmp, "etl");
  if (s == DLREC_OK) s = dlrec_mkdirs(etl_out);
  for (int i = 0; s == DLREC_OK && ETL_FILES[i]; i++) {
    s = join(from, sizeof from, etl_dir, ETL_FILES[i]);
    if (s == DLREC_OK) s = join(path, sizeof path, etl_out, ETL_FILES[i]);
    if (s == DLREC_OK) s = dlrec_copy_file(from, path);
    if (s == DLREC_OK) s = note_file(&man, tmp, i ? F_ETL_VOCAB : F_ETL_JSON, NULL);
  }
  if (s == DLREC_OK) s = dlrec_fsync_dir(etl_out);

  uint32_t crc = 0;
  size_t n_params;
  const float *params = dlrec_net_dense_params_const(m, &n_params);
  snprintf(man.type, sizeof man.type, "%s", dlrec_net_get_config(m)->type);
  man.n_tensors = dlrec_net_n_tensors(m);
  memcpy(man.tensors, dlrec_net_tensors(m), man.n_tensors * sizeof *man.tensors);
  tensor_desc dense[DLREC_NET_MAX_TENSORS];
  int n_dense = dense_arrays(m, (float *)params, dense);
  if (s == DLREC_OK) s = join(path, sizeof path, tmp, "dense.bin");
  if (s == DLREC_OK) s = tensor_file_write(path, dense, n_dense, &crc);
  if (s == DLREC_OK) s = note_file(&man, tmp, F_DENSE, &crc);
  /* Journaled, when the store tracks its changed rows, there is a base,
   * few enough rows changed since, and the base's files can be linked. */
  dlrec_store *store = dlrec_net_store(m);
  const uint64_t n_changed = j && opt && !src ? dlrec_store_changes(store, NULL) : UINT64_MAX;
  int journaled = n_changed != UINT64_MAX && j->max_fraction > 0 && j->base[0] &&
                  (double)n_changed <= j->max_fraction * (double)dlrec_store_changes_space(store);
  /* A link made before a failure is replaced below: tensor_file_write
   * writes a new file, never through the old name's inode. */
  if (s == DLREC_OK && journaled && link_base(j, tmp, &man) != DLREC_OK) {
    DLREC_WARN("checkpoint at step %llu: a full one, not a journal (%s)", (unsigned long long)p->step,
               dlrec_last_error());
    journaled = 0;
    man.has[F_TABLE] = man.has[F_OPTIM] = 0;
  }
  dlrec_store_view view = {0};
  source_stream streams[5];
  int mapped = s == DLREC_OK && !src && (s = map_table(m, opt, &view)) == DLREC_OK;
  if (s == DLREC_OK && journaled) {
    s = write_journal(tmp, m, opt, &view, n_params, n_changed, &man);
    man.journal_base = j->base_step;
  } else if (s == DLREC_OK) {
    tensor_desc table = src ? source_table(m, src, 1, &streams[4]) : table_array(m, &view);
    s = join(path, sizeof path, tmp, "table.bin");
    if (s == DLREC_OK) s = tensor_file_write(path, &table, 1, &crc);
    if (s == DLREC_OK) s = note_file(&man, tmp, F_TABLE, &crc);
  }
  if (opt && !journaled) {
    tensor_desc arrays[8];
    int n = src ? source_optim_arrays(cfg, m, opt, src, n_params, 1, streams, arrays)
                : optim_arrays(opt, &view, n_params, arrays);
    if (s == DLREC_OK) s = join(path, sizeof path, tmp, "optim.bin");
    if (s == DLREC_OK) s = tensor_file_write(path, arrays, n, &crc);
    if (s == DLREC_OK) s = note_file(&man, tmp, F_OPTIM, &crc);
  }
  if (mapped) dlrec_store_unmap(dlrec_net_store(m), &view);
  if (s == DLREC_OK && dlrec_store_get_kind(store) == DLREC_STORE_HASH) {
    tensor_desc arrays[4];
    const int k = hash_arrays(m, arrays);
    s = join(path, sizeof path, tmp, FILE_NAMES[F_HASH]);
    if (s == DLREC_OK) s = tensor_file_write(path, arrays, k, &crc);
    if (s == DLREC_OK) s = note_file(&man, tmp, F_HASH, &crc);
  }
  if (s == DLREC_OK) s = write_manifest(tmp, &man);
  if (s == DLREC_OK) s = dlrec_fsync_dir(tmp);
  /* Saving a step that exists (a resumed run reaching it again) replaces it. */
  if (s == DLREC_OK) s = dlrec_remove_tree(final_dir);
  if (s == DLREC_OK) s = dlrec_rename_durable(tmp, final_dir);
  if (s == DLREC_OK) {
    char latest[128];
    int n = snprintf(latest, sizeof latest, "%s\n", name);
    s = join(path, sizeof path, run_dir, "latest");
    if (s == DLREC_OK) s = dlrec_write_file_atomic(path, latest, (size_t)n);
  }
  if (s != DLREC_OK) {
    dlrec_error_copy e;
    dlrec_error_save(&e);
    dlrec_remove_tree(tmp);
    return dlrec_error_restore(&e);
  }
  /* The new checkpoint holds the base's files from now on (linked, or
   * written: then a new base, relative to which nothing changed yet). */
  if (j && opt) {
    snprintf(j->base, sizeof j->base, "%s", final_dir);
    if (!journaled) {
      j->base_step = p->step;
      dlrec_store_changes_reset(store);
    }
  }
  prune(run_dir, keep ? keep : 1);
  return DLREC_OK;
}

/* Reads the pointer file RUN/name ("latest" or "best"): the name of a
 * checkpoint, whose step goes to *step. probe receives the file's path. */
static dlrec_status read_pointer(const char *run_dir, const char *name, char *probe, size_t probe_size,
                                 uint64_t *step) {
  TRY(join(probe, probe_size, run_dir, name));
  char *text;
  size_t n;
  if (dlrec_read_file(probe, 4096, &text, &n) != DLREC_OK) return dlrec_last_status();
  while (n && (text[n - 1] == '\n' || text[n - 1] == '\r')) text[--n] = '\0';
  dlrec_status s = DLREC_OK;
  if (!ckpt_step(text, step)) s = dlrec_error(DLREC_ERR_CORRUPT, "%s: does not name a checkpoint: '%s'", probe, text);
  free(text);
  return s;
}

static dlrec_status pointed_dir(const char *run_dir, uint64_t step, char *out, size_t out_size) {
  char name[64];
  snprintf(name, sizeof name, "ckpt-%012" PRIu64, step);
  return join(out, out_size, run_dir, name);
}

dlrec_status dlrec_checkpoint_mark_best(const char *run_dir, uint64_t step) {
  char dir[4096], path[4096], text[64];
  struct stat st;
  TRY(pointed_dir(run_dir, step, dir, sizeof dir));
  if (stat(dir, &st) != 0) return dlrec_error(DLREC_ERR_IO, "%s: %s (cannot mark it best)", dir, strerror(errno));
  int n = snprintf(text, sizeof text, "ckpt-%012" PRIu64 "\n", step);
  TRY(join(path, sizeof path, run_dir, "best"));
  return dlrec_write_file_atomic(path, text, (size_t)n);
}

dlrec_status dlrec_checkpoint_resolve(const char *path, char *out, size_t out_size) {
  return dlrec_checkpoint_select(path, NULL, out, out_size);
}

dlrec_status dlrec_checkpoint_select(const char *path, const char *which, char *out, size_t out_size) {
  char probe[4096];
  struct stat st;
  uint64_t step;
  int best = which && !strcmp(which, "best");
  if (which && !best && strcmp(which, "latest"))
    return dlrec_error(DLREC_ERR_INVALID, "checkpoint '%s': expected latest or best", which);
  if (best) {
    if (read_pointer(path, "best", probe, sizeof probe, &step) == DLREC_OK) return pointed_dir(path, step, out, out_size);
    if (dlrec_last_status() == DLREC_ERR_CORRUPT) return dlrec_last_status();
    return dlrec_error(DLREC_ERR_IO,
                       "%s: no best checkpoint (no 'best'): pass a run directory trained with checkpoint.keep_best "
                       "and validation (eval.every_epoch or eval.interval_steps)",
                       path);
  }
  TRY(join(probe, sizeof probe, path, "manifest.json"));
  if (stat(probe, &st) == 0) {
    if (snprintf(out, out_size, "%s", path) >= (int)out_size) return dlrec_error(DLREC_ERR_INVALID, "path too long");
    return DLREC_OK;
  }
  if (read_pointer(path, "latest", probe, sizeof probe, &step) == DLREC_OK) return pointed_dir(path, step, out, out_size);
  if (dlrec_last_status() == DLREC_ERR_CORRUPT) return dlrec_last_status();
  return dlrec_error(DLREC_ERR_IO, "%s: neither a checkpoint (no manifest.json) nor a run directory (no 'latest')", path);
}

static dlrec_status parse_hex(const char *text, int digits, const char *what, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 16);
  if (*end || (int)strlen(text) != digits || errno || !strchr("0123456789abcdefABCDEF", text[0]))
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: '%s' is not %d hex digits", what, text, digits);
  *out = v;
  return DLREC_OK;
}

/* Reads the files member: each known file with its size and CRC32C, each
 * present with that size. */
static dlrec_status read_files(const char *dir, const char *path, const cJSON *files, manifest *m) {
  dlrec_status s = DLREC_OK;
  for (const cJSON *f = files->child; f && s == DLREC_OK; f = f->next) {
    int i = 0;
    while (i < N_FILES && (!f->string || strcmp(f->string, FILE_NAMES[i]))) i++;
    if (i == N_FILES) return dlrec_error(DLREC_ERR_CORRUPT, "%s: files: unknown file '%s'", path, f->string ? f->string : "");
    if (m->has[i]) return dlrec_error(DLREC_ERR_CORRUPT, "%s: files: '%s' given twice", path, f->string);
    m->has[i] = 1;
    char what[4200], fpath[4096];
    const char *hex;
    uint64_t crc = 0, have = 0;
    snprintf(what, sizeof what, "%s: files.%s", path, f->string);
    s = dlrec_json_get_u64(f, "bytes", what, &m->bytes[i]);
    if (s == DLREC_OK) s = dlrec_json_get_string(f, "crc32c", what, &hex);
    if (s == DLREC_OK) s = parse_hex(hex, 8, what, &crc);
    m->crc[i] = (uint32_t)crc;
    if (s == DLREC_OK) s = join(fpath, sizeof fpath, dir, f->string);
    if (s == DLREC_OK && file_size(fpath, &have) != 0)
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: missing (the checkpoint is incomplete)", fpath);
    if (s == DLREC_OK && have != m->bytes[i])
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: %llu bytes, the manifest says %llu (torn or modified checkpoint)", fpath,
                      (unsigned long long)have, (unsigned long long)m->bytes[i]);
  }
  for (int i = 0; s == DLREC_OK && i < N_FILES; i++)
    if (!m->has[i] && i != F_OPTIM && i != F_JOURNAL && i != F_JOURNAL_OPTIM && i != F_HASH) /* optional */
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: files: '%s' is missing", path, FILE_NAMES[i]);
  return s;
}

/* Reads the manifest's model member: the type and each tensor's name and
 * shape (1 or 2 dimensions). */
static dlrec_status read_model_section(const cJSON *j, const char *path, manifest *m) {
  const cJSON *model, *tensors;
  const char *type;
  char what[4200];
  snprintf(what, sizeof what, "%s: model", path);
  dlrec_status s = dlrec_json_get_object(j, "model", path, &model);
  if (s == DLREC_OK) s = dlrec_json_get_string(model, "type", what, &type);
  if (s == DLREC_OK && snprintf(m->type, sizeof m->type, "%s", type) >= (int)sizeof m->type)
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: field 'type': '%s' is too long", what, type);
  if (s == DLREC_OK) s = dlrec_json_get_array(model, "tensors", what, &tensors);
  if (s == DLREC_OK && cJSON_GetArraySize(tensors) > DLREC_NET_MAX_TENSORS)
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: %d tensors, at most %d", what, cJSON_GetArraySize(tensors),
                    DLREC_NET_MAX_TENSORS);
  for (const cJSON *t = s == DLREC_OK ? tensors->child : NULL; t && s == DLREC_OK; t = t->next) {
    dlrec_net_tensor *d = &m->tensors[m->n_tensors];
    char tw[4300];
    snprintf(tw, sizeof tw, "%s.tensors[%u]", what, m->n_tensors);
    const char *name;
    const cJSON *shape;
    s = dlrec_json_get_string(t, "name", tw, &name);
    if (s == DLREC_OK && snprintf(d->name, sizeof d->name, "%s", name) >= (int)sizeof d->name)
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: name '%s' is too long", tw, name);
    if (s == DLREC_OK) s = dlrec_json_get_array(t, "shape", tw, &shape);
    int nd = s == DLREC_OK ? cJSON_GetArraySize(shape) : 0;
    if (s == DLREC_OK && (nd < 1 || nd > 2)) s = dlrec_error(DLREC_ERR_CORRUPT, "%s: shape: %d dimensions, expected 1 or 2", tw, nd);
    d->ndim = (uint32_t)nd;
    for (int k = 0; s == DLREC_OK && k < nd; k++) {
      const cJSON *e = cJSON_GetArrayItem(shape, k);
      if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > 4294967295.0 ||
          e->valuedouble != (double)(uint32_t)e->valuedouble)
        s = dlrec_error(DLREC_ERR_CORRUPT, "%s: shape[%d]: expected a positive integer", tw, k);
      else d->shape[k] = (uint32_t)e->valuedouble;
    }
    m->n_tensors++;
  }
  return s;
}

/* The checkpoint's model must be the one the config plans: the same type and
 * the same tensors, by name and shape, in the same order. */
static dlrec_status same_tensors(const char *dir, const manifest *m, const dlrec_net *n) {
  const char *type = dlrec_net_get_config(n)->type;
  if (strcmp(m->type, type))
    return dlrec_error(DLREC_ERR_INVALID, "%s: a checkpoint of a '%s' model, the config's model.type is '%s'", dir,
                       m->type, type);
  const dlrec_net_tensor *t = dlrec_net_tensors(n);
  uint32_t k = dlrec_net_n_tensors(n);
  if (m->n_tensors != k)
    return dlrec_error(DLREC_ERR_INVALID, "%s: the checkpoint holds %u dense tensors, the model plans %u", dir,
                       m->n_tensors, k);
  for (uint32_t i = 0; i < k; i++) {
    const dlrec_net_tensor *a = &m->tensors[i], *b = &t[i];
    if (strcmp(a->name, b->name) || a->ndim != b->ndim || a->shape[0] != b->shape[0] ||
        (a->ndim == 2 && a->shape[1] != b->shape[1]))
    {
      char sa[48], sb[48];
      return dlrec_error(DLREC_ERR_INVALID, "%s: tensor %u is '%s' of shape %s, the model plans '%s' of shape %s", dir,
                         i, a->name, shape_str(a, sa, sizeof sa), b->name, shape_str(b, sb, sizeof sb));
    }
  }
  return DLREC_OK;
}

/* A model-only load (eval, predict, serve) maps table.bin in place of
 * reading it: after the same checks (the file read through once, from the
 * page cache afterwards), the network's ram table becomes the array inside a
 * private mapping of the file, whose pages are read on first touch. A table
 * larger than memory is then scored from the page cache, and a server's RSS
 * holds the rows it looks up, not the table. */
static dlrec_status map_table_file(const char *dir, const manifest *m, dlrec_net *n) {
  char path[4096];
  uint32_t crc = 0;
  void *map = NULL, *data = NULL;
  size_t bytes = 0;
  dlrec_store_view none = {0};
  tensor_desc want = table_array(n, &none);
  TRY(join(path, sizeof path, dir, FILE_NAMES[F_TABLE]));
  TRY(tensor_file_map(path, &want, &map, &bytes, &data, &crc));
  if (crc != m->crc[F_TABLE]) {
    munmap(map, bytes);
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: checksum mismatch (CRC32C %08x, the manifest says %08x): modified or damaged",
                       path, crc, m->crc[F_TABLE]);
  }
  table_adopt(dlrec_net_table(n), map, bytes, data);
  return DLREC_OK;
}

/* Applies a journaled checkpoint's journal over the base's arrays in v
 * (the table; with opt, the optimizer state too): first a pass that checks
 * journal.bin whole and reads its rows (ascending, inside the table), then
 * the rows copied to their places. *rows_out receives the rows (the caller
 * frees them). */
static dlrec_status apply_journal(const char *dir, const manifest *man, const dlrec_net *n, const dlrec_net_optim *opt,
                                  const dlrec_store_view *v, size_t n_params, uint32_t **rows_out) {
  const uint64_t table_rows = dlrec_store_changes_space(dlrec_net_store(n)), k = man->journal_rows;
  char path[4096];
  TRY(join(path, sizeof path, dir, FILE_NAMES[F_JOURNAL]));
  if (k > table_rows)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: %llu rows, the table has %llu", path, (unsigned long long)k,
                       (unsigned long long)table_rows);
  uint32_t *rows = malloc((k ? k : 1) * sizeof *rows);
  if (!rows) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for a journal of %llu rows", (unsigned long long)k);
  tensor_desc a[8];
  int na = journal_table_arrays(n, NULL, 0, rows, k, 1, a);
  dlrec_status s = read_tensors(dir, man, F_JOURNAL, a, na);
  for (uint64_t i = 0; s == DLREC_OK && i < k; i++)
    if (rows[i] >= table_rows || (i && rows[i] <= rows[i - 1]))
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: array 'rows': row %u at %llu is outside the table of %llu rows or "
                      "out of order", path, rows[i], (unsigned long long)i, (unsigned long long)table_rows);
  if (s == DLREC_OK) {
    na = journal_table_arrays(n, v->table, v->mapped, rows, k, 0, a);
    a[0].data = NULL; /* read above */
    s = read_tensors(dir, man, F_JOURNAL, a, na);
  }
  if (s == DLREC_OK && opt) {
    na = journal_optim_arrays(opt, v, n_params, table_rows, rows, k, a);
    s = read_tensors(dir, man, F_JOURNAL_OPTIM, a, na);
  }
  if (s == DLREC_OK && rows_out) *rows_out = rows;
  else free(rows);
  return s;
}

/* Reads the dense tensors and the table of the checkpoint into n, and with
 * opt the optimizer state, after checking that they are the ones n plans.
 * Without opt (a model-only load) the table is mapped (map_table_file). A
 * journaled checkpoint's journal is applied over them; its rows go to
 * *journal_rows when that is not NULL (NULL for a full checkpoint). */
static dlrec_status read_params(const char *dir, const manifest *man, dlrec_net *n, dlrec_net_optim *opt,
                                uint32_t **journal_rows, const dlrec_train_config *cfg, const dlrec_row_source *src) {
  TRY(same_tensors(dir, man, n));
  size_t n_params = 0;
  tensor_desc dense[DLREC_NET_MAX_TENSORS];
  int k = dense_arrays(n, dlrec_net_dense_params(n, &n_params), dense);
  TRY(read_tensors(dir, man, F_DENSE, dense, k));
  if (journal_rows) *journal_rows = NULL;
  if (src) {
    /* The rows go to src (a training resume: opt is there). */
    if (man->has[F_JOURNAL] || man->has[F_HASH])
      return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: a checkpoint of a tiered or hash table cannot be resumed across "
                         "ranks", dir);
    source_stream streams[5];
    tensor_desc table = source_table(n, src, 0, &streams[4]), arrays[8];
    TRY(read_tensors(dir, man, F_TABLE, &table, 1));
    const int na = source_optim_arrays(cfg, n, opt, src, n_params, 0, streams, arrays);
    return read_tensors(dir, man, F_OPTIM, arrays, na);
  }
  dlrec_store *store = dlrec_net_store(n);
  const int hash = dlrec_store_get_kind(store) == DLREC_STORE_HASH;
  if (hash != man->has[F_HASH])
    return dlrec_error(DLREC_ERR_INVALID, "%s: %s", dir,
                       hash ? "not a checkpoint of a hash table (no hash.bin), but the model's table is one"
                            : "a checkpoint of a hash table (hash.bin): its model needs storage.kind \"hash\"");
  if (hash) {
    /* The bookkeeping first: the rows of table.bin are the keys' it names. */
    tensor_desc arrays[4];
    const int k = hash_arrays(n, arrays);
    TRY(read_tensors(dir, man, F_HASH, arrays, k));
    TRY(dlrec_store_hash_rebuild(store));
  }
  if (!opt && dlrec_store_get_kind(dlrec_net_store(n)) == DLREC_STORE_RAM) {
    TRY(map_table_file(dir, man, n));
    const dlrec_store_view mapped = {.table = dlrec_table_raw(dlrec_net_table(n))};
    return man->has[F_JOURNAL] ? apply_journal(dir, man, n, NULL, &mapped, n_params, journal_rows) : DLREC_OK;
  }
  dlrec_store_view view;
  TRY(map_table(n, opt, &view));
  tensor_desc table = table_array(n, &view);
  dlrec_status s = read_tensors(dir, man, F_TABLE, &table, 1);
  if (s == DLREC_OK && opt) {
    tensor_desc arrays[8];
    int na = optim_arrays(opt, &view, n_params, arrays);
    s = read_tensors(dir, man, F_OPTIM, arrays, na);
  }
  if (s == DLREC_OK && man->has[F_JOURNAL]) s = apply_journal(dir, man, n, opt, &view, n_params, journal_rows);
  dlrec_store_unmap(dlrec_net_store(n), &view);
  return s;
}

/* Reads the manifest's optional valid member (absent: no validation yet, as
 * in checkpoints written before it existed). */
/* The loss scaling's state, where the run had one (else none). */
static dlrec_status read_loss_scale(const cJSON *j, const char *path, dlrec_train_progress *p) {
  p->loss_scale = 0;
  p->loss_scale_good_steps = 0;
  p->skipped_steps = 0;
  if (!cJSON_GetObjectItemCaseSensitive(j, "loss_scale")) return DLREC_OK;
  const cJSON *ls;
  double scale;
  uint64_t good;
  dlrec_status s = dlrec_json_get_object(j, "loss_scale", path, &ls);
  if (s == DLREC_OK) s = dlrec_json_get_double(ls, "scale", path, &scale);
  if (s == DLREC_OK) s = dlrec_json_get_u64(ls, "good_steps", path, &good);
  if (s == DLREC_OK) s = dlrec_json_get_u64(ls, "skipped_steps", path, &p->skipped_steps);
  if (s == DLREC_OK && (!(scale >= 0 && scale <= DLREC_LOSS_SCALE_MAX) || good > UINT32_MAX))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: loss_scale: scale %g or good_steps %llu out of range", path, scale,
                    (unsigned long long)good);
  if (s != DLREC_OK) return s;
  p->loss_scale = (float)scale;
  p->loss_scale_good_steps = (uint32_t)good;
  return DLREC_OK;
}

static dlrec_status read_valid(const cJSON *j, const char *path, dlrec_valid_state *v) {
  dlrec_valid_state_init(v);
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "valid");
  if (!o) return DLREC_OK;
  char what[4200];
  snprintf(what, sizeof what, "%s: valid", path);
  if (!cJSON_IsObject(o)) return dlrec_error(DLREC_ERR_CORRUPT, "%s: expected an object", what);
  uint64_t stop_bad = 0, plateau_bad = 0, cooldown = 0;
  dlrec_status s = dlrec_json_get_u64(o, "validations", what, &v->validations);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(o, "best", what, NAN, &v->best);
  if (s == DLREC_OK) s = dlrec_json_get_u64(o, "best_step", what, &v->best_step);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(o, "stop_best", what, NAN, &v->stop_best);
  if (s == DLREC_OK) s = dlrec_json_get_u64(o, "stop_bad", what, &stop_bad);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(o, "plateau_best", what, NAN, &v->plateau_best);
  if (s == DLREC_OK) s = dlrec_json_get_u64(o, "plateau_bad", what, &plateau_bad);
  if (s == DLREC_OK) s = dlrec_json_get_u64(o, "plateau_cooldown", what, &cooldown);
  if (s == DLREC_OK) s = dlrec_json_get_double(o, "plateau_scale", what, &v->plateau_scale);
  if (s == DLREC_OK && (stop_bad > UINT32_MAX || plateau_bad > UINT32_MAX || cooldown > UINT32_MAX))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: a counter beyond 2^32 - 1", what);
  if (s == DLREC_OK && !(v->plateau_scale > 0 && v->plateau_scale <= 1))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: field 'plateau_scale': %g is not in (0, 1]", what, v->plateau_scale);
  v->stop_bad = (uint32_t)stop_bad;
  v->plateau_bad = (uint32_t)plateau_bad;
  v->plateau_cooldown = (uint32_t)cooldown;
  return s;
}

/* Reads manifest.json: format, version, its own checksum, progress, and
 * every listed file's size and CRC32C (the sizes are checked here). */
static dlrec_status read_manifest(const char *dir, manifest *m) {
  memset(m, 0, sizeof *m);
  dlrec_train_progress *p = &m->p;
  char path[4096];
  TRY(join(path, sizeof path, dir, "manifest.json"));
  /* The text is kept for the checksum of its own bytes. A manifest lists
   * a few files and tensors: a few KiB. */
  char *text;
  size_t n;
  TRY(dlrec_read_file(path, 16u << 20, &text, &n));
  cJSON *j;
  dlrec_status s = dlrec_json_parse(text, n, path, &j);
  if (s != DLREC_OK) {
    free(text);
    return s;
  }
  const char *format, *fp;
  uint64_t version, fingerprint = 0;
  const cJSON *pos, *files, *loss;
  s = dlrec_json_get_string(j, "format", path, &format);
  if (s == DLREC_OK && strcmp(format, "dlrec-checkpoint"))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: not a dlrec checkpoint manifest", path);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "version", path, &version);
  if (s == DLREC_OK && version == 1)
    s = dlrec_error(DLREC_ERR_VERSION,
                    "%s: checkpoint version 1, written by an older dlrec without checksums on the manifest and "
                    "config; this build reads version %d: load it with the dlrec that wrote it, or train again",
                    path, DLREC_CHECKPOINT_VERSION);
  else if (s == DLREC_OK && version == 2)
    s = dlrec_error(DLREC_ERR_VERSION,
                    "%s: checkpoint version 2, written by an older dlrec that stored the dense parameters as one "
                    "unnamed array; this build reads version %d (named tensors): load it with the dlrec that wrote "
                    "it, or train again",
                    path, DLREC_CHECKPOINT_VERSION);
  else if (s == DLREC_OK && version != DLREC_CHECKPOINT_VERSION)
    s = dlrec_error(DLREC_ERR_VERSION, "%s: checkpoint version %llu, this build reads version %d", path,
                    (unsigned long long)version, DLREC_CHECKPOINT_VERSION);
  /* The checksum before any other field, so that an edited manifest is
   * reported as such rather than read. */
  if (s == DLREC_OK) s = dlrec_json_check_sealed(text, n, "checksum", path, "the manifest was edited or damaged");
  free(text);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "step", path, &p->step);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "samples", path, &p->samples);
  if (s == DLREC_OK) s = dlrec_json_get_object(j, "position", path, &pos);
  if (s == DLREC_OK) s = dlrec_json_get_u64(pos, "epoch", path, &p->position.epoch);
  if (s == DLREC_OK) s = dlrec_json_get_u64(pos, "row", path, &p->position.row);
  if (s == DLREC_OK) s = dlrec_json_get_string(pos, "fingerprint", path, &fp);
  if (s == DLREC_OK) s = parse_hex(fp, 16, path, &fingerprint);
  p->position.fingerprint = fingerprint;
  const char *follow = "";
  if (s == DLREC_OK) s = dlrec_json_get_string_or(pos, "follow_file", path, "", &follow);
  if (s == DLREC_OK && (strlen(follow) >= sizeof p->follow_file || strchr(follow, '/')))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: position: 'follow_file' is not a file name: '%s'", path, follow);
  if (s == DLREC_OK) snprintf(p->follow_file, sizeof p->follow_file, "%s", follow);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(j, "valid_auc", path, NAN, &p->valid_auc);
  if (s == DLREC_OK) s = dlrec_json_get_object(j, "loss", path, &loss);
  if (s == DLREC_OK) s = dlrec_json_get_double(loss, "sum", path, &p->loss_sum);
  if (s == DLREC_OK) s = dlrec_json_get_u64(loss, "rows", path, &p->loss_rows);
  if (s == DLREC_OK) s = read_loss_scale(j, path, p);
  if (s == DLREC_OK) s = read_valid(j, path, &p->valid);
  if (s == DLREC_OK) s = read_model_section(j, path, m);
  if (s == DLREC_OK) s = dlrec_json_get_object(j, "files", path, &files);
  if (s == DLREC_OK) s = read_files(dir, path, files, m);
  if (s == DLREC_OK && (m->has[F_JOURNAL] || m->has[F_JOURNAL_OPTIM]) &&
      !(m->has[F_JOURNAL] && m->has[F_JOURNAL_OPTIM] && m->has[F_OPTIM]))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: files: a journal needs journal.bin, journal_optim.bin and optim.bin", path);
  const cJSON *jo;
  if (s == DLREC_OK && m->has[F_JOURNAL] && (s = dlrec_json_get_object(j, "journal", path, &jo)) == DLREC_OK) {
    s = dlrec_json_get_u64(jo, "base_step", path, &m->journal_base);
    if (s == DLREC_OK) s = dlrec_json_get_u64(jo, "rows", path, &m->journal_rows);
  }
  cJSON_Delete(j);
  return s;
}

/* Checks the CRC32C of file i (read whole here: the small files). */
static dlrec_status check_file(const char *dir, const manifest *m, int i) {
  char path[4096];
  uint64_t bytes;
  uint32_t crc;
  TRY(join(path, sizeof path, dir, FILE_NAMES[i]));
  TRY(file_crc(path, &bytes, &crc));
  if (bytes != m->bytes[i] || crc != m->crc[i])
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: checksum mismatch (CRC32C %08x, the manifest says %08x): modified or damaged",
                       path, crc, m->crc[i]);
  return DLREC_OK;
}

/* Reads tensor file i into its arrays and checks its whole-file CRC32C,
 * which covers the padding the arrays' own checksums do not. */
static dlrec_status read_tensors(const char *dir, const manifest *m, int i, const tensor_desc *arrays, int n) {
  char path[4096];
  uint32_t crc = 0;
  TRY(join(path, sizeof path, dir, FILE_NAMES[i]));
  TRY(tensor_file_read(path, arrays, n, &crc));
  if (crc != m->crc[i])
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: checksum mismatch (CRC32C %08x, the manifest says %08x): modified or damaged",
                       path, crc, m->crc[i]);
  return DLREC_OK;
}

/* Reads the checkpoint's config.json after checking its checksum. */
static dlrec_status read_config(const char *dir, const manifest *m, dlrec_train_config *c) {
  char path[4096];
  TRY(check_file(dir, m, F_CONFIG));
  TRY(join(path, sizeof path, dir, FILE_NAMES[F_CONFIG]));
  return dlrec_train_config_read(path, c);
}

/* Loads the checkpoint's etl/ after checking both files' checksums. */
static dlrec_status load_etl(const char *dir, const manifest *m, dlrec_etl **etl) {
  char path[4096];
  TRY(check_file(dir, m, F_ETL_JSON));
  TRY(check_file(dir, m, F_ETL_VOCAB));
  TRY(join(path, sizeof path, dir, "etl"));
  return dlrec_etl_load(etl, path);
}

void dlrec_model_free(dlrec_model *m) {
  if (!m) return;
  dlrec_net_free(m->net);
  dlrec_etl_free(m->etl);
  free(m);
}

dlrec_status dlrec_model_load(const char *path, dlrec_model **out) {
  *out = NULL;
  dlrec_model *m = calloc(1, sizeof *m);
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  manifest man;
  memset(&man, 0, sizeof man);
  dlrec_status s = dlrec_checkpoint_resolve(path, m->dir, sizeof m->dir);
  if (s == DLREC_OK) s = read_manifest(m->dir, &man);
  m->progress = man.p;
  if (s == DLREC_OK) s = read_config(m->dir, &man, &m->config);
  if (s == DLREC_OK) s = load_etl(m->dir, &man, &m->etl);
  /* A hash table's model scores through its table (its keys name its
   * rows); the others load their table into RAM (a mapping of table.bin). */
  const dlrec_store_config sc = dlrec_train_config_store(&m->config, m->etl ? dlrec_etl_schema(m->etl)->n_sparse : 0,
                                                         NULL);
  if (s == DLREC_OK)
    s = dlrec_net_create_stored(&m->net, &m->config.model, dlrec_etl_schema(m->etl),
                                m->config.storage == DLREC_STORE_HASH ? &sc : NULL);
  uint32_t *rows = NULL;
  if (s == DLREC_OK) s = read_params(m->dir, &man, m->net, NULL, &rows, NULL, NULL);
  free(rows);
  if (s != DLREC_OK) {
    dlrec_error_context("loading checkpoint %s: ", path);
    dlrec_model_free(m);
    return dlrec_last_status();
  }
  *out = m;
  return DLREC_OK;
}

dlrec_status dlrec_model_set_backend(dlrec_model *m, dlrec_backend *be) {
  const dlrec_table_placement place = m->config.table_placement;
  int host = 0;
  float hot = 0.0f;
  if (be && !dlrec_backend_host_memory(be) && dlrec_net_schema(m->net)->n_sparse) {
    /* Scoring needs the table and the dense parameters there: its
     * workspaces are small beside a table too big for the device. */
    const dlrec_store_kind kind = dlrec_store_get_kind(dlrec_net_store(m->net));
    const dlrec_table *t = dlrec_net_table_const(m->net);
    size_t n_params;
    dlrec_net_dense_params_const(m->net, &n_params);
    const uint64_t row_bytes = dlrec_table_stride(t) * (uint64_t)dlrec_table_dtype_bytes(dlrec_table_get_dtype(t));
    const uint64_t params = (uint64_t)n_params * sizeof(float);
    char device[64];
    const char *name = dlrec_backend_name(be);
    if (strcmp(name, "cuda")) snprintf(device, sizeof device, "%s", name);
    else snprintf(device, sizeof device, "cuda:%u", dlrec_backend_device_index(be));
    host = dlrec_table_on_host(device, place, kind, m->config.hot_fraction, dlrec_table_rows(t) * row_bytes + params,
                               params, 0, dlrec_table_rows(t), row_bytes, &hot);
    if (host && kind != DLREC_STORE_RAM)
      DLREC_INFO("the table stays in host memory (storage.kind \"%s\"); its bag ops run on the CPU",
                 dlrec_store_kind_name(kind));
    else if (host)
      DLREC_INFO("the table stays in host memory (training.table_placement %s); its bag ops run on the CPU",
                 place == DLREC_TABLE_PLACEMENT_HOST ? "host" : "auto: the device cannot hold it");
  }
  dlrec_status s = dlrec_net_set_host_table(m->net, host);
  if (s == DLREC_OK && host && dlrec_store_get_kind(dlrec_net_store(m->net)) == DLREC_STORE_RAM)
    s = dlrec_net_set_hot_fraction(m->net, hot);
  if (s == DLREC_OK && dlrec_net_hot_rows(m->net))
    DLREC_INFO("%llu hot rows (training.hot_fraction %s%.3g of each column's, its most frequent values) on the "
               "device too; their lookups run there", (unsigned long long)dlrec_net_hot_rows(m->net),
               m->config.hot_fraction < 0 ? "auto: " : "", (double)hot);
  return s == DLREC_OK ? dlrec_net_set_backend(m->net, be) : s;
}

/* The settings that shape the parameters or the data order must match on
 * resume; epochs, intervals, threads and the like may change. */
static dlrec_status same_training(const dlrec_train_config *a, const dlrec_train_config *b, const char *dir) {
  const char *field = NULL;
  if (a->model.table_dtype != b->model.table_dtype)
    return dlrec_error(DLREC_ERR_INVALID,
                       "cannot resume from %s: its embedding table is %s, the config's 'training.table_dtype' is %s",
                       dir, dlrec_table_dtype_name((dlrec_table_dtype)b->model.table_dtype),
                       dlrec_table_dtype_name((dlrec_table_dtype)a->model.table_dtype));
  if (strcmp(a->model.type, b->model.type)) field = "model.type";
  else if (memcmp(&a->model, &b->model, sizeof a->model)) field = "model";
  else if (memcmp(&a->dense, &b->dense, sizeof a->dense)) field = "optimizer.dense";
  else if (memcmp(&a->sparse, &b->sparse, sizeof a->sparse)) field = "optimizer.sparse";
  else if (a->clip_grad_norm != b->clip_grad_norm) field = "optimizer.clip_grad_norm";
  else if (a->batch_size != b->batch_size) field = "training.batch_size";
  else if (a->seed != b->seed) field = "training.seed";
  else if (a->shuffle != b->shuffle || a->window_groups != b->window_groups || a->slice_rows != b->slice_rows)
    field = "loader";
  if (field)
    return dlrec_error(DLREC_ERR_INVALID,
                       "cannot resume from %s: the config's '%s' differs from the one the checkpoint was written with",
                       dir, field);
  return DLREC_OK;
}

/* The --etl state must encode rows as the checkpoint's own does: the table
 * was trained on that encoding, and later checkpoints copy --etl's files. */
static dlrec_status same_etl(const char *dir, const manifest *m, const char *etl_dir) {
  dlrec_etl *mine = NULL, *given = NULL;
  dlrec_status s = load_etl(dir, m, &mine);
  if (s == DLREC_OK) s = dlrec_etl_load(&given, etl_dir);
  if (s == DLREC_OK && etl_same_encoding(mine, given) != DLREC_OK)
    s = dlrec_error_context("cannot resume from %s: --etl %s encodes rows differently from the ETL state the "
                            "checkpoint was trained with (%s/etl): ", dir, etl_dir, dir);
  dlrec_etl_free(mine);
  dlrec_etl_free(given);
  return s;
}

dlrec_status dlrec_checkpoint_load_training(const char *path, const dlrec_train_config *cfg, const char *etl_dir,
                                            dlrec_net *m, dlrec_net_optim *opt, dlrec_train_progress *prog,
                                            dlrec_checkpoint_journal *j) {
  return dlrec_checkpoint_load_training_rows(path, cfg, etl_dir, m, opt, prog, j, NULL);
}

dlrec_status dlrec_checkpoint_load_training_rows(const char *path, const dlrec_train_config *cfg, const char *etl_dir,
                                                 dlrec_net *m, dlrec_net_optim *opt, dlrec_train_progress *prog,
                                                 dlrec_checkpoint_journal *j, const dlrec_row_source *src) {
  char dir[1024];
  manifest man;
  dlrec_train_config saved;
  TRY(dlrec_checkpoint_resolve(path, dir, sizeof dir));
  dlrec_status s = read_manifest(dir, &man);
  if (s == DLREC_OK && !man.has[F_OPTIM])
    s = dlrec_error(DLREC_ERR_INVALID, "%s: a model-only checkpoint (no optimizer state) cannot be resumed", dir);
  if (s == DLREC_OK) s = read_config(dir, &man, &saved);
  if (s == DLREC_OK) s = same_training(cfg, &saved, dir);
  if (s == DLREC_OK) s = same_etl(dir, &man, etl_dir);
  uint32_t *rows = NULL;
  if (s == DLREC_OK) s = read_params(dir, &man, m, opt, &rows, cfg, src);
  /* The store now holds the base plus the journal: its changes are the
   * journal's rows, relative to the loaded checkpoint's base files. */
  dlrec_store *store = dlrec_net_store(m);
  if (s == DLREC_OK && j) {
    snprintf(j->base, sizeof j->base, "%s", dir);
    j->base_step = man.has[F_JOURNAL] ? man.journal_base : man.p.step;
    if (dlrec_store_changes(store, NULL) != UINT64_MAX) {
      dlrec_store_changes_reset(store);
      if (rows) s = dlrec_store_changes_mark(store, rows, man.journal_rows);
    }
  }
  free(rows);
  if (s != DLREC_OK) return dlrec_error_context("resuming from %s: ", dir);
  *prog = man.p;
  return DLREC_OK;
}
