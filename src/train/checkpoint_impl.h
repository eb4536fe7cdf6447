/* A checkpoint's format, private to src/train/'s checkpoint files: the files
 * it may hold, its manifest, and the arrays each tensor file holds
 *   checkpoint_format.c  the arrays of dense.bin, table.bin, optim.bin,
 *                        hash.bin and the journals; rows from a row source
 *   checkpoint_save.c    saving (the manifest, journals, pruning, pointers)
 *   checkpoint_load.c    loading (the manifest read and checked, a resume)
 *   loaded_model.c       a checkpoint loaded for scoring (train/loaded_model.h)
 * (docs/formats.md). */
#ifndef DLREC_TRAIN_CHECKPOINT_IMPL_H
#define DLREC_TRAIN_CHECKPOINT_IMPL_H

#include "train/checkpoint.h"
#include "train/tensor_file.h"

#define TRY(expr)                    \
  do {                               \
    dlrec_status st_ = (expr);       \
    if (st_ != DLREC_OK) return st_; \
  } while (0)

/* The ETL state's files (etl/), NULL-terminated. */
extern const char *const ckpt_etl_files[];

/* The files a checkpoint may hold, as the manifest names them. Each is
 * listed with its size and the CRC32C of all its bytes, and the manifest
 * carries a CRC32C of itself, so that every byte of a checkpoint is covered. */
enum { F_CONFIG, F_ETL_JSON, F_ETL_VOCAB, F_DENSE, F_TABLE, F_OPTIM, F_JOURNAL, F_JOURNAL_OPTIM, F_HASH, N_FILES };
extern const char *const ckpt_file_names[N_FILES];

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

/* One array of table.bin or optim.bin streamed through a row source: byte
 * chunks become whole rows (the chunks are multiples of a row's bytes). */
typedef struct source_stream {
  const dlrec_row_source *src;
  dlrec_row_array array;
  uint64_t row_bytes;
  int write;
} source_stream;

/* checkpoint_format.c: each file's arrays. */
int ckpt_dense_arrays(const dlrec_net *n, float *params, tensor_desc *out);
dlrec_status ckpt_map_table(const dlrec_net *n, const dlrec_net_optim *opt, dlrec_store_view *v);
int ckpt_optim_arrays(const dlrec_net_optim *opt, const dlrec_store_view *v, size_t n_params, tensor_desc *out);
tensor_dtype ckpt_table_tensor_dtype(const dlrec_table *t);
tensor_desc ckpt_table_array(const dlrec_net *n, const dlrec_store_view *v);
tensor_desc ckpt_source_table(const dlrec_net *n, const dlrec_row_source *src, int write, source_stream *x);
int ckpt_source_optim_arrays(const dlrec_train_config *cfg, const dlrec_net *n, const dlrec_net_optim *opt,
                             const dlrec_row_source *src, size_t n_params, int write, source_stream *x,
                             tensor_desc *out);
int ckpt_hash_arrays(const dlrec_net *n, tensor_desc *out);
int ckpt_journal_table_arrays(const dlrec_net *n, void *table, int mapped, uint32_t *rows, uint64_t n_rows,
                              int check_only, tensor_desc *out);
int ckpt_journal_optim_arrays(const dlrec_net_optim *opt, const dlrec_store_view *v, size_t n_params,
                              uint64_t table_rows, const uint32_t *rows, uint64_t n_rows, tensor_desc *out);

/* checkpoint_format.c: paths and whole files. */
dlrec_status ckpt_join(char *out, size_t n, const char *dir, const char *name);
int ckpt_file_size(const char *path, uint64_t *bytes);
dlrec_status ckpt_file_crc(const char *path, uint64_t *bytes, uint32_t *crc);

/* checkpoint_format.c: a run directory's checkpoints. ckpt_step: 1 when
 * name is a checkpoint's (ckpt-STEP), its step to *step. ckpt_list_steps:
 * the steps of RUN's checkpoints, ascending, at most max; their count.
 * ckpt_step_dir: RUN/ckpt-STEP. ckpt_table_id: the device and inode of
 * DIR/table.bin (a journaled checkpoint's is its base's: a hard link), 0 when
 * it cannot be stat'd. */
int ckpt_step(const char *name, uint64_t *step);
size_t ckpt_list_steps(const char *run_dir, uint64_t *steps, size_t max);
dlrec_status ckpt_step_dir(const char *run_dir, uint64_t step, char *out, size_t out_size);
int ckpt_table_id(const char *dir, uint64_t id[2]);

/* checkpoint_load.c */
dlrec_status ckpt_read_params(const char *dir, const manifest *man, dlrec_net *n, dlrec_net_optim *opt,
                              uint32_t **journal_rows, const dlrec_train_config *cfg, const dlrec_row_source *src);
dlrec_status ckpt_read_manifest(const char *dir, manifest *m);
dlrec_status ckpt_check_file(const char *dir, const manifest *m, int i);
dlrec_status ckpt_read_tensors(const char *dir, const manifest *m, int i, const tensor_desc *arrays, int n);
dlrec_status ckpt_read_config(const char *dir, const manifest *m, dlrec_train_config *c);
dlrec_status ckpt_load_etl(const char *dir, const manifest *m, dlrec_etl **etl);

#endif
