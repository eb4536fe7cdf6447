/* Saving a checkpoint: an atomic directory per save (full, or a journal of
 * the rows changed since a full one, with a new full one often enough that
 * the kept checkpoints stand on two), its manifest, pruning, and the
 * `latest` and `best` pointers a run directory keeps. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/json.h"
#include "core/log.h"
#include "train/checkpoint_impl.h"

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
  if (p->run_id) {
    snprintf(hex, sizeof hex, "%016" PRIx64, p->run_id);
    cJSON_AddStringToObject(j, "run_id", hex);
  }
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
    cJSON *f = cJSON_AddObjectToObject(fl, ckpt_file_names[i]);
    cJSON_AddNumberToObject(f, "bytes", (double)m->bytes[i]);
    snprintf(hex, sizeof hex, "%08" PRIx32, m->crc[i]);
    cJSON_AddStringToObject(f, "crc32c", hex);
  }
  /* Sealed: the CRC32C of its own bytes covers every field (see json.h). */
  char path[4096];
  dlrec_status s = ckpt_join(path, sizeof path, dir, "manifest.json");
  if (s == DLREC_OK) s = dlrec_json_write_sealed(path, j, "checksum");
  cJSON_Delete(j);
  return s;
}

/* Records file i of the checkpoint in tmp: its size and CRC32C (computed by
 * reading it back unless the writer reported it). */
