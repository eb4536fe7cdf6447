/* Writing synthetic click logs: chunks generated in parallel, written in order.
 *
 * The pipeline's producer hands out chunk numbers, workers generate and format
 * a chunk each (dlrec_synth_generate), and the consumer writes them in order,
 * so a file depends on its seeds and row count only, never on the thread
 * count. Regular files are written under PATH.tmp and renamed when complete.
 */
#include "data/synth.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/log.h"
#include "core/pipeline.h"
#include "core/clock.h"
#include "core/progress.h"

#define AUC_BINS 65536

dlrec_synth_opts dlrec_synth_opts_default(void) {
  return (dlrec_synth_opts){.rows = 0, .seed = 1, .model_seed = 1, .cardinalities = NULL, .max_cardinality = 0,
                            .threads = 0, .out = NULL, .probs = NULL, .progress = 1};
}

/* ---- Output files ---- */

/* A regular output file is made durable while it is written: a syncer thread
 * calls fdatasync every SYNC_BYTES. Left to the final fsync, writing a few
 * hundred megabytes back and flushing the disk's cache costs most of a
 * second in which the generator sits idle; done alongside, it costs nothing
 * but a short final fsync. */
#define SYNC_BYTES (32u << 20)

typedef struct syncer {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int fd;
  uint64_t written; /* bytes the writer has written (guarded by lock) */
  uint64_t synced;  /* bytes the syncer has made durable (guarded by lock) */
  int stop;
  int err; /* errno of the first failed fdatasync; 0 if none */
} syncer;

static void *syncer_main(void *arg) {
  syncer *y = arg;
  pthread_mutex_lock(&y->lock);
  for (;;) {
    while (!y->stop && y->written - y->synced < SYNC_BYTES) pthread_cond_wait(&y->wake, &y->lock);
    if (y->stop) break;
    uint64_t target = y->written;
    pthread_mutex_unlock(&y->lock);
    int rc = fdatasync(y->fd);
    int err = errno;
    pthread_mutex_lock(&y->lock);
    if (rc != 0 && !y->err) y->err = err;
    y->synced = target;
  }
  pthread_mutex_unlock(&y->lock);
  return NULL;
}

typedef struct out_file {
  const char *path; /* as the user gave it */
  char tmp[PATH_MAX + 8];
  int fd;
  int atomic;  /* written to tmp, renamed on success */
  int owned;   /* ours to close (not stdout) */
  syncer *sync; /* NULL: the final fsync does all the work */
} out_file;

static dlrec_status out_write(out_file *f, const void *data, size_t n) {
  dlrec_status st = dlrec_write_all(f->fd, data, n, f->path);
  if (st != DLREC_OK || !f->sync) return st;
  syncer *y = f->sync;
  pthread_mutex_lock(&y->lock);
  y->written += n;
  if (y->written - y->synced >= SYNC_BYTES) pthread_cond_signal(&y->wake);
  pthread_mutex_unlock(&y->lock);
  return DLREC_OK;
}

/* Starts the syncer; without one (no memory, no thread) the file is still
 * written, just with all of the syncing at the end. */
static void out_start_syncer(out_file *f) {
  syncer *y = calloc(1, sizeof *y);
  if (!y) return;
  y->fd = f->fd;
  pthread_mutex_init(&y->lock, NULL);
  pthread_cond_init(&y->wake, NULL);
  if (pthread_create(&y->thread, NULL, syncer_main, y) != 0) {
    pthread_cond_destroy(&y->wake);
    pthread_mutex_destroy(&y->lock);
    free(y);
    return;
  }
  f->sync = y;
}

/* Stops the syncer; returns the errno of a failed fdatasync, or 0. */
static int out_stop_syncer(out_file *f) {
  syncer *y = f->sync;
  if (!y) return 0;
  pthread_mutex_lock(&y->lock);
  y->stop = 1;
  pthread_cond_signal(&y->wake);
  pthread_mutex_unlock(&y->lock);
  pthread_join(y->thread, NULL);
  int err = y->err;
  pthread_cond_destroy(&y->wake);
  pthread_mutex_destroy(&y->lock);
  free(y);
  f->sync = NULL;
  return err;
}

