/* The served model: loading RUN's latest checkpoint, swapping it in
 * atomically, and watching RUN/latest for new ones.
 *
 * A model is shared by reference count. The registry's lock guards only the
 * pointer swap and the counters; loading (reading and checking gigabytes)
 * runs outside it, so requests keep being served on the old model while a
 * new one loads. The last reference frees a model, on whichever thread lets
 * it go. Loads themselves run one at a time (load_once), since each holds a
 * whole model in memory until it is swapped in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "serve/serve_internal.h"
#include "train/loaded_model.h"

void serve_model_release(serve_model *m) {
  if (!m || atomic_fetch_sub(&m->refs, 1) != 1) return;
  dlrec_net_scorer_free(m->scorer);
  dlrec_model_free(m->model);
  free(m);
}

/* Loads the checkpoint at dir (a checkpoint directory) into a new model with
 * one reference, scoring on the registry's backend. */
static dlrec_status load_model(serve_registry *r, const char *dir, serve_model **out) {
  *out = NULL;
  serve_model *m = calloc(1, sizeof *m);
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  static atomic_ullong serials;
  atomic_init(&m->refs, 1);
  m->serial = atomic_fetch_add(&serials, 1) + 1;
  dlrec_status s = dlrec_model_load(dir, &m->model);
  if (s == DLREC_OK) s = dlrec_model_set_backend(m->model, r->be);
  if (s == DLREC_OK) s = dlrec_net_scorer_create(&m->scorer, m->model->net);
  if (s != DLREC_OK) {
    serve_model_release(m);
    return s;
  }
  m->step = m->model->progress.step;
  snprintf(m->version, sizeof m->version, "%llu", (unsigned long long)m->step);
  *out = m;
  return DLREC_OK;
}

serve_model *serve_registry_acquire(serve_registry *r) {
  pthread_mutex_lock(&r->mu);
  serve_model *m = r->current;
  if (m) atomic_fetch_add(&m->refs, 1);
  pthread_mutex_unlock(&r->mu);
  return m;
}

/* Loads checkpoint `dir` and swaps it in; on failure records the error and
 * the directory (so the watcher does not retry it) and keeps the current. */
static dlrec_status swap_in(serve_registry *r, const char *dir) {
  serve_model *m;
  dlrec_status s = load_model(r, dir, &m);
  if (s == DLREC_OK && strcmp(m->model->config.name, r->name) != 0) {
    s = dlrec_error(DLREC_ERR_INVALID, "%s: model name '%s' differs from the served '%s'", dir,
                    m->model->config.name, r->name);
    serve_model_release(m);
  }
  pthread_mutex_lock(&r->mu);
  serve_model *old = NULL;
  if (s == DLREC_OK) {
    old = r->current;
    r->current = m;
    snprintf(r->current_dir, sizeof r->current_dir, "%s", dir);
    r->failed_dir[0] = 0;
    r->last_error[0] = 0;
    r->loads_ok++;
  } else {
    snprintf(r->failed_dir, sizeof r->failed_dir, "%s", dir);
    snprintf(r->last_error, sizeof r->last_error, "%s", dlrec_last_error());
    r->loads_failed++;
  }
  pthread_mutex_unlock(&r->mu);
  if (s == DLREC_OK) {
    DLREC_INFO("serving %s (model '%s', version %s)", dir, r->name, m->version);
    serve_model_release(old);
  } else {
    DLREC_ERROR("refused checkpoint %s: %s", dir, dlrec_last_error());
  }
  return s;
}

/* Loads checkpoint dir as the only load in flight. A request for the
 * checkpoint that is loading now waits for that load and takes its result,
 * so that a burst of identical requests costs one load; one for another
 * checkpoint waits its turn. The watcher (try_only) skips a turn instead of
 * waiting: it comes back on its next tick. */
static dlrec_status load_once(serve_registry *r, const char *dir, int try_only) {
  pthread_mutex_lock(&r->mu);
  while (r->loading) {
    if (try_only) {
      pthread_mutex_unlock(&r->mu);
      return DLREC_OK;
    }
    if (!strcmp(r->loading_dir, dir)) {
      uint64_t seen = r->loads_finished;
      r->load_waiters++;
      while (r->loads_finished == seen) pthread_cond_wait(&r->load_cv, &r->mu);
      r->load_waiters--;
      dlrec_status s = r->load_status;
      char msg[sizeof r->load_error];
      memcpy(msg, r->load_error, sizeof msg);
      pthread_mutex_unlock(&r->mu);
      return s == DLREC_OK ? DLREC_OK : dlrec_error(s, "%s", msg);
    }
    pthread_cond_wait(&r->load_cv, &r->mu);
  }
  r->loading = 1;
  snprintf(r->loading_dir, sizeof r->loading_dir, "%s", dir);
  pthread_mutex_unlock(&r->mu);
  if (r->load_hook) r->load_hook(r);
  dlrec_status s = swap_in(r, dir);
  pthread_mutex_lock(&r->mu);
  r->loading = 0;
  r->loading_dir[0] = 0;
  r->loads_finished++;
  r->load_status = s;
  snprintf(r->load_error, sizeof r->load_error, "%s", s == DLREC_OK ? "" : dlrec_last_error());
  pthread_cond_broadcast(&r->load_cv);
  pthread_mutex_unlock(&r->mu);
  return s;
}

