/* The sharded embedding stage of a data-parallel training step
 * (dist/dist.h): the rows a part needs come from their owners, the
 * lookups' gradients go back to them, and the dense gradients are summed
 * over the ranks. */
#include <stdlib.h>
#include <string.h>

#include "backend/dispatch.h"
#include "backend/table_store.h"
#include "embed/unique.h"
#include "dist/dist.h"
#include "core/log.h"

struct dlrec_sharded {
  dlrec_stage stage; /* the sharded embedding stage (model/stage.h) over this */
  dlrec_comm *comm;
  const dlrec_shard_plan *plan;
  int rank, N;
  uint32_t F, D;
  size_t row_bytes;         /* a table row's bytes */
  dlrec_table *shard;       /* this rank's rows */
  dlrec_sparse_optim *opt;  /* on shard */
  uint64_t *row_keys;       /* shard row -> fused row: keys a 16-bit row's stochastic rounding as one process would */
  uint64_t updates;         /* sparse updates so far, the job's (one per step with any lookup) */
  /* A part's lookups, in (column, row, position) order: the owner and
   * shard row of each (owner << 32 | local), and its row in `fetch`. */
  uint64_t max_lookups;
  uint64_t *lookup_key;
  uint32_t *fetch_ids;
  /* The unique keys, bucketed by owner, and the set finding them. */
  uint64_t *uniq, *uniq_tmp;
  dlrec_unique set;
  uint64_t n_lookups, n_unique; /* the last part's */
  dlrec_table *fetch; /* the rows of a part's lookups, owner by owner, unique */
  /* Per-peer counts (N each). */
  uint64_t *cnt, *rcnt, *sbytes, *rbytes;
  /* Owner side: requested rows, and received gradients. */
  uint32_t *req, *recv_req;
  uint64_t recv_req_cap;
  char *reply;
  uint64_t reply_cap;
  char *gsend, *grecv;
  uint64_t grecv_cap;
  uint32_t *upd_ids, *upd_off;
  float *upd_g;
  uint64_t upd_cap;
  void *scratch;
  size_t scratch_bytes;
  dlrec_sharded_stats stats;
};

/* A 16-bit table's optimizer counts its updates (they key the rounding);
 * an fp32 table's has no count. */
static void set_updates(dlrec_sparse_optim *o, uint64_t u) {
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(o, &st);
  if (st.updates) *st.updates = u;
}

static void *grow(void *p, uint64_t *cap, uint64_t need, size_t elem) {
  if (need <= *cap && p) return p;
  uint64_t n = need > *cap * 2 ? need : *cap * 2;
  if (n < 64) n = 64;
  void *q = realloc(p, n * elem);
  if (!q) return NULL;
  *cap = n;
  return q;
}

void dlrec_sharded_free(dlrec_sharded *s) {
  if (!s) return;
  dlrec_sparse_optim_free(s->opt);
  dlrec_table_free(s->shard);
  dlrec_table_free(s->fetch);
  free(s->row_keys), free(s->lookup_key), free(s->fetch_ids), free(s->uniq), free(s->uniq_tmp);
  dlrec_unique_free(&s->set);
  free(s->cnt), free(s->rcnt), free(s->sbytes), free(s->rbytes);
  free(s->req), free(s->recv_req), free(s->reply), free(s->gsend), free(s->grecv);
  free(s->upd_ids), free(s->upd_off), free(s->upd_g), free(s->scratch);
  free(s);
}

static dlrec_status set_row_key(void *ctx, uint64_t local, uint64_t global, uint64_t stride, uint64_t n) {
  uint64_t *keys = ctx;
  for (uint64_t i = 0; i < n; i++) keys[local + i] = global + i * stride;
  return DLREC_OK;
}

static const dlrec_stage_ops sharded_ops;

