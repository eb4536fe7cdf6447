/* A job of ranks (docs/distributed.md): the start (the shard plan, rank 0's
 * resume or every rank's init), the agreements that keep every rank at the
 * same step, collective checkpoints and validations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "core/hash.h"
#include "core/json.h"
#include "core/log.h"
#include "core/strbuf.h"
#include "data/dlr.h"
#include "train/trainer_run.h"

/* Across ranks: the checkpoint's rows, from and to the shards. Data without
 * categorical columns has a table of one row that nothing reads (as one
 * process's network keeps), which no shard holds: zeros. */
dlrec_row_source run_shard_rows(run *r) {
  return dlrec_sharded_rows(r->sh, r->schema.n_sparse ? r->schema.table_rows : 1);
}

/* ---- across ranks ---- */

/* Every rank's status, so that all go on or all stop: one that failed alone
 * would leave the others waiting in the next collective. Returns this
 * rank's error, or one naming the first rank that failed. */
dlrec_status run_dist_agree(run *r, dlrec_status s) {
  if (r->ranks < 2) return s;
  int32_t mine = s, all[DLREC_DIST_MAX_RANKS];
  dlrec_status c = dlrec_comm_allgather(r->a->comm, &mine, sizeof mine, all);
  if (c != DLREC_OK) return c;
  if (s != DLREC_OK) return s;
  for (int q = 0; q < r->ranks; q++)
    if (all[q] != DLREC_OK && all[q] != DLREC_END)
      return dlrec_error((dlrec_status)all[q], "rank %d failed (its error is in its log)", q);
  return DLREC_OK;
}

/* ---- the ranks started alike ----
 * What a rank must have as every other does, as a text of lines
 * "NAME=VALUE" or "NAME=VALUE\tSHOWN" (SHOWN, not compared, says what VALUE
 * stands for). */

/* The shortest text of d that reads back as d, as a float where d is one
 * (the config's float fields): 0.002, not 0.0020000000949949026. */
static void shown_number(char *buf, size_t size, double d) {
  const int is_float = (double)(float)d == d;
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(buf, size, "%.*g", digits, d);
    if (is_float ? strtof(buf, NULL) == (float)d : strtod(buf, NULL) == d) return;
  }
}

/* Every field under o as "section.key=JSON value", but the rank's own:
 * its threads (its share of its machine's cores) and its device. */
static void config_lines(dlrec_strbuf *t, const cJSON *o, const char *prefix) {
  for (const cJSON *it = o->child; it; it = it->next) {
    char name[256];
    snprintf(name, sizeof name, "%s%s%s", prefix, prefix[0] ? "." : "", it->string ? it->string : "?");
    if (cJSON_IsObject(it)) {
      config_lines(t, it, name);
      continue;
    }
    if (!strcmp(name, "training.threads") || !strcmp(name, "training.device")) continue;
    char *v = cJSON_PrintUnformatted(it);
    if (!v) t->nomem = 1;
    else if (cJSON_IsNumber(it)) { /* compared exactly, shown short */
      char shown[32];
      shown_number(shown, sizeof shown, it->valuedouble);
      dlrec_strbuf_printf(t, "%s=%s\t%s\n", name, v, shown);
    }
    else dlrec_strbuf_printf(t, "%s=%s\n", name, v);
    cJSON_free(v);
  }
}

/* A .dlr file's content (dlrec_dlr_fingerprint) as the line NAME. */
static dlrec_status dlr_line(dlrec_strbuf *t, const char *name, const char *path) {
  dlrec_dlr *f;
  dlrec_status s = dlrec_dlr_open(&f, path);
  if (s != DLREC_OK) return s;
  const unsigned long long content = (unsigned long long)dlrec_dlr_fingerprint(f);
  dlrec_strbuf_printf(t, "%s=%016llx\t%s (content %016llx)\n", name, content, path, content);
  dlrec_dlr_close(f);
  return DLREC_OK;
}

/* This rank's lines: the config after the command line's overrides, the
 * --train files' content in order, the --valid file's, the ETL state's
 * (etl.json, which carries vocab.bin's checksum), and --resume. */
