/* The registry of model types: every type by name, the defaults of the
 * vtable entries a type leaves NULL, and the configs built from it.
 *
 * A type's vtable (net_type, model_type.h) is its file's; the network and
 * its workspaces hold the registry's copy of it, in which every entry the
 * type left NULL is the default below, so the generic code calls each entry
 * without checking. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "model/model_type.h"

/* Every model type, by name (NAME is the type's `const net_type
 * net_type_NAME`, in its own file); the first is the default's
 * (DLREC_DEFAULT_MODEL_TYPE), and types keep their places. A new type adds
 * one line here. */
#define NET_TYPES(X) \
  X(dlrm)            \
  X(lr)              \
  X(fm)              \
  X(wide_deep)       \
  X(deepfm)          \
  X(dcn_v2)          \
  X(dnn)             \
  /* end of the list */

#define NET_TYPE_DECLARE(NAME) extern const net_type net_type_##NAME;
#define NET_TYPE_ENTRY(NAME) &net_type_##NAME,
NET_TYPES(NET_TYPE_DECLARE)
static const net_type *const TYPES[] = {NET_TYPES(NET_TYPE_ENTRY)};
enum { N_TYPES = sizeof TYPES / sizeof *TYPES };

/* ---- the default workspace: an arena of the arrays the type lists --------- */

void net_ws_rows(net_ws_alloc *a, float **ptr, size_t per_row) { net_ws_floats(a, ptr, a->rows * per_row); }

void net_ws_floats(net_ws_alloc *a, float **ptr, size_t n) {
  *ptr = a->failed ? NULL : dlrec_arena_alloc(a->arena, n * sizeof(float), 64);
  if (!*ptr) a->failed = 1;
}

/* The type's workspace struct (p->type->ws_size bytes, its first member the
 * arena), its arrays as the type's ws_arrays lists them. */
static dlrec_status ws_create_default(const void *ctx, const net_plan *p, uint32_t max_batch,
                                      const dlrec_arena_memory *mem, void **out) {
  const net_type *t = p->type;
  *out = NULL;
  dlrec_arena *arena = calloc(1, t->ws_size > sizeof *arena ? t->ws_size : sizeof *arena);
  if (!arena) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  dlrec_arena_init_in(arena, 1u << 20, mem);
  net_ws_alloc a = {.arena = arena, .rows = max_batch};
  if (t->ws_arrays) t->ws_arrays(ctx, arena, &a);
  if (a.failed) {
    dlrec_arena_free(arena);
    free(arena);
    return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the workspace for batches of %u rows", max_batch);
  }
  *out = arena;
  return DLREC_OK;
}

static void ws_free_default(void *ws) {
  if (!ws) return;
  dlrec_arena_free(ws);
  free(ws);
}

/* ---- the registry ------------------------------------------------------------ */

/* The registry's copies of the types, their NULL entries resolved, made once. */
static net_type resolved[N_TYPES];
static pthread_once_t resolved_once = PTHREAD_ONCE_INIT;

static void resolve(void) {
  for (size_t i = 0; i < N_TYPES; i++) {
    net_type *t = &resolved[i];
    *t = *TYPES[i];
    if (!t->ws_create) {
      t->ws_create = ws_create_default;
      t->ws_free = ws_free_default;
    }
  }
}

static const net_type *type_at(size_t i) {
  pthread_once(&resolved_once, resolve);
  return i < N_TYPES ? &resolved[i] : NULL;
}

const char *dlrec_net_type_name(size_t i) { return i < N_TYPES ? TYPES[i]->name : NULL; }

const char *dlrec_net_type_doc(size_t i) { return i < N_TYPES ? TYPES[i]->doc : NULL; }

const char *dlrec_net_type_test_config(size_t i, size_t j, unsigned *checks) {
  const net_test_config *c = i < N_TYPES ? TYPES[i]->tests : NULL;
  for (size_t k = 0; c && c[k].model; k++)
    if (k == j) {
      if (checks) *checks = c[k].checks;
      return c[k].model;
    }
  return NULL;
}