static dlrec_status out_open(out_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  f->path = path;
  f->fd = -1;
  if (!strcmp(path, "-")) {
    f->fd = STDOUT_FILENO;
    return DLREC_OK;
  }
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return dlrec_error(DLREC_ERR_IO, "%s: is a directory", path);
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    /* A pipe or device (/dev/null): nothing to rename, write it directly. */
    f->fd = open(path, O_WRONLY | O_CLOEXEC);
    if (f->fd < 0) return dlrec_error(DLREC_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    f->owned = 1;
    return DLREC_OK;
  }
  if (snprintf(f->tmp, sizeof f->tmp, "%s.tmp", path) >= (int)sizeof f->tmp)
    return dlrec_error(DLREC_ERR_INVALID, "%s: path too long", path);
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) return dlrec_error(DLREC_ERR_IO, "%s: cannot create %s: %s", path, f->tmp, strerror(errno));
  f->atomic = f->owned = 1;
  out_start_syncer(f);
  return DLREC_OK;
}

/* Finishes a file: on success fsyncs and renames it into place; on failure
 * (ok == 0) removes the temporary file. Returns the first error. */
static dlrec_status out_close(out_file *f, int ok) {
  dlrec_status st = DLREC_OK;
  if (f->fd < 0) return st;
  int sync_err = out_stop_syncer(f);
  if (ok && sync_err)
    st = dlrec_error(DLREC_ERR_IO, "%s: fdatasync failed: %s", f->tmp, strerror(sync_err));
  if (ok && st == DLREC_OK && f->atomic && fsync(f->fd) != 0)
    st = dlrec_error(DLREC_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(errno));
  if (f->owned && close(f->fd) != 0 && st == DLREC_OK && ok)
    st = dlrec_error(DLREC_ERR_IO, "%s: close failed: %s", f->atomic ? f->tmp : f->path, strerror(errno));
  f->fd = -1;
  if (f->atomic) {
    if (ok && st == DLREC_OK) st = dlrec_rename_durable(f->tmp, f->path);
    if (!ok || st != DLREC_OK) unlink(f->tmp);
  }
  return st;
}

/* ---- The pipeline ---- */

typedef struct job {
  uint64_t chunk;
  uint32_t rows;
  dlrec_synth_rows out;
  double prob_sum, logloss_sum; /* of this chunk's rows, summed in row order */
} job;

typedef struct writer {
  const dlrec_synth_opts *o;
  const dlrec_synth_model *m;
  out_file text, probs;
  int want_probs;
  uint64_t chunks;
  uint64_t bytes, positives;
  double prob_sum, logloss_sum;
  uint64_t (*hist)[2]; /* [AUC_BINS][negatives, positives] */
  dlrec_progress *bar;
} writer;

static dlrec_status produce(void *ctx, void *jp, uint64_t seq) {
  writer *w = ctx;
  job *j = jp;
  if (seq >= w->chunks) return DLREC_END;
  uint64_t first = seq * DLREC_SYNTH_CHUNK_ROWS;
  uint64_t left = w->o->rows - first;
  j->chunk = seq;
  j->rows = left < DLREC_SYNTH_CHUNK_ROWS ? (uint32_t)left : DLREC_SYNTH_CHUNK_ROWS;
  return DLREC_OK;
}

static dlrec_status work(void *ctx, void *jp, int worker) {
  writer *w = ctx;
  job *j = jp;
  dlrec_status st = dlrec_synth_generate(w->m, w->o->seed, j->chunk, j->rows, &j->out);
  if (st != DLREC_OK) return st;
  double s = 0, ll = 0;
  for (uint32_t i = 0; i < j->rows; i++) {
    double p = j->out.prob[i];
    double q = j->out.label[i] ? p : 1 - p;
    s += p;
    ll -= log(q > 1e-15 ? q : 1e-15);
  }
  j->prob_sum = s;
  j->logloss_sum = ll;
  return DLREC_OK;
}