dlrec_status dlrec_sharded_create(dlrec_sharded **out, dlrec_comm *c, const dlrec_shard_plan *p, dlrec_net *net,
                                  const dlrec_sparse_optim_config *oc, uint32_t max_rows) {
  *out = NULL;
  const dlrec_schema *schema = dlrec_net_schema(net);
  if (p->ranks != dlrec_comm_size(c) || p->n_cols != schema->n_sparse)
    return dlrec_error(DLREC_ERR_INVALID, "sharded: a plan of %d ranks and %u columns for %d ranks and %u columns",
                       p->ranks, p->n_cols, dlrec_comm_size(c), schema->n_sparse);
  dlrec_sharded *s = calloc(1, sizeof *s);
  if (!s) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  s->stage = (dlrec_stage){.ops = &sharded_ops, .net = net, .ctx = s};
  s->comm = c;
  s->plan = p;
  s->rank = dlrec_comm_rank(c);
  s->N = p->ranks;
  s->F = schema->n_sparse;
  s->D = dlrec_table_dim(dlrec_net_table_const(net)); /* a tableless network's one row is D wide */
  const dlrec_table_dtype dtype = (dlrec_table_dtype)dlrec_net_get_config(net)->table_dtype;
  dlrec_status st = dlrec_table_create_dtype(&s->shard, p->rows[s->rank] ? p->rows[s->rank] : 1, s->D, dtype);
  if (st != DLREC_OK) goto fail;
  s->row_bytes = (size_t)dlrec_table_stride(s->shard) * dlrec_table_dtype_bytes(dtype);
  if ((st = dlrec_sparse_optim_create(&s->opt, s->shard, oc)) != DLREC_OK) goto fail;
  s->row_keys = calloc(dlrec_table_rows(s->shard), sizeof *s->row_keys);
  if (!s->row_keys) goto nomem;
  dlrec_shard_plan_runs(p, s->rank, set_row_key, s->row_keys);
  dlrec_sparse_optim_set_row_keys(s->opt, s->row_keys);
  uint64_t ids_per_row = 0;
  for (uint32_t c = 0; c < schema->n_sparse; c++) ids_per_row += schema->sparse[c].max_hotness;
  s->max_lookups = (uint64_t)max_rows * (ids_per_row ? ids_per_row : 1);
  if ((st = dlrec_table_create_dtype(&s->fetch, s->max_lookups ? s->max_lookups : 1, s->D, dtype)) != DLREC_OK)
    goto fail;
  s->lookup_key = malloc(s->max_lookups * sizeof *s->lookup_key);
  s->fetch_ids = malloc(s->max_lookups * sizeof *s->fetch_ids);
  s->uniq = malloc(s->max_lookups * sizeof *s->uniq);
  s->uniq_tmp = malloc(s->max_lookups * sizeof *s->uniq_tmp);
  s->req = malloc(s->max_lookups * sizeof *s->req);
  s->gsend = malloc(s->max_lookups * (sizeof(uint32_t) + s->D * sizeof(float)));
  s->cnt = calloc((size_t)s->N, sizeof *s->cnt);
  s->rcnt = calloc((size_t)s->N, sizeof *s->rcnt);
  s->sbytes = calloc((size_t)s->N, sizeof *s->sbytes);
  s->rbytes = calloc((size_t)s->N, sizeof *s->rbytes);
  if (!s->lookup_key || !s->fetch_ids || !s->uniq || !s->uniq_tmp || !s->req || !s->gsend || !s->cnt || !s->rcnt ||
      !s->sbytes || !s->rbytes)
    goto nomem;
  if ((st = dlrec_unique_reserve(&s->set, s->max_lookups)) != DLREC_OK) goto fail;
  *out = s;
  return DLREC_OK;
nomem:
  st = dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the sharded embedding stage (%llu lookups a part)",
                   (unsigned long long)s->max_lookups);
fail:
  dlrec_sharded_free(s);
  return st;
}

/* ---- rows between rank 0 and the shards ------------------------------------ */

/* Bytes a row of array a takes. */
static size_t array_row_bytes(const dlrec_sharded *s, dlrec_row_array a) {
  const size_t stride = dlrec_table_stride(s->shard);
  switch (a) {
  case DLREC_ROWS_TABLE: return s->row_bytes;
  case DLREC_ROWS_M:
  case DLREC_ROWS_V: return stride * sizeof(float);
  default: return sizeof(float); /* accum, steps */
  }
}

/* Where shard row `local` keeps its bytes of array a; NULL when this
 * optimizer has no such array. */