const net_type *net_type_find(const char *name) {
  for (size_t i = 0; i < N_TYPES; i++)
    if (!strcmp(TYPES[i]->name, name)) return type_at(i);
  return NULL;
}

/* An error naming the unknown type and the known ones. */
dlrec_status net_type_unknown(const char *what, const char *type) {
  char list[512] = "";
  for (size_t i = 0; i < N_TYPES; i++) {
    strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
    strncat(list, TYPES[i]->name, sizeof list - strlen(list) - 1);
  }
  return dlrec_error(DLREC_ERR_INVALID, "%s: field 'type': '%s' is not one of %s", what, type, list);
}

/* ---- configs -------------------------------------------------------------------- */

dlrec_status dlrec_net_config_default(dlrec_net_config *c, const char *type) {
  const net_type *t = net_type_find(type);
  if (!t) return net_type_unknown("model", type);
  memset(c, 0, sizeof *c);
  snprintf(c->type, sizeof c->type, "%s", t->name);
  t->config_default(c->params);
  return DLREC_OK;
}

dlrec_status dlrec_net_config_parse(dlrec_net_config *c, const cJSON *o, const char *what) {
  const char *type;
  dlrec_status s = dlrec_json_get_string_or(o, "type", what, c->type, &type);
  if (s != DLREC_OK) return s;
  const net_type *t = net_type_find(type);
  if (!t) return net_type_unknown(what, type);
  /* Another type's settings mean nothing to this one: start from its defaults. */
  if (strcmp(type, c->type) && (s = dlrec_net_config_default(c, type)) != DLREC_OK) return s;
  /* embedding_init and bias_init are every type's: read here, and the type
   * reads the rest. */
  static const char *const generic[] = {"embedding_init", "bias_init"};
  const cJSON *found[2] = {NULL, NULL};
  for (const cJSON *k = cJSON_IsObject(o) ? o->child : NULL; k; k = k->next)
    for (int g = 0; g < 2; g++)
      if (k->string && !strcmp(k->string, generic[g])) {
        if (found[g]) return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s' given twice", what, generic[g]);
        found[g] = k;
      }
  if (!found[0] && !found[1]) return t->config_parse(c->params, o, what);
  if (found[0] && (s = net_embedding_init_parse(&c->embedding_init, found[0], what)) != DLREC_OK) return s;
  if (found[1]) {
    const char *b = cJSON_IsString(found[1]) ? found[1]->valuestring : NULL;
    if (b && !strcmp(b, "normal")) c->bias_init = DLREC_BIAS_INIT_NORMAL;
    else if (b && !strcmp(b, "zeros")) c->bias_init = DLREC_BIAS_INIT_ZEROS;
    else return dlrec_error(DLREC_ERR_INVALID, "%s: field 'bias_init': expected \"normal\" or \"zeros\"", what);
  }
  cJSON *rest = cJSON_Duplicate(o, 1);
  if (!rest) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", what);
  for (int g = 0; g < 2; g++) cJSON_DeleteItemFromObjectCaseSensitive(rest, generic[g]);
  s = t->config_parse(c->params, rest, what);
  cJSON_Delete(rest);
  return s;
}

void dlrec_net_config_to_json(const dlrec_net_config *c, cJSON *o) {
  cJSON_AddStringToObject(o, "type", c->type);
  const net_type *t = net_type_find(c->type);
  if (t) t->config_to_json(c->params, o);
  net_embedding_init_to_json(&c->embedding_init, o);
  if (c->bias_init == DLREC_BIAS_INIT_ZEROS) cJSON_AddStringToObject(o, "bias_init", "zeros");
}

/* ---- config readers the types share ----------------------------------------------- */

dlrec_status net_config_pooling(const cJSON *o, const char *what, dlrec_pooling *pooling) {
  const char *pool = NULL;
  dlrec_status s = dlrec_json_get_string_or(o, "pooling", what, NULL, &pool);
  if (s != DLREC_OK || !pool) return s;
  if (dlrec_pooling_parse(pool, strlen(pool), pooling) != 0)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'pooling': '%s' is not one of sum, mean", what, pool);
  return DLREC_OK;
}
