/* Progress bar on stderr: a redrawn line on a terminal, periodic lines otherwise. */
#include "core/clock.h"
#include "core/progress.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct dlrec_progress {
  char what[64];
  char unit[16];
  char note[96];
  uint64_t total;
  uint64_t done;     /* atomic */
  uint64_t calls;    /* atomic; the clock is read every 4096 adds */
  double start;
  double last_print; /* guarded by lock */
  int tty;
  int drawn;         /* a terminal line is on screen */
  pthread_mutex_t lock;
};

static int g_enabled = -1;

void dlrec_progress_enable(int on) { g_enabled = on; }

static int enabled(void) {
  if (g_enabled < 0) {
    const char *e = getenv("DLREC_PROGRESS");
    g_enabled = !(e && !strcmp(e, "0"));
  }
  return g_enabled;
}

/* 1234567 -> "1.23M"; keeps lines short and readable. */
static void human(char *buf, size_t n, double v) {
  const char *suffix[] = {"", "k", "M", "G", "T"};
  int i = 0;
  while (v >= 1000.0 && i < 4) {
    v /= 1000.0;
    i++;
  }
  if (i == 0) snprintf(buf, n, "%.0f", v);
  else snprintf(buf, n, "%.2f%s", v, suffix[i]);
}

static void duration(char *buf, size_t n, double s) {
  if (s < 0 || s > 1e7) snprintf(buf, n, "?");
  else if (s < 60) snprintf(buf, n, "%.0fs", s);
  else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
  else snprintf(buf, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

static void render(dlrec_progress *p, double now, int final) {
  uint64_t done = __atomic_load_n(&p->done, __ATOMIC_RELAXED);
  double secs = now - p->start;
  double rate = secs > 0 ? (double)done / secs : 0;
  char d[32], t[32], r[32], el[32], eta[48], line[400];
  human(d, sizeof d, (double)done);
  human(r, sizeof r, rate);
  duration(el, sizeof el, secs);
  int len;
  if (p->total) {
    human(t, sizeof t, (double)p->total);
    double frac = (double)done / (double)p->total;
    if (frac > 1) frac = 1;
    if (final) snprintf(eta, sizeof eta, "in %s", el);
    else duration(eta, sizeof eta, rate > 0 ? (double)(p->total - (done < p->total ? done : p->total)) / rate : -1);
    len = snprintf(line, sizeof line, "%s: %5.1f%% %s/%s %s %s/s %s%s%s", p->what, 100 * frac, d, t, p->unit, r,
                   final ? "" : "eta ", eta, "");
  } else {
    len = snprintf(line, sizeof line, "%s: %s %s %s/s %s%s", p->what, d, p->unit, r, final ? "in " : "", el);
  }
  if (p->note[0] && len > 0 && (size_t)len < sizeof line) snprintf(line + len, sizeof line - (size_t)len, " %s", p->note);
  if (p->tty) fprintf(stderr, "\r%s\033[K%s", line, final ? "\n" : "");
  else fprintf(stderr, "%s\n", line);
  p->drawn = p->tty && !final;
}

dlrec_progress *dlrec_progress_start(const char *what, uint64_t total, const char *unit) {
  dlrec_progress *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  snprintf(p->what, sizeof p->what, "%s", what);
  snprintf(p->unit, sizeof p->unit, "%s", unit);
  p->total = total;
  p->start = p->last_print = dlrec_now();
  p->tty = isatty(STDERR_FILENO);
  pthread_mutex_init(&p->lock, NULL);
  return p;
}

static void maybe_print(dlrec_progress *p) {
  if (!enabled()) return;
  double now = dlrec_now();
  double every = p->tty ? 0.1 : 10.0;
  if (now - p->last_print < every) return;
  if (pthread_mutex_trylock(&p->lock) != 0) return; /* someone else is printing */
  if (now - p->last_print >= every) {
    p->last_print = now;
    render(p, now, 0);
  }
  pthread_mutex_unlock(&p->lock);
}

void dlrec_progress_add(dlrec_progress *p, uint64_t n) {
  if (!p) return;
  __atomic_fetch_add(&p->done, n, __ATOMIC_RELAXED);
  /* Large steps (chunks) check the clock every time; tiny steps every 4096 calls. */
  if (n >= 1024 || (__atomic_fetch_add(&p->calls, 1, __ATOMIC_RELAXED) & 4095) == 0) maybe_print(p);
}

void dlrec_progress_note(dlrec_progress *p, const char *fmt, ...) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->note, sizeof p->note, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&p->lock);
}

void dlrec_progress_finish(dlrec_progress *p) {
  if (!p) return;
  if (enabled()) {
    pthread_mutex_lock(&p->lock);
    render(p, dlrec_now(), 1);
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_destroy(&p->lock);
  free(p);
}