static dlrec_status alike_lines(const run *r, dlrec_strbuf *t) {
  const dlrec_train_args *a = r->a;
  cJSON *j = dlrec_train_config_to_json(&r->cfg);
  if (!j) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  config_lines(t, j, "");
  cJSON_Delete(j);
  dlrec_status s = DLREC_OK;
  dlrec_strbuf_printf(t, "--train (files)=%d\n", a->n_train);
  for (int i = 0; i < a->n_train && s == DLREC_OK; i++) {
    char name[64];
    snprintf(name, sizeof name, "--train (file %d)", i + 1);
    s = dlr_line(t, name, a->train[i]);
  }
  if (s == DLREC_OK && a->valid) s = dlr_line(t, "--valid", a->valid);
  else if (s == DLREC_OK) dlrec_strbuf_printf(t, "--valid=none\n");
  char path[4096];
  char *etl = NULL;
  size_t n = 0;
  if (s == DLREC_OK) s = dlrec_path_join(path, sizeof path, a->etl_dir, "etl.json");
  if (s == DLREC_OK) s = dlrec_read_file(path, 1u << 26, &etl, &n);
  if (s == DLREC_OK) {
    const unsigned long long h = (unsigned long long)dlrec_hash_bytes(etl, n, 0);
    dlrec_strbuf_printf(t, "--etl=%016llx\t%s (etl.json %016llx)\n", h, a->etl_dir, h);
  }
  free(etl);
  dlrec_strbuf_printf(t, "--resume=%s\n", a->resume ? "yes" : "no");
  if (s == DLREC_OK && t->nomem) s = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  return s;
}

/* The line of `text` (NUL-terminated lines) named name[0, len), or NULL. */
static const char *find_line(const char *text, const char *name, size_t len) {
  for (const char *l = text; *l; l = strchr(l, '\n') + 1)
    if (!strncmp(l, name, len) && l[len] == '=') return l;
  return NULL;
}

/* The first line whose value differs between text a (rank 0's) and b
 * (rank q's), or that one of them lacks, as an error. */
static dlrec_status lines_diff(const char *a, const char *b, int q) {
  for (int pass = 0; pass < 2; pass++) {
    const char *x = pass ? b : a, *y = pass ? a : b;
    for (const char *l = x; *l; l = strchr(l, '\n') + 1) {
      const size_t len = strcspn(l, "="), vlen = strcspn(l + len, "\t\n");
      const char *m = find_line(y, l, len);
      if (m && strcspn(m + len, "\t\n") == vlen && !strncmp(m + len, l + len, vlen)) continue;
      /* What each rank has: the shown part where there is one. */
      const char *xa = pass ? m : l, *xb = pass ? l : m;
      const char *va = xa ? xa + len + 1 : "nothing", *vb = xb ? xb + len + 1 : "nothing";
      if (xa && xa[len + strcspn(xa + len, "\t\n")] == '\t') va = xa + len + strcspn(xa + len, "\t") + 1;
      if (xb && xb[len + strcspn(xb + len, "\t\n")] == '\t') vb = xb + len + strcspn(xb + len, "\t") + 1;
      return dlrec_error(DLREC_ERR_INVALID, "the ranks were started differently: %.*s is %.*s on rank %d but %.*s on "
                         "rank 0 (every rank needs the same config, --train, --valid and --etl files and --resume; "
                         "only training.threads and training.device are a rank's own)",
                         (int)len, l, (int)strcspn(vb, "\n"), vb, q, (int)strcspn(va, "\n"), va);
    }
  }
  return DLREC_OK;
}

/* Before anything is exchanged: every rank's config and data are rank 0's,
 * or every rank stops with the first field that differs, named (a rank
 * with another batch size, table or file would otherwise wait in an
 * exchange that never matches, or train another model silently). */
