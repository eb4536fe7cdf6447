/* The KServe v2 / Triton endpoints' paths (http.c's routing): a request
 * target parsed into its route and the model and version it names. */
#include <string.h>

#include "serve/serve_internal.h"

/* The next path segment of *p (after a '/') into seg; 0 at the end. */
static int segment(const char **p, char *seg, size_t n) {
  if (**p != '/') return 0;
  const char *s = *p + 1, *e = strchr(s, '/');
  if (!e) e = s + strlen(s);
  if (e == s || (size_t)(e - s) >= n) return 0;
  memcpy(seg, s, (size_t)(e - s));
  seg[e - s] = 0;
  *p = e;
  return 1;
}

route serve_parse_target(const char *url, target *t) {
  memset(t, 0, sizeof *t);
  char a[128], b[128], c[128];
  const char *p = url;
  if (!strcmp(url, "/metrics")) return t->r = R_METRICS;
  if (!segment(&p, a, sizeof a) || strcmp(a, "v2")) return R_NONE;
  if (!*p) return t->r = R_SERVER_META;
  if (!segment(&p, a, sizeof a)) return R_NONE;
  if (!strcmp(a, "health")) {
    if (!segment(&p, b, sizeof b) || *p) return R_NONE;
    return t->r = !strcmp(b, "live") ? R_LIVE : !strcmp(b, "ready") ? R_READY : R_NONE;
  }
  if (!strcmp(a, "repository")) {
    if (!segment(&p, b, sizeof b)) return R_NONE;
    if (!strcmp(b, "index") && !*p) return t->r = R_REPO_INDEX;
    if (strcmp(b, "models") || !segment(&p, t->model, sizeof t->model) || !segment(&p, c, sizeof c) || *p)
      return R_NONE;
    return t->r = !strcmp(c, "load") ? R_REPO_LOAD : !strcmp(c, "unload") ? R_REPO_UNLOAD : R_NONE;
  }
  if (strcmp(a, "models") || !segment(&p, t->model, sizeof t->model)) return R_NONE;
  const char *q = p;
  if (segment(&q, b, sizeof b) && !strcmp(b, "versions")) {
    if (!segment(&q, t->version, sizeof t->version)) return R_NONE;
    p = q;
  }
  if (!*p) return t->r = R_MODEL_META;
  if (!segment(&p, b, sizeof b) || *p) return R_NONE;
  return t->r = !strcmp(b, "ready") ? R_MODEL_READY : !strcmp(b, "infer") ? R_INFER : R_NONE;
}

serve_endpoint serve_endpoint_of(route r) {
  switch (r) {
  case R_SERVER_META: return EP_SERVER_META;
  case R_LIVE:
  case R_READY: return EP_HEALTH;
  case R_MODEL_META: return EP_MODEL_META;
  case R_MODEL_READY: return EP_MODEL_READY;
  case R_INFER: return EP_INFER;
  case R_REPO_INDEX:
  case R_REPO_LOAD:
  case R_REPO_UNLOAD: return EP_REPOSITORY;
  case R_METRICS: return EP_METRICS;
  default: return EP_OTHER;
  }
}

int serve_is_post(route r) { return r == R_INFER || r == R_REPO_INDEX || r == R_REPO_LOAD || r == R_REPO_UNLOAD; }