static char *array_row(dlrec_sharded *s, const dlrec_sparse_optim_state *st, dlrec_row_array a, uint64_t local) {
  switch (a) {
  case DLREC_ROWS_TABLE: return (char *)dlrec_table_raw(s->shard) + local * s->row_bytes;
  case DLREC_ROWS_ACCUM: return st->accum ? (char *)(st->accum + local) : NULL;
  case DLREC_ROWS_M: return st->m ? (char *)(st->m + local * st->stride) : NULL;
  case DLREC_ROWS_V: return st->v ? (char *)(st->v + local * st->stride) : NULL;
  case DLREC_ROWS_STEPS: return st->steps ? (char *)(st->steps + local) : NULL;
  }
  return NULL;
}

/* Calls fn(ctx, row, owner, local) for each row of [first, first + n) of
 * the whole table, in order; owner -1 for a row outside every column. */
typedef void (*row_fn)(void *ctx, uint64_t row, int owner, uint64_t local);
static void walk_rows(const dlrec_shard_plan *p, uint64_t first, uint64_t n, row_fn fn, void *ctx) {
  uint32_t c = 0;
  for (uint64_t r = first; r < first + n; r++) {
    while (c < p->n_cols && p->cols[c].end <= r) c++;
    uint64_t local = 0;
    const int owner = c < p->n_cols && r >= p->cols[c].begin ? dlrec_shard_owner(p, c, r, &local) : -1;
    fn(ctx, r, owner, local);
  }
}

typedef struct rows_walk {
  dlrec_sharded *s;
  dlrec_sparse_optim_state st;
  dlrec_row_array a;
  size_t eb;
  uint64_t first;
  char *buf;       /* this rank's rows, packed */
  char *whole;     /* rank 0: the chunk, in row order */
  uint64_t *at;    /* rank 0: each rank's next row in the packed buffer */
  uint64_t mine;   /* this rank's rows so far */
  int put;         /* 1: whole -> shards, 0: shards -> whole */
} rows_walk;

static void count_row(void *ctx, uint64_t row, int owner, uint64_t local) {
  rows_walk *w = ctx;
  (void)row, (void)local;
  if (owner >= 0) w->at[owner]++;
}

/* This rank's rows between its shard and buf. */
static void shard_row(void *ctx, uint64_t row, int owner, uint64_t local) {
  rows_walk *w = ctx;
  (void)row;
  if (owner != w->s->rank) return;
  char *x = array_row(w->s, &w->st, w->a, local);
  if (x && w->put) memcpy(x, w->buf + w->mine * w->eb, w->eb);
  else if (x) memcpy(w->buf + w->mine * w->eb, x, w->eb);
  w->mine++;
}

/* Rank 0: the chunk's rows between whole (row order) and the packed
 * buffers of the ranks (w->buf, each rank's rows at w->at[q]). */
static void whole_row(void *ctx, uint64_t row, int owner, uint64_t local) {
  rows_walk *w = ctx;
  (void)local;
  char *x = w->whole + (row - w->first) * w->eb;
  if (owner < 0) {
    if (!w->put) memset(x, 0, w->eb); /* a row of no column: zeros, as one process's table has */
    return;
  }
  char *y = w->buf + (w->at[owner]++) * w->eb;
  if (w->put) memcpy(y, x, w->eb);
  else memcpy(x, y, w->eb);
}

/* Rows [first, first + n) of array a between rank 0's `whole` and the
 * shards. Collective. An allocation that fails ends the job (the others
 * would wait in the exchange). */