static dlrec_status dist_check_alike(run *r) {
  dlrec_comm *c = r->a->comm;
  dlrec_strbuf t = {0};
  dlrec_status s = run_dist_agree(r, alike_lines(r, &t));
  uint64_t mine = t.n + 1, each[DLREC_DIST_MAX_RANKS], most = 0;
  if (s == DLREC_OK) s = dlrec_comm_allgather(c, &mine, sizeof mine, each);
  for (int q = 0; s == DLREC_OK && q < r->ranks; q++) most = each[q] > most ? each[q] : most;
  char *all = s == DLREC_OK ? calloc((size_t)r->ranks, (size_t)most) : NULL;
  /* Every rank is in the next exchange or none: a rank without memory for
   * it ends the job. */
  if (s == DLREC_OK && !all) {
    DLREC_ERROR("rank %d: out of memory for the ranks' configs", r->rank);
    dlrec_comm_abort(c, 1);
  }
  if (s == DLREC_OK) {
    memcpy(all + (size_t)r->rank * most, t.p, t.n);
    s = dlrec_comm_allgather(c, all + (size_t)r->rank * most, (size_t)most, all);
  }
  for (int q = 1; s == DLREC_OK && q < r->ranks; q++) s = lines_diff(all, all + (size_t)q * most, q);
  free(all);
  free(t.p);
  return s;
}

/* After setup, across ranks: every rank started alike, the shard plan and
 * this rank's shard; then
 * rank 0 resumes RUN's checkpoint (its rows going to the shards) or every
 * rank draws its shard's rows as one process draws the table, and every
 * rank takes rank 0's progress, dense parameters and their optimizer state
 * and seeks its loader to the progress's position. */
dlrec_status run_dist_start(run *r) {
  dlrec_comm *c = r->a->comm;
  size_t n_params;
  float *params = dlrec_net_dense_params(r->model, &n_params);
  const size_t state = dlrec_optim_state_floats(&r->opt.dense, n_params);
  uint64_t dense = 0;
  dlrec_status s = dist_check_alike(r);
  if (s != DLREC_OK) return s;
  s = run_make_plan(&r->cfg, r->model, r->ranks, &r->plan, &dense);
  const uint32_t rows = run_part_rows(&r->cfg, r->ranks);
  if (s == DLREC_OK) s = dlrec_sharded_create(&r->sh, c, &r->plan, r->model, &r->cfg.sparse, rows);
  if (s == DLREC_OK) r->step.stage = dlrec_sharded_stage(r->sh);
  if ((s = run_dist_agree(r, s)) != DLREC_OK) return s;
  if (r->rank == 0) {
    DLREC_INFO("%d ranks (%s), %u thread%s each; the table sharded:", r->ranks, dlrec_comm_name(c), r->cfg.threads,
               r->cfg.threads == 1 ? "" : "s");
    if (dlrec_log_get_level() <= DLREC_LOG_INFO)
      dlrec_shard_plan_print(&r->plan, &r->schema, dense, dlrec_shard_plan_step_bytes(&r->plan, &r->schema, rows),
                             run_ws_bytes(&r->cfg, r->model, r->ranks, r->cfg.threads,
                                          dlrec_backend_precision(r->be)),
                             stderr);
  }
  if (r->a->resume && r->rank == 0) {
    const dlrec_row_source rows = run_shard_rows(r);
    s = dlrec_sharded_rows_end(r->sh, run_start(r, &rows));
  } else if (r->a->resume) {
    s = dlrec_sharded_rows_serve(r->sh);
  } else {
    s = dlrec_sharded_init(r->sh, &r->cfg.model, &r->schema, r->cfg.seed);
    if (s == DLREC_OK && r->rank == 0) s = run_start(r, NULL);
  }
  if ((s = run_dist_agree(r, s)) != DLREC_OK) return s;
  s = dlrec_comm_bcast(c, &r->prog, sizeof r->prog, 0);
  if (s == DLREC_OK) s = dlrec_comm_bcast(c, params, n_params * sizeof(float), 0);
  if (s == DLREC_OK && state) s = dlrec_comm_bcast(c, r->opt.dense_state, state * sizeof(float), 0);
  if (s == DLREC_OK && r->rank != 0) s = dlrec_loader_seek(r->loader, r->prog.position);
  return run_dist_agree(r, s);
}

