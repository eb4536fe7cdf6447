/* The embedding rows of the models with a first-order term per id (fm,
 * wide_deep, deepfm): D + 1 wide, the first D coordinates an id's factors,
 * the last its first-order weight, so that one lookup fetches both and one
 * sparse optimizer state per row serves both. The generic stage pools these
 * rows into emb (B, F, D + 1); the models split each pooled row into its
 * factors and its weight for the blocks of src/nn, and join the two
 * gradients back into d_emb.
 */
#include <string.h>

#include "dlrec/json.h"
#include "model/model_type.h"

dlrec_status net_fm_config_dim(const cJSON *o, const char *what, uint32_t *emb_dim) {
  uint64_t d = *emb_dim;
  dlrec_status s = dlrec_json_get_u64_or(o, "embedding_dim", what, *emb_dim, &d);
  if (s != DLREC_OK) return s;
  /* One more coordinate holds the first-order weight. */
  if (d < 1 || d > DLREC_EMBED_MAX_DIM - 1)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'embedding_dim': %llu is out of range [1, %d]", what,
                       (unsigned long long)d, DLREC_EMBED_MAX_DIM - 1);
  *emb_dim = (uint32_t)d;
  return DLREC_OK;
}

void net_fm_split(float *v, float *w, const float *emb, size_t n, uint32_t D) {
  for (size_t i = 0; i < n; i++) {
    memcpy(v + i * D, emb + i * (D + 1), (size_t)D * sizeof(float));
    w[i] = emb[i * (D + 1) + D];
  }
}

void net_fm_join(float *d_emb, const float *dv, size_t dv_stride, const float *dv2, const float *dw, int B, int F,
                 uint32_t D) {
  size_t FD = (size_t)F * D;
  for (size_t b = 0; b < (size_t)B; b++)
    for (size_t f = 0; f < (size_t)F; f++) {
      float *out = d_emb + (b * F + f) * (D + 1);
      const float *a = dv + b * dv_stride + f * D;
      if (dv2) {
        const float *c = dv2 + b * FD + f * D;
        for (uint32_t k = 0; k < D; k++) out[k] = a[k] + c[k];
      } else {
        memcpy(out, a, (size_t)D * sizeof(float));
      }
      out[D] = dw[b * F + f];
    }
}