static dlrec_status consume(void *ctx, void *jp, uint64_t seq) {
  writer *w = ctx;
  job *j = jp;
  dlrec_status st = out_write(&w->text, j->out.text, j->out.text_bytes);
  if (st == DLREC_OK && w->want_probs) st = out_write(&w->probs, j->out.prob_text, j->out.prob_text_bytes);
  if (st != DLREC_OK) return st;
  /* The chunks' sums are added in chunk order, so the totals are independent
   * of the thread count, to the last bit. */
  for (uint32_t i = 0; i < j->rows; i++) {
    uint32_t b = (uint32_t)(j->out.prob[i] * AUC_BINS);
    w->hist[b < AUC_BINS ? b : AUC_BINS - 1][j->out.label[i]]++;
  }
  w->prob_sum += j->prob_sum;
  w->logloss_sum += j->logloss_sum;
  w->bytes += j->out.text_bytes;
  w->positives += j->out.positives;
  dlrec_progress_add(w->bar, j->rows);
  return DLREC_OK;
}

/* The AUC of binned scores: a positive beats every negative in a lower bin
 * and ties half of those in its own. */
static double hist_auc(uint64_t (*hist)[2]) {
  double neg_below = 0, pairs_won = 0, npos = 0, nneg = 0;
  for (int b = 0; b < AUC_BINS; b++) {
    pairs_won += (double)hist[b][1] * (neg_below + 0.5 * (double)hist[b][0]);
    neg_below += (double)hist[b][0];
    npos += (double)hist[b][1];
    nneg += (double)hist[b][0];
  }
  return npos > 0 && nneg > 0 ? pairs_won / (npos * nneg) : NAN;
}

static void jobs_free(job *jobs, int n) {
  for (int i = 0; jobs && i < n; i++) {
    free(jobs[i].out.text);
    free(jobs[i].out.prob);
    free(jobs[i].out.prob_text);
    free(jobs[i].out.label);
  }
  free(jobs);
}

static dlrec_status jobs_alloc(job **out, int n, int want_probs) {
  job *jobs = calloc((size_t)n, sizeof *jobs);
  if (!jobs) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    dlrec_synth_rows *r = &jobs[i].out;
    r->text_cap = (size_t)DLREC_SYNTH_CHUNK_ROWS * DLREC_SYNTH_MAX_ROW_BYTES;
    r->text = malloc(r->text_cap);
    r->prob = malloc(DLREC_SYNTH_CHUNK_ROWS * sizeof *r->prob);
    r->label = malloc(DLREC_SYNTH_CHUNK_ROWS);
    if (want_probs) r->prob_text = malloc((size_t)DLREC_SYNTH_CHUNK_ROWS * DLREC_SYNTH_PROB_BYTES);
    if (!r->text || !r->prob || !r->label || (want_probs && !r->prob_text)) {
      jobs_free(jobs, n);
      return dlrec_error(DLREC_ERR_NOMEM, "out of memory for %d chunk buffers", n);
    }
  }
  *out = jobs;
  return DLREC_OK;
}

static dlrec_status check_opts(const dlrec_synth_opts *o) {
  if (o->rows == 0) return dlrec_error(DLREC_ERR_INVALID, "the row count must be at least 1");
  if (!o->out || !*o->out) return dlrec_error(DLREC_ERR_INVALID, "no output file given");
  if (o->threads < 0) return dlrec_error(DLREC_ERR_INVALID, "the thread count must be >= 0, got %d", o->threads);
  if (o->max_cardinality > UINT32_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "the cardinality cap %llu is above 2^32 - 1",
                       (unsigned long long)o->max_cardinality);
  if (o->probs && !*o->probs) return dlrec_error(DLREC_ERR_INVALID, "empty probabilities file name");
  struct stat st;
  if (o->probs && !strcmp(o->probs, o->out) && (stat(o->out, &st) != 0 || S_ISREG(st.st_mode)))
    return dlrec_error(DLREC_ERR_INVALID, "the rows and the probabilities both go to '%s'", o->out);
  return DLREC_OK;
}