/* Something rank 0 did alone (logging, saving): its status, and `bytes`
 * bytes of `shared` (what it decided), to every rank. Returns this rank's
 * status on rank 0, rank 0's on the others. */
dlrec_status run_dist_status(run *r, dlrec_status s, void *shared, size_t bytes) {
  if (!r->sh) return s;
  int32_t st = s;
  dlrec_status c = dlrec_comm_bcast(r->a->comm, &st, sizeof st, 0);
  if (c == DLREC_OK && bytes) c = dlrec_comm_bcast(r->a->comm, shared, bytes, 0);
  if (c != DLREC_OK) return c;
  if (r->rank == 0) return s;
  return st == DLREC_OK ? DLREC_OK : dlrec_error((dlrec_status)st, "rank 0 failed (its error is in its log)");
}

/* A checkpoint, collectively across ranks: rank 0 writes it, taking the
 * rows from the shards a chunk at a time, while the others serve them. */
dlrec_status run_dist_checkpoint(run *r) {
  if (!r->sh) return run_checkpoint_now(r);
  const dlrec_status s =
      r->rank == 0 ? dlrec_sharded_rows_end(r->sh, run_checkpoint_now(r)) : dlrec_sharded_rows_serve(r->sh);
  return run_dist_status(r, s, &r->last_ckpt_step, sizeof r->last_ckpt_step);
}

/* The step's agreement: every rank's loader outcome (its part of the same
 * batch, or the end), its stop request and its part's rows. *global and
 * *base: the batch's rows and where this part starts in it; each (when not
 * NULL): every rank's rows; *stop: some rank was asked to stop (a signal
 * reaches the ranks at different steps). */
dlrec_status run_dist_step_agree(run *r, dlrec_status ls, uint32_t rows, uint32_t *global, uint32_t *base,
                                 int *stop, uint32_t *each) {
  uint32_t mine[3] = {(uint32_t)(int32_t)ls, (uint32_t)run_stop_requested(r), rows}, all[3 * DLREC_DIST_MAX_RANKS];
  dlrec_status s = dlrec_comm_allgather(r->a->comm, mine, sizeof mine, all);
  if (s != DLREC_OK) return s;
  *global = *base = 0;
  *stop = 0;
  int ends = 0;
  for (int q = 0; q < r->ranks; q++) {
    const dlrec_status qs = (dlrec_status)(int32_t)all[3 * q];
    if (qs != DLREC_OK && qs != DLREC_END)
      return q == r->rank ? ls : dlrec_error(qs, "rank %d failed to load its part of the batch (its error is in its log)", q);
    ends += qs == DLREC_END;
    *stop |= all[3 * q + 1] != 0;
    if (q < r->rank) *base += all[3 * q + 2];
    *global += all[3 * q + 2];
    if (each) each[q] = all[3 * q + 2];
  }
  if (ends && ends != r->ranks)
    return dlrec_error(DLREC_ERR_INTERNAL, "the ranks' loaders disagree on the end of the data");
  return ends ? DLREC_END : DLREC_OK;
}

/* Across ranks: every rank scores its part of each validation batch, with
 * the rows its lookups need from their owners, and sends its scores and
 * labels to rank 0, which computes the metrics over all of them in the
 * file's order (the exact global AUC) and shares them. */