dlrec_status serve_registry_open(serve_registry *r, const char *run_dir, const char *device) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->load_cv, NULL);
  pthread_mutex_init(&r->stop_mu, NULL);
  pthread_cond_init(&r->stop_cv, NULL);
  snprintf(r->run_dir, sizeof r->run_dir, "%s", run_dir);
  char dir[1024];
  dlrec_backend_config bc = {1, DLREC_PRECISION_FP32, 0}; /* scoring is fp32 in every precision */
  dlrec_status s = dlrec_backend_create_on(&r->be, device, &bc);
  if (s == DLREC_OK) s = dlrec_checkpoint_resolve(run_dir, dir, sizeof dir);
  serve_model *m = NULL;
  if (s == DLREC_OK) s = load_model(r, dir, &m);
  if (s != DLREC_OK) {
    dlrec_backend_free(r->be);
    r->be = NULL;
    return s;
  }
  snprintf(r->name, sizeof r->name, "%s", m->model->config.name);
  r->current = m;
  snprintf(r->current_dir, sizeof r->current_dir, "%s", dir);
  r->loads_ok = 1;
  DLREC_INFO("serving %s (model '%s', version %s)", dir, r->name, m->version);
  return DLREC_OK;
}

dlrec_status serve_registry_load(serve_registry *r) {
  char dir[1024];
  dlrec_status s = dlrec_checkpoint_resolve(r->run_dir, dir, sizeof dir);
  if (s != DLREC_OK) return s;
  return load_once(r, dir, 0);
}

void serve_registry_unload(serve_registry *r) {
  pthread_mutex_lock(&r->mu);
  serve_model *old = r->current;
  r->current = NULL;
  r->current_dir[0] = 0;
  pthread_mutex_unlock(&r->mu);
  if (old) DLREC_INFO("unloaded model '%s'", r->name);
  serve_model_release(old);
}

/* Polls RUN/latest; loads a checkpoint directory it has not served or
 * refused yet. An unloaded model stays unloaded until a load request. */
static void *watch_main(void *arg) {
  serve_registry *r = arg;
  for (;;) {
    pthread_mutex_lock(&r->stop_mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += r->interval_ms / 1000;
    until.tv_nsec += (long)(r->interval_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    while (!r->stop && pthread_cond_timedwait(&r->stop_cv, &r->stop_mu, &until) != ETIMEDOUT) {
    }
    int stop = r->stop;
    pthread_mutex_unlock(&r->stop_mu);
    if (stop) break;
    char dir[1024];
    if (dlrec_checkpoint_resolve(r->run_dir, dir, sizeof dir) != DLREC_OK) continue; /* mid-write: next time */
    pthread_mutex_lock(&r->mu);
    int fresh = r->current && strcmp(dir, r->current_dir) != 0 && strcmp(dir, r->failed_dir) != 0;
    pthread_mutex_unlock(&r->mu);
    if (fresh) load_once(r, dir, 1);
  }
  return NULL;
}

dlrec_status serve_registry_watch(serve_registry *r, uint32_t interval_ms) {
  r->interval_ms = interval_ms ? interval_ms : 1000;
  if (pthread_create(&r->watcher, NULL, watch_main, r) != 0)
    return dlrec_error(DLREC_ERR_INTERNAL, "cannot start the checkpoint watcher");
  r->watching = 1;
  return DLREC_OK;
}

void serve_registry_close(serve_registry *r) {
  if (r->watching) {
    pthread_mutex_lock(&r->stop_mu);
    r->stop = 1;
    pthread_cond_signal(&r->stop_cv);
    pthread_mutex_unlock(&r->stop_mu);
    pthread_join(r->watcher, NULL);
    r->watching = 0;
  }
  serve_model_release(r->current);
  r->current = NULL;
  /* Requests held the other references, and they have all ended by now. */
  dlrec_backend_free(r->be);
  r->be = NULL;
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->load_cv);
  pthread_mutex_destroy(&r->stop_mu);
  pthread_cond_destroy(&r->stop_cv);
}