static dlrec_status move_rows(dlrec_sharded *s, dlrec_row_array a, uint64_t first, uint64_t n, char *whole, int put) {
  const int N = s->N;
  rows_walk w = {.s = s, .a = a, .eb = array_row_bytes(s, a), .first = first, .whole = whole, .put = put};
  dlrec_sparse_optim_state_view(s->opt, &w.st);
  uint64_t *cnt = calloc((size_t)N, sizeof *cnt), *off = calloc((size_t)N, sizeof *off);
  w.at = cnt;
  if (cnt && off) walk_rows(s->plan, first, n, count_row, &w);
  /* Rank 0 holds every rank's packed rows at once (the chunk's size);
   * the others their own. */
  const uint64_t mine = cnt ? cnt[s->rank] : 0, bytes = (s->rank == 0 ? n : mine) * w.eb;
  w.buf = malloc(bytes ? bytes : 1);
  if (!cnt || !off || !w.buf) {
    DLREC_ERROR("rank %d: cannot allocate %llu bytes to move rows of the table", s->rank, (unsigned long long)bytes);
    dlrec_comm_abort(s->comm, 1);
    free(cnt), free(off), free(w.buf);
    return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  memset(s->sbytes, 0, (size_t)N * sizeof *s->sbytes);
  memset(s->rbytes, 0, (size_t)N * sizeof *s->rbytes);
  uint64_t sum = 0;
  for (int q = 0; q < N; q++) {
    off[q] = sum;
    sum += cnt[q];
    if (s->rank == 0 && put) s->sbytes[q] = cnt[q] * w.eb;
    if (s->rank == 0 && !put) s->rbytes[q] = cnt[q] * w.eb;
  }
  if (put) s->rbytes[0] = mine * w.eb;
  else s->sbytes[0] = mine * w.eb;
  dlrec_status st = DLREC_OK;
  if (put) {
    /* Rank 0 packs each rank's rows, and every rank takes its own. */
    if (s->rank == 0) {
      memcpy(cnt, off, (size_t)N * sizeof *cnt);
      walk_rows(s->plan, first, n, whole_row, &w);
    }
    char *in = malloc(mine * w.eb + 1);
    if (!in) {
      DLREC_ERROR("rank %d: out of memory moving rows of the table", s->rank);
      dlrec_comm_abort(s->comm, 1);
    }
    if (in) st = dlrec_comm_alltoallv(s->comm, w.buf, s->sbytes, in, s->rbytes);
    if (in && st == DLREC_OK) {
      char *packed = w.buf;
      w.buf = in;
      w.mine = 0;
      walk_rows(s->plan, first, n, shard_row, &w);
      w.buf = packed;
    }
    free(in);
  } else {
    /* Every rank packs its rows, and rank 0 places them. */
    char *out = s->rank == 0 ? malloc(n * w.eb + 1) : NULL;
    if (s->rank == 0 && !out) {
      DLREC_ERROR("rank 0: out of memory moving rows of the table");
      dlrec_comm_abort(s->comm, 1);
    }
    walk_rows(s->plan, first, n, shard_row, &w);
    st = dlrec_comm_alltoallv(s->comm, w.buf, s->sbytes, out, s->rbytes);
    if (st == DLREC_OK && s->rank == 0) {
      free(w.buf);
      w.buf = out;
      out = NULL;
      memcpy(cnt, off, (size_t)N * sizeof *cnt);
      walk_rows(s->plan, first, n, whole_row, &w);
    }
    free(out);
  }
  free(w.buf);
  free(cnt);
  free(off);
  return st;
}

/* Rank 0 drives, the others serve: a command, then the rows. */
enum { ROWS_END = 0, ROWS_GET = 1, ROWS_PUT = 2 };
typedef struct rows_cmd {
  int32_t op, array, status, pad;
  uint64_t first, n;
} rows_cmd;

static dlrec_status rows_command(dlrec_sharded *s, int op, dlrec_row_array a, uint64_t first, uint64_t n, void *buf) {
  rows_cmd c = {op, (int32_t)a, DLREC_OK, 0, first, n};
  dlrec_status st = dlrec_comm_bcast(s->comm, &c, sizeof c, 0);
  return st == DLREC_OK ? move_rows(s, a, first, n, buf, op == ROWS_PUT) : st;
}

dlrec_status dlrec_sharded_rows_get(void *ctx, dlrec_row_array a, uint64_t first, uint64_t n, void *out) {
  return rows_command(ctx, ROWS_GET, a, first, n, out);
}

dlrec_status dlrec_sharded_rows_put(void *ctx, dlrec_row_array a, uint64_t first, uint64_t n, const void *in) {
  return rows_command(ctx, ROWS_PUT, a, first, n, (void *)in);
}

dlrec_status dlrec_sharded_rows_end(dlrec_sharded *s, dlrec_status status) {
  rows_cmd c = {ROWS_END, 0, status, 0, 0, 0};
  dlrec_status st = dlrec_comm_bcast(s->comm, &c, sizeof c, 0);
  if (st == DLREC_OK) st = dlrec_comm_bcast(s->comm, &s->updates, sizeof s->updates, 0);
  if (st == DLREC_OK) set_updates(s->opt, s->updates);
  return status != DLREC_OK ? status : st;
}

dlrec_status dlrec_sharded_rows_serve(dlrec_sharded *s) {
  for (;;) {
    rows_cmd c;
    dlrec_status st = dlrec_comm_bcast(s->comm, &c, sizeof c, 0);
    if (st != DLREC_OK) return st;
    if (c.op == ROWS_END) {
      if ((st = dlrec_comm_bcast(s->comm, &s->updates, sizeof s->updates, 0)) != DLREC_OK) return st;
      set_updates(s->opt, s->updates);
      return c.status == DLREC_OK ? DLREC_OK
                                  : dlrec_error((dlrec_status)c.status, "rank 0 failed (its error is in its log)");
    }
    if ((st = move_rows(s, (dlrec_row_array)c.array, c.first, c.n, NULL, c.op == ROWS_PUT)) != DLREC_OK) return st;
  }
}

dlrec_row_source dlrec_sharded_rows(dlrec_sharded *s, uint64_t table_rows) {
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(s->opt, &st);
  return (dlrec_row_source){.rows = table_rows, .get = dlrec_sharded_rows_get, .put = dlrec_sharded_rows_put,
                            .ctx = s, .updates = st.updates ? &s->updates : NULL};
}

/* A shard's rows as dlrec_table_init_uniform draws the whole table's: every
 * rank draws the table a window at a time and keeps its own rows. */
typedef struct init_walk {
  dlrec_sharded *s;
  const char *window;
  uint64_t first;
} init_walk;

static void init_row(void *ctx, uint64_t row, int owner, uint64_t local) {
  init_walk *w = ctx;
  if (owner != w->s->rank) return;
  memcpy((char *)dlrec_table_raw(w->s->shard) + local * w->s->row_bytes,
         w->window + (row - w->first) * w->s->row_bytes, w->s->row_bytes);
}

dlrec_status dlrec_sharded_init(dlrec_sharded *s, const dlrec_net_config *model, const dlrec_schema *schema,
                                uint64_t seed) {
  dlrec_row_range ranges[DLREC_MAX_SPARSE];
  dlrec_status st = dlrec_net_config_ranges(model, schema, ranges);
  if (st == DLREC_OK) st = table_check_ranges(ranges, schema->n_sparse, schema->table_rows);
  if (st != DLREC_OK) return st;
  const uint64_t W = (uint64_t)TABLE_INIT_CHUNK_ROWS * 4; /* 16k rows a window */
  dlrec_table *win = NULL;
  if ((st = dlrec_table_create_dtype(&win, W, s->D, dlrec_table_get_dtype(s->shard))) != DLREC_OK) return st;
  init_walk w = {.s = s, .window = dlrec_table_raw_const(win)};
  for (uint64_t first = 0; first < schema->table_rows; first += W) {
    table_init_window(win, first, ranges, schema->n_sparse, seed);
    w.first = first;
    walk_rows(s->plan, first, schema->table_rows - first < W ? schema->table_rows - first : W, init_row, &w);
  }
  dlrec_table_free(win);
  return DLREC_OK;
}

/* ---- the step -------------------------------------------------------------- */

/* The part's lookups: their keys (owner << 32 | shard row), the unique
 * keys bucketed by owner (in s->uniq, cnt[r] of them for owner r) and each
 * lookup's row of fetch. */
static dlrec_status list_lookups(dlrec_sharded *s, const dlrec_batch *b, uint64_t *n_out, uint64_t *u_out) {
  const dlrec_shard_plan *p = s->plan;
  uint64_t n = 0, u = 0;
  for (uint32_t c = 0; c < s->F; c++) {
    const uint32_t *off = b->offsets[c], *ids = b->ids[c];
    if (off[0] != 0) return dlrec_error(DLREC_ERR_INVALID, "sharded: column %u's offsets start at %u, not 0", c, off[0]);
    const uint32_t end = off[b->rows];
    if (n + end > s->max_lookups)
      return dlrec_error(DLREC_ERR_INVALID, "sharded: more than %llu lookups in a part of %u rows",
                         (unsigned long long)s->max_lookups, b->rows);
    const dlrec_shard_col *col = &p->cols[c];
    for (uint32_t k = 0; k < end; k++, n++) {
      const uint64_t id = ids[k];
      if (id < col->begin || id >= col->end)
        return dlrec_error(DLREC_ERR_CORRUPT, "column %u: id %llu outside the column's rows [%llu, %llu)", c,
                           (unsigned long long)id, (unsigned long long)col->begin, (unsigned long long)col->end);
      uint64_t local;
      const int owner = dlrec_shard_owner(p, c, id, &local);
      s->lookup_key[n] = (uint64_t)owner << 32 | local;
    }
  }
  dlrec_unique_run(&s->set, s->lookup_key, n, s->uniq_tmp, &u, s->fetch_ids);
  /* Bucket the unique keys by owner, stably (a counting sort), and renumber
   * the lookups' rows of fetch to match. */
  memset(s->cnt, 0, s->N * sizeof *s->cnt);
  for (uint64_t i = 0; i < u; i++) s->cnt[s->uniq_tmp[i] >> 32]++;
  uint64_t at = 0;
  for (int r = 0; r < s->N; r++) {
    s->rcnt[r] = at; /* as scratch: where owner r's bucket starts */
    at += s->cnt[r];
  }
  uint32_t *renum = (uint32_t *)s->req; /* u <= max_lookups; req is filled after this */
  for (uint64_t i = 0; i < u; i++) {
    const uint64_t key = s->uniq_tmp[i], pos = s->rcnt[key >> 32]++;
    s->uniq[pos] = key;
    renum[i] = (uint32_t)pos;
  }
  for (uint64_t k = 0; k < n; k++) s->fetch_ids[k] = renum[s->fetch_ids[k]];
  for (uint64_t i = 0; i < u; i++) s->req[i] = (uint32_t)s->uniq[i];
  *n_out = n;
  *u_out = u;
  return DLREC_OK;
}

/* Step 1: the unique rows go to their owners, the rows come back into fetch. */
static dlrec_status fetch_rows(dlrec_sharded *s) {
  dlrec_status st = dlrec_comm_alltoall_u64(s->comm, s->cnt, s->rcnt);
  if (st != DLREC_OK) return st;
  uint64_t n_req = 0;
  for (int r = 0; r < s->N; r++) {
    s->sbytes[r] = s->cnt[r] * sizeof(uint32_t);
    s->rbytes[r] = s->rcnt[r] * sizeof(uint32_t);
    n_req += s->rcnt[r];
  }
  if (!(s->recv_req = grow(s->recv_req, &s->recv_req_cap, n_req, sizeof *s->recv_req)) ||
      !(s->reply = grow(s->reply, &s->reply_cap, n_req * s->row_bytes, 1)))
    return dlrec_error(DLREC_ERR_NOMEM, "sharded: cannot hold %llu requested rows", (unsigned long long)n_req);
  if ((st = dlrec_comm_alltoallv(s->comm, s->req, s->sbytes, s->recv_req, s->rbytes)) != DLREC_OK) return st;
  const uint64_t shard_rows = s->plan->rows[s->rank];
  const char *data = dlrec_table_raw_const(s->shard);
  for (uint64_t i = 0; i < n_req; i++) {
    if (s->recv_req[i] >= shard_rows)
      return dlrec_error(DLREC_ERR_INTERNAL, "sharded: a request for row %u of a shard of %llu", s->recv_req[i],
                         (unsigned long long)shard_rows);
    memcpy(s->reply + i * s->row_bytes, data + (size_t)s->recv_req[i] * s->row_bytes, s->row_bytes);
  }
  for (int r = 0; r < s->N; r++) {
    s->sbytes[r] = s->rcnt[r] * s->row_bytes;
    s->rbytes[r] = s->cnt[r] * s->row_bytes;
  }
  return dlrec_comm_alltoallv(s->comm, s->reply, s->sbytes, dlrec_table_raw(s->fetch), s->rbytes);
}

/* Step 4: each lookup's gradient (d_emb's bag, times 1/|bag| when the
 * column pools by its mean, as the fused backward scales it) to its row's
 * owner, in (column, row, position) order, and the owner's update. */
static dlrec_status update_rows(dlrec_sharded *s, const dlrec_net *net, const dlrec_batch *b, const float *d_emb,
                                uint64_t n, uint64_t global_lookups) {
  const uint32_t F = s->F, D = s->D, B = b->rows;
  const size_t rec = sizeof(uint32_t) + (size_t)D * sizeof(float);
  memset(s->cnt, 0, s->N * sizeof *s->cnt);
  for (uint64_t k = 0; k < n; k++) s->cnt[s->lookup_key[k] >> 32]++;
  uint64_t at = 0;
  for (int r = 0; r < s->N; r++) {
    s->rcnt[r] = at;
    at += s->cnt[r];
  }
  uint64_t k = 0;
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = b->offsets[c];
    const int mean = dlrec_net_pools_mean(net, c);
    for (uint32_t row = 0; row < B; row++) {
      const float *g = d_emb + ((size_t)row * F + c) * D;
      const float inv = off[row + 1] > off[row] ? 1.0f / (float)(off[row + 1] - off[row]) : 0.0f;
      for (uint32_t j = off[row]; j < off[row + 1]; j++, k++) {
        const uint64_t key = s->lookup_key[k];
        char *x = s->gsend + (s->rcnt[key >> 32]++) * rec;
        const uint32_t local = (uint32_t)key;
        memcpy(x, &local, sizeof local);
        float *v = (float *)(x + sizeof local);
        if (mean)
          for (uint32_t d = 0; d < D; d++) v[d] = inv * g[d];
        else
          memcpy(v, g, D * sizeof(float));
      }
    }
  }
  dlrec_status st = dlrec_comm_alltoall_u64(s->comm, s->cnt, s->rcnt);
  if (st != DLREC_OK) return st;
  uint64_t n_recv = 0;
  for (int r = 0; r < s->N; r++) {
    s->sbytes[r] = s->cnt[r] * rec;
    s->rbytes[r] = s->rcnt[r] * rec;
    n_recv += s->rcnt[r];
  }
  if (!(s->grecv = grow(s->grecv, &s->grecv_cap, n_recv * rec, 1)))
    return dlrec_error(DLREC_ERR_NOMEM, "sharded: cannot hold %llu gradients", (unsigned long long)n_recv);
  if ((st = dlrec_comm_alltoallv(s->comm, s->gsend, s->sbytes, s->grecv, s->rbytes)) != DLREC_OK) return st;
  if (n_recv > UINT32_MAX - 1)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "sharded: %llu gradients for one rank in a step, at most 2^32 - 2",
                       (unsigned long long)n_recv);
  uint64_t ucap = s->upd_cap;
  if (n_recv + 1 > ucap) {
    free(s->upd_ids), free(s->upd_off), free(s->upd_g);
    ucap = n_recv + 1 > 2 * ucap ? n_recv + 1 : 2 * ucap;
    s->upd_ids = malloc(ucap * sizeof *s->upd_ids);
    s->upd_off = malloc((ucap + 1) * sizeof *s->upd_off);
    s->upd_g = malloc(ucap * D * sizeof *s->upd_g);
    s->upd_cap = s->upd_ids && s->upd_off && s->upd_g ? ucap : 0;
    if (!s->upd_cap) return dlrec_error(DLREC_ERR_NOMEM, "sharded: cannot hold %llu gradients", (unsigned long long)n_recv);
  }
  /* The gradients arrive rank by rank, each rank's in (column, row,
   * position) order; a row belongs to one column, so its gradients are in
   * the global batch's (row, position) order: the order one process sums
   * them in. One bag per gradient keeps that order through the sort. */
  for (uint64_t i = 0; i < n_recv; i++) {
    const char *x = s->grecv + i * rec;
    memcpy(&s->upd_ids[i], x, sizeof(uint32_t));
    memcpy(s->upd_g + i * D, x + sizeof(uint32_t), D * sizeof(float));
    s->upd_off[i] = (uint32_t)i;
  }
  s->upd_off[n_recv] = (uint32_t)n_recv;
  const size_t need = dlrec_bag_backward_scratch_bytes(s->shard, n_recv ? n_recv : 1);
  if (need > s->scratch_bytes) {
    free(s->scratch);
    s->scratch = malloc(need);
    s->scratch_bytes = s->scratch ? need : 0;
    if (!s->scratch) return dlrec_error(DLREC_ERR_NOMEM, "sharded: cannot allocate %zu bytes of scratch", need);
  }
  /* The update count keys a 16-bit row's rounding: one process counts one
   * update per step with any lookup, so every shard counts the same. */
  set_updates(s->opt, s->updates);
  if (n_recv) {
    const uint32_t *offs[1] = {s->upd_off}, *ids[1] = {s->upd_ids};
    const dlrec_bag_batch bags = {(uint32_t)n_recv, 1, offs, ids, NULL};
    st = BE_OP(dlrec_net_backend(net), bag_backward_update, s->shard, s->opt, &bags, DLREC_POOLING_SUM, s->upd_g, s->scratch,
               s->scratch_bytes);
  }
  if (global_lookups) s->updates++;
  set_updates(s->opt, s->updates);
  return st;
}

