/* The memory of `dlrec serve`'s requests (see serve_internal.h): the budget
 * of the requests in flight, the pool of rows objects shared by every
 * connection, and the bytes they hold for /metrics.
 *
 * A rows object used to be cached per connection thread: each keep-alive
 * connection then held one sized for the largest request it had served,
 * thousands of idle connections as many. The pool holds at most pool_max,
 * whichever connection returns them. */
#include <stdlib.h>

#include "serve/serve_internal.h"

uint64_t serve_parse_cost(uint64_t json_len, uint64_t values) {
  return 2 * json_len + (uint64_t)SERVE_VALUE_COST_BYTES * values;
}

void serve_reqmem_init(serve_reqmem *m, uint64_t budget_bytes, uint32_t pool_max) {
  *m = (serve_reqmem){.budget_bytes = budget_bytes, .pool_max = pool_max};
  pthread_mutex_init(&m->mu, NULL);
}

void serve_reqmem_destroy(serve_reqmem *m) {
  while (m->pool) {
    serve_pooled_rows *p = m->pool;
    m->pool = p->next;
    dlrec_serve_rows_free(p->rows);
    free(p);
  }
  pthread_mutex_destroy(&m->mu);
}

int serve_reqmem_charge(serve_reqmem *m, uint64_t bytes) {
  pthread_mutex_lock(&m->mu);
  int ok = !m->budget_bytes || (bytes <= m->budget_bytes && m->charged <= m->budget_bytes - bytes);
  if (ok) m->charged += bytes;
  else m->refused++;
  pthread_mutex_unlock(&m->mu);
  return ok;
}

void serve_reqmem_uncharge(serve_reqmem *m, uint64_t bytes) {
  pthread_mutex_lock(&m->mu);
  m->charged -= bytes < m->charged ? bytes : m->charged;
  pthread_mutex_unlock(&m->mu);
}

void serve_reqmem_buffer(serve_reqmem *m, int64_t delta) {
  pthread_mutex_lock(&m->mu);
  if (delta >= 0) m->buffer_bytes += (uint64_t)delta;
  else m->buffer_bytes -= (uint64_t)-delta < m->buffer_bytes ? (uint64_t)-delta : m->buffer_bytes;
  pthread_mutex_unlock(&m->mu);
}

uint64_t serve_reqmem_buffer_bytes(serve_reqmem *m) {
  pthread_mutex_lock(&m->mu);
  uint64_t n = m->buffer_bytes;
  pthread_mutex_unlock(&m->mu);
  return n;
}

dlrec_serve_rows *serve_reqmem_rows_take(serve_reqmem *m, const serve_model *model, serve_pooled_rows *lease) {
  *lease = (serve_pooled_rows){.serial = model->serial};
  pthread_mutex_lock(&m->mu);
  serve_pooled_rows **at = &m->pool;
  while (*at && (*at)->serial != model->serial) at = &(*at)->next;
  serve_pooled_rows *p = *at;
  if (p) {
    *at = p->next;
    m->pooled--;
  }
  pthread_mutex_unlock(&m->mu);
  if (p) { /* its bytes stay counted while in use */
    *lease = *p;
    lease->next = NULL;
    free(p);
    dlrec_serve_rows_clear(lease->rows);
    return lease->rows;
  }
  if (dlrec_serve_rows_new(&lease->rows, dlrec_net_schema(model->model->net), model->model->etl) != DLREC_OK)
    return NULL;
  lease->bytes = dlrec_serve_rows_bytes(lease->rows);
  serve_reqmem_buffer(m, (int64_t)lease->bytes);
  return lease->rows;
}

void serve_reqmem_rows_give(serve_reqmem *m, serve_pooled_rows *lease) {
  if (!lease->rows) return;
  const uint64_t bytes = dlrec_serve_rows_bytes(lease->rows);
  serve_pooled_rows *p = m->pool_max ? malloc(sizeof *p) : NULL;
  dlrec_serve_rows *drop = lease->rows; /* freed unless pooled */
  uint64_t drop_bytes = bytes;
  pthread_mutex_lock(&m->mu);
  m->buffer_bytes += bytes - lease->bytes; /* what it grew by in use (modulo 2^64 either way) */
  if (p) {
    *p = (serve_pooled_rows){.rows = lease->rows, .serial = lease->serial, .bytes = bytes, .next = m->pool};
    m->pool = p;
    m->pooled++;
    drop = NULL;
    p = NULL;
    if (m->pooled > m->pool_max) { /* the least recently returned goes */
      serve_pooled_rows **at = &m->pool;
      while ((*at)->next) at = &(*at)->next;
      p = *at;
      *at = NULL;
      m->pooled--;
      drop = p->rows;
      drop_bytes = p->bytes;
    }
  }
  if (drop) m->buffer_bytes -= drop_bytes;
  pthread_mutex_unlock(&m->mu);
  dlrec_serve_rows_free(drop);
  free(p);
  lease->rows = NULL;
}