dlrec_status dlrec_synth_write(const dlrec_synth_opts *o, dlrec_synth_stats *stats) {
  double t0 = dlrec_now();
  dlrec_status st = check_opts(o);
  if (st != DLREC_OK) return st;
  writer w = {.o = o, .want_probs = o->probs != NULL};
  w.text.fd = w.probs.fd = -1;
  w.chunks = (o->rows + DLREC_SYNTH_CHUNK_ROWS - 1) / DLREC_SYNTH_CHUNK_ROWS;
  int workers = o->threads > 0 ? o->threads : dlrec_default_threads();
  if ((uint64_t)workers > w.chunks) workers = (int)w.chunks;
  /* A slot per worker and two more keep the workers busy; sixteen more (some
   * 64 MB of text) let them run on while a write waits for the disk, which it
   * does whenever writeback falls behind. */
  int n_jobs = workers + 2 + 16;
  if ((uint64_t)n_jobs > w.chunks) n_jobs = (int)w.chunks;
  job *jobs = NULL;
  void **slots = NULL;
  dlrec_synth_model *m = NULL;

  /* Files first: a bad path should fail before any work is done. */
  st = out_open(&w.text, o->out);
  if (st == DLREC_OK && w.want_probs) st = out_open(&w.probs, o->probs);
  if (st == DLREC_OK) st = dlrec_synth_model_new(o->model_seed, o->cardinalities, o->max_cardinality, &m);
  if (st == DLREC_OK) st = jobs_alloc(&jobs, n_jobs, w.want_probs);
  if (st == DLREC_OK) {
    w.m = m;
    w.hist = calloc(AUC_BINS, sizeof *w.hist);
    slots = calloc((size_t)n_jobs, sizeof *slots);
    if (!w.hist || !slots) st = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  if (st == DLREC_OK) {
    DLREC_DEBUG("synth: model seed %llu (bias %.4f), row seed %llu, %llu chunks of %d rows, %d threads",
                (unsigned long long)o->model_seed, dlrec_synth_bias(m), (unsigned long long)o->seed,
                (unsigned long long)w.chunks, DLREC_SYNTH_CHUNK_ROWS, workers);
    for (int i = 0; i < n_jobs; i++) slots[i] = &jobs[i];
    if (o->progress) w.bar = dlrec_progress_start("synth", o->rows, "rows");
    dlrec_pipeline_ops ops = {produce, work, consume};
    st = dlrec_pipeline_run(&ops, &w, slots, n_jobs, workers);
    if (w.bar) dlrec_progress_finish(w.bar);
  }
  /* Both files are finished, or both removed, whatever happened; the first
   * error is the one reported. The probabilities go first: if the rows then
   * fail to land, the probabilities already renamed are taken back out. */
  int ok = st == DLREC_OK;
  dlrec_status st_probs = out_close(&w.probs, ok);
  if (ok && st_probs != DLREC_OK) ok = 0, st = st_probs;
  dlrec_status st_text = out_close(&w.text, ok);
  if (ok && st_text != DLREC_OK) {
    st = st_text;
    if (w.probs.atomic) unlink(o->probs);
  }
  if (st == DLREC_OK && stats) {
    *stats = (dlrec_synth_stats){
        .rows = o->rows,
        .bytes = w.bytes,
        .positives = w.positives,
        .seconds = dlrec_now() - t0,
        .mean_prob = w.prob_sum / (double)o->rows,
        .logloss = w.logloss_sum / (double)o->rows,
        .auc = hist_auc(w.hist),
    };
  }
  free(w.hist);
  free(slots);
  jobs_free(jobs, n_jobs);
  dlrec_synth_model_free(m);
  return st;
}