dlrec_status run_dist_evaluate(run *r, const char *path, uint64_t max_rows, dlrec_metrics *out) {
  const char *paths[] = {path};
  dlrec_comm *c = r->a->comm;
  const uint32_t N = (uint32_t)r->ranks, B = r->cfg.eval_batch_size;
  const uint32_t part = run_rows_per_rank(B, r->ranks);
  dlrec_loader *ld = NULL;
  dlrec_net_ws *ws = NULL;
  dlrec_net_scorer *sc = NULL;
  dlrec_evaluator *ev = NULL;
  float *pairs = malloc((size_t)part * 2 * sizeof(float)); /* (score, label) of each row of the part */
  float *prob = malloc((size_t)part * sizeof(float));
  /* Rank 0: every part's pairs, then the batch's scores and labels. */
  float *all = r->rank == 0 ? malloc((size_t)B * 4 * sizeof(float)) : NULL;
  uint64_t *sb = calloc(N, sizeof *sb), *rb = calloc(N, sizeof *rb);
  dlrec_status s = pairs && prob && sb && rb && (r->rank != 0 || all) ? DLREC_OK
                                                                      : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  if (s == DLREC_OK) s = run_open_scoring(&ld, r->model, paths, 1, B, (uint32_t)r->rank, N);
  if (s == DLREC_OK && !dlrec_loader_schema(ld)->has_label)
    s = dlrec_error(DLREC_ERR_INVALID, "evaluation needs labeled data");
  if (s == DLREC_OK) s = dlrec_net_ws_create(&ws, r->model, part);
  if (s == DLREC_OK) s = dlrec_net_scorer_create(&sc, r->model);
  if (s == DLREC_OK && r->rank == 0) s = dlrec_evaluator_create(&ev, 0);
  s = run_dist_agree(r, s);
  uint64_t done = 0;
  while (s == DLREC_OK) {
    const dlrec_batch *b = NULL;
    const dlrec_status ls = dlrec_loader_next(ld, &b);
    uint32_t global, base_rows, each[DLREC_DIST_MAX_RANKS];
    int stop; /* a stop request waits for the training loop's next step */
    s = run_dist_step_agree(r, ls, ls == DLREC_OK ? b->rows : 0, &global, &base_rows, &stop, each);
    if (s == DLREC_END) s = DLREC_OK;
    if (s != DLREC_OK || ls == DLREC_END) break;
    if ((s = dlrec_sharded_score(r->sh, sc, ws, b, prob)) != DLREC_OK) {
      DLREC_ERROR("rank %d: scoring %s: %s", r->rank, paths[0], dlrec_last_error());
      dlrec_comm_abort(c, 1);
      break;
    }
    /* The rows within eval.max_rows, each rank's, in the file's order. */
    uint64_t base = done;
    for (uint32_t q = 0; q < N; q++) {
      const uint64_t rows = each[q];
      const uint64_t keep = !max_rows ? rows : base >= max_rows ? 0 : max_rows - base < rows ? max_rows - base : rows;
      sb[q] = 0;
      rb[q] = r->rank == 0 ? keep * 2 * sizeof(float) : 0;
      if ((int)q == r->rank) {
        sb[0] = keep * 2 * sizeof(float);
        for (uint64_t i = 0; i < keep; i++) pairs[2 * i] = prob[i], pairs[2 * i + 1] = b->labels[i];
      }
      base += rows;
    }
    if ((s = dlrec_comm_alltoallv(c, pairs, sb, all, rb)) != DLREC_OK) break;
    dlrec_status es = DLREC_OK;
    if (r->rank == 0) {
      uint64_t n = 0;
      for (uint32_t q = 0; q < N; q++) n += rb[q] / (2 * sizeof(float));
      float *scores = all + 2 * (size_t)B, *labels = scores + B;
      for (uint64_t i = 0; i < n; i++) scores[i] = all[2 * i], labels[i] = all[2 * i + 1];
      if (n) es = dlrec_evaluator_add(ev, scores, labels, n);
    }
    if ((s = run_dist_status(r, es, NULL, 0)) != DLREC_OK) break;
    done = base;
    if (max_rows && done >= max_rows) break;
  }
  if (s == DLREC_OK) s = run_dist_status(r, r->rank == 0 ? dlrec_evaluator_compute(ev, out) : DLREC_OK, out, sizeof *out);
  free(sb);
  free(rb);
  dlrec_evaluator_free(ev);
  dlrec_net_scorer_free(sc);
  dlrec_net_ws_free(ws);
  dlrec_loader_close(ld);
  free(pairs);
  free(all);
  free(prob);
  return s;
}