/* The part's batch with its ids rewritten as rows of fetch. */
static void part_batch(const dlrec_sharded *s, const dlrec_batch *b, dlrec_batch *out) {
  *out = *b;
  uint64_t at = 0;
  for (uint32_t c = 0; c < s->F; c++) {
    out->ids[c] = s->fetch_ids + at;
    at += b->offsets[c][b->rows];
  }
}

/* ---- the sharded embedding stage (model/stage.h) ------------------------------ */

/* Steps 1 of dist.h: the rows the part's lookups read, from their owners,
 * and the part's ids rewritten as rows of fetch. Collective. */
static dlrec_status sharded_rows(dlrec_stage *stage, dlrec_net_ws *ws, const dlrec_batch *b, dlrec_batch *out,
                                 int write) {
  (void)ws, (void)write;
  dlrec_sharded *s = stage->ctx;
  uint64_t n = 0, u = 0;
  dlrec_status st = s->F ? list_lookups(s, b, &n, &u) : DLREC_OK;
  if (st == DLREC_OK && s->F) st = fetch_rows(s);
  if (st != DLREC_OK) return st;
  s->n_lookups = n;
  s->n_unique = u;
  part_batch(s, b, out);
  return DLREC_OK;
}

static dlrec_status sharded_forward(dlrec_stage *stage, dlrec_net_ws *ws, dlrec_backend *be, const dlrec_batch *b,
                                    float *emb, int train) {
  (void)ws, (void)train;
  const dlrec_sharded *s = stage->ctx;
  if (!be->host_memory)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: scoring with rows from elsewhere runs on the CPU only for now",
                       be->describe);
  return dlrec_net_pool(stage->net, be, s->fetch, b, emb);
}