static dlrec_status note_file(manifest *m, const char *tmp, int i, const uint32_t *crc) {
  char path[4096];
  TRY(ckpt_join(path, sizeof path, tmp, ckpt_file_names[i]));
  m->has[i] = 1;
  if (!crc) return ckpt_file_crc(path, &m->bytes[i], &m->crc[i]);
  m->crc[i] = *crc;
  if (ckpt_file_size(path, &m->bytes[i]) != 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  return DLREC_OK;
}

static dlrec_status read_pointer(const char *run_dir, const char *name, char *probe, size_t probe_size,
                                 uint64_t *step);

/* When the checkpoints steps[from..to) of RUN all hold one table.bin (the
 * journals of one base): the index of the newest checkpoint before `from`
 * that holds another, else SIZE_MAX. */
static size_t other_base(const char *run_dir, const uint64_t *steps, size_t from, size_t to) {
  char dir[4096];
  uint64_t id[2], first[2] = {0, 0};
  int have = 0;
  for (size_t i = from; i < to; i++) {
    if (ckpt_step_dir(run_dir, steps[i], dir, sizeof dir) != DLREC_OK || !ckpt_table_id(dir, id)) continue;
    if (have && (id[0] != first[0] || id[1] != first[1])) return SIZE_MAX;
    first[0] = id[0], first[1] = id[1], have = 1;
  }
  for (size_t i = from; i-- > 0;)
    if (ckpt_step_dir(run_dir, steps[i], dir, sizeof dir) == DLREC_OK && ckpt_table_id(dir, id) &&
        (!have || id[0] != first[0] || id[1] != first[1]))
      return i;
  return SIZE_MAX;
}

/* Removes all but the newest `keep` checkpoints up to step `saved` (the one
 * just written), never the one RUN/best names, and, with keep >= 2, never
 * the newest older checkpoint on another base while the newest `keep` all
 * hold one table.bin: the run keeps two restore points that no one damaged
 * file takes down (docs/formats.md, "Journaled checkpoints"). Checkpoints
 * after `saved` (left by a run that was resumed from an older one) are
 * neither counted nor removed: the run writes them again when it gets
 * there. Removing a base's directory never removes its files while a kept
 * journal links them. */
static void prune(const char *run_dir, uint32_t keep, uint64_t saved) {
  char probe[4096];
  uint64_t best = 0;
  int has_best = read_pointer(run_dir, "best", probe, sizeof probe, &best) == DLREC_OK;
  uint64_t steps[4096];
  size_t n = ckpt_list_steps(run_dir, steps, 4096);
  while (n && steps[n - 1] > saved) n--;
  const size_t other = keep >= 2 && n > keep ? other_base(run_dir, steps, n - keep, n) : SIZE_MAX;
  for (size_t i = 0; i + keep < n; i++) {
    char path[4096];
    if ((has_best && steps[i] == best) || i == other) continue;
    if (ckpt_step_dir(run_dir, steps[i], path, sizeof path) != DLREC_OK) continue;
    if (dlrec_remove_tree(path) != DLREC_OK) DLREC_WARN("could not remove old checkpoint: %s", dlrec_last_error());
  }
}

/* Whether a checkpoint at `step` may journal against j's base and still
 * leave the newest `keep` checkpoints on two bases when keep >= 2. With
 * checkpoint.interval_steps I: while step is less than (keep - 1) * I after
 * the base's, so that a run writes a new base every keep - 1 checkpoints of
 * its cadence, and a resumed run the same ones as an uninterrupted run (the
 * extra checkpoint where it stopped changes nothing: prune keeps a second
 * base then). Without I: while fewer than keep - 1 of the run's checkpoints
 * hold the base's table.bin. */
static int base_has_room(const char *run_dir, const dlrec_train_config *cfg, uint32_t keep,
                         const dlrec_checkpoint_journal *j, uint64_t step) {
  if (keep < 2) return 1;
  const uint64_t every = cfg->checkpoint_interval_steps;
  if (every) return step < j->base_step || (step - j->base_step) / every < keep - 1;
  uint64_t steps[4096], base[2], id[2];
  char dir[4096];
  if (!ckpt_table_id(j->base, base)) return 0;
  const size_t n = ckpt_list_steps(run_dir, steps, 4096);
  uint32_t on_base = 0;
  for (size_t i = 0; i < n && steps[i] < step; i++)
    on_base += ckpt_step_dir(run_dir, steps[i], dir, sizeof dir) == DLREC_OK && ckpt_table_id(dir, id) &&
               id[0] == base[0] && id[1] == base[1];
  return on_base < keep - 1;
}

/* A journaled checkpoint's table.bin and optim.bin: hard links to the
 * base's (j->base), recorded with the sizes and checksums the base's sealed
 * manifest gives them (that manifest's read checks the sizes). */
static dlrec_status link_base(const dlrec_checkpoint_journal *j, const char *tmp, manifest *man) {
  manifest base;
  TRY(ckpt_read_manifest(j->base, &base));
  const uint64_t step = base.has[F_JOURNAL] ? base.journal_base : base.p.step;
  if (!base.has[F_OPTIM] || step != j->base_step)
    return dlrec_error(DLREC_ERR_INVALID, "%s: not the base of step %llu any more", j->base,
                       (unsigned long long)j->base_step);
  for (int i = F_TABLE; i <= F_OPTIM; i++) {
    char from[4096], to[4096];
    TRY(ckpt_join(from, sizeof from, j->base, ckpt_file_names[i]));
    TRY(ckpt_join(to, sizeof to, tmp, ckpt_file_names[i]));
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
  int k = ckpt_journal_table_arrays(m, v->table, v->mapped, rows, n_rows, 0, a);
  dlrec_status s = ckpt_join(path, sizeof path, tmp, ckpt_file_names[F_JOURNAL]);
  if (s == DLREC_OK) s = tensor_file_write(path, a, k, &crc);
  if (s == DLREC_OK) s = note_file(man, tmp, F_JOURNAL, &crc);
  k = ckpt_journal_optim_arrays(opt, v, n_params, dlrec_store_changes_space(store), rows, n_rows, a);
  if (s == DLREC_OK) s = ckpt_join(path, sizeof path, tmp, ckpt_file_names[F_JOURNAL_OPTIM]);
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

/* config.json and etl/ into tmp, each noted in the manifest. */
static dlrec_status write_config(const char *tmp, const dlrec_train_config *cfg, const char *etl_dir, manifest *man) {
  char path[4096], from[4096], etl_out[4096];
  cJSON *cj = dlrec_train_config_to_json(cfg);
  dlrec_status s = ckpt_join(path, sizeof path, tmp, "config.json");
  if (s == DLREC_OK) s = dlrec_json_write(path, cj);
  cJSON_Delete(cj);
  if (s == DLREC_OK) s = note_file(man, tmp, F_CONFIG, NULL);
  if (s == DLREC_OK) s = ckpt_join(etl_out, sizeof etl_out, tmp, "etl");
  if (s == DLREC_OK) s = dlrec_mkdirs(etl_out);
  for (int i = 0; s == DLREC_OK && ckpt_etl_files[i]; i++) {
    s = ckpt_join(from, sizeof from, etl_dir, ckpt_etl_files[i]);
    if (s == DLREC_OK) s = ckpt_join(path, sizeof path, etl_out, ckpt_etl_files[i]);
    if (s == DLREC_OK) s = dlrec_copy_file(from, path);
    if (s == DLREC_OK) s = note_file(man, tmp, i ? F_ETL_VOCAB : F_ETL_JSON, NULL);
  }
  return s == DLREC_OK ? dlrec_fsync_dir(etl_out) : s;
}

/* Tensor file i (named as the manifest names it) of n arrays into tmp,
 * noted in the manifest. */
static dlrec_status write_tensors(const char *tmp, manifest *man, int i, const tensor_desc *arrays, int n) {
  char path[4096];
  uint32_t crc = 0;
  dlrec_status s = ckpt_join(path, sizeof path, tmp, ckpt_file_names[i]);
  if (s == DLREC_OK) s = tensor_file_write(path, arrays, n, &crc);
  return s == DLREC_OK ? note_file(man, tmp, i, &crc) : s;
}

/* dense.bin, with the model's type and tensors in the manifest. */
static dlrec_status write_dense(const char *tmp, const dlrec_net *m, manifest *man) {
  size_t n_params;
  const float *params = dlrec_net_dense_params_const(m, &n_params);
  snprintf(man->type, sizeof man->type, "%s", dlrec_net_get_config(m)->type);
  man->n_tensors = dlrec_net_n_tensors(m);
  memcpy(man->tensors, dlrec_net_tensors(m), man->n_tensors * sizeof *man->tensors);
  tensor_desc dense[DLREC_NET_MAX_TENSORS];
  const int n_dense = ckpt_dense_arrays(m, (float *)params, dense);
  return write_tensors(tmp, man, F_DENSE, dense, n_dense);
}

/* The table and the optimizer's state: journal.bin (and journal_optim.bin)
 * beside links to the base's files when journaled, else table.bin and
 * optim.bin from the store's view or through src; hash.bin for a hash
 * table. *journaled may drop to 0 (a full save) when the base cannot be
 * linked. */
static dlrec_status write_rows(const char *tmp, const dlrec_train_config *cfg, const dlrec_net *m,
                               const dlrec_net_optim *opt, const dlrec_row_source *src,
                               const dlrec_checkpoint_journal *j, uint64_t n_changed, int *journaled, manifest *man) {
  size_t n_params;
  dlrec_net_dense_params_const(m, &n_params);
  dlrec_store *store = dlrec_net_store(m);
  /* A link made before a failure is replaced below: tensor_file_write
   * writes a new file, never through the old name's inode. */
  if (*journaled && link_base(j, tmp, man) != DLREC_OK) {
    DLREC_WARN("checkpoint at step %llu: a full one, not a journal (%s)", (unsigned long long)man->p.step,
               dlrec_last_error());
    *journaled = 0;
    man->has[F_TABLE] = man->has[F_OPTIM] = 0;
  }
  dlrec_store_view view = {0};
  source_stream streams[5];
  dlrec_status s = DLREC_OK;
  const int mapped = !src && (s = ckpt_map_table(m, opt, &view)) == DLREC_OK;
  if (s == DLREC_OK && *journaled) {
    s = write_journal(tmp, m, opt, &view, n_params, n_changed, man);
    man->journal_base = j->base_step;
  } else if (s == DLREC_OK) {
    tensor_desc table = src ? ckpt_source_table(m, src, 1, &streams[4]) : ckpt_table_array(m, &view);
    s = write_tensors(tmp, man, F_TABLE, &table, 1);
  }
  if (s == DLREC_OK && opt && !*journaled) {
    tensor_desc arrays[8];
    int n = src ? ckpt_source_optim_arrays(cfg, m, opt, src, n_params, 1, streams, arrays)
                : ckpt_optim_arrays(opt, &view, n_params, arrays);
    s = write_tensors(tmp, man, F_OPTIM, arrays, n);
  }
  if (mapped) dlrec_store_unmap(store, &view);
  if (s == DLREC_OK && dlrec_store_get_kind(store) == DLREC_STORE_HASH) {
    tensor_desc arrays[4];
    const int k = ckpt_hash_arrays(m, arrays);
    s = write_tensors(tmp, man, F_HASH, arrays, k);
  }
  return s;
}

/* The manifest, then tmp renamed into place as final_dir and named by
 * RUN/latest (a step that exists, a resumed run reaching it again, is
 * replaced). */
static dlrec_status publish(const char *run_dir, const char *name, const char *tmp, const char *final_dir,
                            const manifest *man) {
  char path[4096], latest[128];
  dlrec_status s = write_manifest(tmp, man);
  if (s == DLREC_OK) s = dlrec_fsync_dir(tmp);
  if (s == DLREC_OK) s = dlrec_remove_tree(final_dir);
  if (s == DLREC_OK) s = dlrec_rename_durable(tmp, final_dir);
  if (s != DLREC_OK) return s;
  const int n = snprintf(latest, sizeof latest, "%s\n", name);
  s = ckpt_join(path, sizeof path, run_dir, "latest");
  return s == DLREC_OK ? dlrec_write_file_atomic(path, latest, (size_t)n) : s;
}

dlrec_status dlrec_checkpoint_save_rows(const char *run_dir, const dlrec_train_config *cfg, const char *etl_dir,
                                        const dlrec_net *m, const dlrec_net_optim *opt, const dlrec_train_progress *p,
                                        uint32_t keep, dlrec_checkpoint_journal *j, const dlrec_row_source *src) {
  char name[64], final_dir[4096], tmp[4096];
  snprintf(name, sizeof name, "ckpt-%012" PRIu64, p->step);
  TRY(dlrec_mkdirs(run_dir));
  TRY(ckpt_join(final_dir, sizeof final_dir, run_dir, name));
  if (snprintf(tmp, sizeof tmp, "%s.tmp", final_dir) >= (int)sizeof tmp) return dlrec_error(DLREC_ERR_INVALID, "path too long");
  TRY(dlrec_remove_tree(tmp)); /* a leftover of a crash mid-save */
  TRY(dlrec_mkdirs(tmp));
  manifest man = {.p = *p};
  /* Journaled, when the store tracks its changed rows, there is a base,
   * few enough rows changed since, the base may take one more checkpoint
   * (base_has_room), and the base's files can be linked. */
  dlrec_store *store = dlrec_net_store(m);
  const uint64_t n_changed = j && opt && !src ? dlrec_store_changes(store, NULL) : UINT64_MAX;
  int journaled = n_changed != UINT64_MAX && j->max_fraction > 0 && j->base[0] &&
                  (double)n_changed <= j->max_fraction * (double)dlrec_store_changes_space(store) &&
                  base_has_room(run_dir, cfg, keep, j, p->step);
  dlrec_status s = write_config(tmp, cfg, etl_dir, &man);
  if (s == DLREC_OK) s = write_dense(tmp, m, &man);
  if (s == DLREC_OK) s = write_rows(tmp, cfg, m, opt, src, j, n_changed, &journaled, &man);
  if (s == DLREC_OK) s = publish(run_dir, name, tmp, final_dir, &man);
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
  prune(run_dir, keep ? keep : 1, p->step);
  return DLREC_OK;
}

/* Reads the pointer file RUN/name ("latest" or "best"): the name of a
 * checkpoint, whose step goes to *step. probe receives the file's path. */
static dlrec_status read_pointer(const char *run_dir, const char *name, char *probe, size_t probe_size,
                                 uint64_t *step) {
  TRY(ckpt_join(probe, probe_size, run_dir, name));
  char *text;
  size_t n;
  if (dlrec_read_file(probe, 4096, &text, &n) != DLREC_OK) return dlrec_last_status();
  while (n && (text[n - 1] == '\n' || text[n - 1] == '\r')) text[--n] = '\0';
  dlrec_status s = DLREC_OK;
  if (!ckpt_step(text, step)) s = dlrec_error(DLREC_ERR_CORRUPT, "%s: does not name a checkpoint: '%s'", probe, text);
  free(text);
  return s;
}

dlrec_status dlrec_checkpoint_mark_best(const char *run_dir, uint64_t step) {
  char dir[4096], path[4096], text[64];
  struct stat st;
  TRY(ckpt_step_dir(run_dir, step, dir, sizeof dir));
  if (stat(dir, &st) != 0) return dlrec_error(DLREC_ERR_IO, "%s: %s (cannot mark it best)", dir, strerror(errno));
  int n = snprintf(text, sizeof text, "ckpt-%012" PRIu64 "\n", step);
  TRY(ckpt_join(path, sizeof path, run_dir, "best"));
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
    if (read_pointer(path, "best", probe, sizeof probe, &step) == DLREC_OK) return ckpt_step_dir(path, step, out, out_size);
    if (dlrec_last_status() == DLREC_ERR_CORRUPT) return dlrec_last_status();
    return dlrec_error(DLREC_ERR_IO,
                       "%s: no best checkpoint (no 'best'): pass a run directory trained with checkpoint.keep_best "
                       "and validation (eval.every_epoch or eval.interval_steps)",
                       path);
  }
  TRY(ckpt_join(probe, sizeof probe, path, "manifest.json"));
  if (stat(probe, &st) == 0) {
    if (snprintf(out, out_size, "%s", path) >= (int)out_size) return dlrec_error(DLREC_ERR_INVALID, "path too long");
    return DLREC_OK;
  }
  if (read_pointer(path, "latest", probe, sizeof probe, &step) == DLREC_OK) return ckpt_step_dir(path, step, out, out_size);
  if (dlrec_last_status() == DLREC_ERR_CORRUPT) return dlrec_last_status();
  return dlrec_error(DLREC_ERR_IO, "%s: neither a checkpoint (no manifest.json) nor a run directory (no 'latest')", path);
}