/* Step 4 of dist.h. */
static dlrec_status sharded_update(dlrec_stage *stage, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *b,
                                   const float *d_emb, const dlrec_stage_update *u) {
  (void)ws, (void)opt;
  dlrec_sharded *s = stage->ctx;
  dlrec_status st = DLREC_OK;
  if (s->F) {
    st = dlrec_sparse_optim_set_lr(s->opt, u->lr);
    if (st == DLREC_OK) st = update_rows(s, stage->net, b, d_emb, s->n_lookups, u->global_lookups);
  }
  if (st != DLREC_OK) return st;
  s->stats.steps++;
  s->stats.lookups += s->n_lookups;
  s->stats.unique_rows += s->n_unique;
  return DLREC_OK;
}

static const dlrec_stage_ops sharded_ops = {
    .name = "sharded",
    .splits = 1,
    .rows = sharded_rows,
    .forward = sharded_forward,
    .update = sharded_update,
};

dlrec_stage *dlrec_sharded_stage(dlrec_sharded *s) { return &s->stage; }

dlrec_status dlrec_sharded_score(dlrec_sharded *s, const dlrec_net_scorer *sc, dlrec_net_ws *ws, const dlrec_batch *b,
                                 float *prob) {
  dlrec_batch rows;
  if (!b->rows) return sharded_rows(&s->stage, ws, b, &rows, 0); /* the exchange is collective */
  return dlrec_net_predict_stage(sc, ws, &s->stage, b, prob);
}

void dlrec_sharded_get_stats(const dlrec_sharded *s, dlrec_sharded_stats *st) { *st = s->stats; }
