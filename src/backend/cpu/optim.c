/* Dense optimizers (SGD, Adam, Adagrad) over flat parameter arrays.
 *
 * A model keeps all its dense parameters in one array and their gradients in
 * another of the same layout, so one call updates every MLP layer. The
 * formulas follow PyTorch's torch.optim with L2 weight decay, so that results
 * can be compared against it step by step.
 */
#include <math.h>

#include "backend/cpu/kernels.h"

/* Updates smaller than this run on one thread (see linear.c). */
#define PARALLEL_MIN 32768

void dlrec_optim_config_default(dlrec_optim_config *c, dlrec_optim_kind kind) {
  c->kind = kind;
  c->lr = 0.01f;
  c->weight_decay = 0.0f;
  c->beta1 = 0.9f;
  c->beta2 = 0.999f;
  c->eps = kind == DLREC_OPTIM_ADAGRAD ? 1e-10f : 1e-8f;
  c->initial_accumulator = 0.0f;
}

static dlrec_status check_config(const dlrec_optim_config *c) {
  if (!c) return dlrec_error(DLREC_ERR_INVALID, "optimizer: NULL config");
  if (c->kind != DLREC_OPTIM_SGD && c->kind != DLREC_OPTIM_ADAM && c->kind != DLREC_OPTIM_ADAGRAD)
    return dlrec_error(DLREC_ERR_INVALID, "optimizer: unknown kind %d", (int)c->kind);
  if (!(c->lr >= 0.0f) || !isfinite(c->lr)) return dlrec_error(DLREC_ERR_INVALID, "optimizer: bad lr %g", c->lr);
  if (!(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
    return dlrec_error(DLREC_ERR_INVALID, "optimizer: bad weight_decay %g", c->weight_decay);
  if (c->kind == DLREC_OPTIM_ADAM &&
      !(c->beta1 >= 0.0f && c->beta1 < 1.0f && c->beta2 >= 0.0f && c->beta2 < 1.0f))
    return dlrec_error(DLREC_ERR_INVALID, "optimizer: Adam betas must be in [0, 1): %g, %g", c->beta1, c->beta2);
  if (c->kind != DLREC_OPTIM_SGD && !(c->eps > 0.0f))
    return dlrec_error(DLREC_ERR_INVALID, "optimizer: eps must be > 0: %g", c->eps);
  if (c->kind == DLREC_OPTIM_ADAGRAD && !(c->initial_accumulator >= 0.0f))
    return dlrec_error(DLREC_ERR_INVALID, "optimizer: bad initial_accumulator %g", c->initial_accumulator);
  return DLREC_OK;
}

size_t dlrec_optim_state_floats(const dlrec_optim_config *c, size_t n) {
  if (!c) return 0;
  switch (c->kind) {
  case DLREC_OPTIM_ADAM: return 2 * n;
  case DLREC_OPTIM_ADAGRAD: return n;
  default: return 0;
  }
}

dlrec_status dlrec_optim_state_init(const dlrec_optim_config *c, float *state, size_t n) {
  dlrec_status st = check_config(c);
  if (st != DLREC_OK) return st;
  size_t count = dlrec_optim_state_floats(c, n);
  if (count && !state) return dlrec_error(DLREC_ERR_INVALID, "optimizer: NULL state");
  float v = c->kind == DLREC_OPTIM_ADAGRAD ? c->initial_accumulator : 0.0f;
  for (size_t i = 0; i < count; i++) state[i] = v;
  return DLREC_OK;
}

static void sgd(float *restrict w, const float *restrict grad, size_t n, float lr, float wd) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) w[i] -= lr * (grad[i] + wd * w[i]);
}

static void adam(float *restrict w, const float *restrict grad, float *restrict m, float *restrict v, size_t n,
                 const dlrec_optim_config *c, uint64_t step) {
  /* The bias corrections fold into a step size and a denominator scale, as in
   * PyTorch: w -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps). */
  const float b1 = c->beta1, b2 = c->beta2, eps = c->eps, wd = c->weight_decay;
  const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
  const float step_size = (float)(c->lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) {
    float g = grad[i] + wd * w[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    w[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
  }
}

static void adagrad(float *restrict w, const float *restrict grad, float *restrict s, size_t n, float lr, float wd,
                    float eps) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) {
    float g = grad[i] + wd * w[i];
    s[i] += g * g;
    w[i] -= lr * g / (sqrtf(s[i]) + eps);
  }
}

dlrec_status cpu_optim_step(const dlrec_optim_config *c, float *param, const float *grad, float *state, size_t n,
                              uint64_t step) {
  dlrec_status st = check_config(c);
  if (st != DLREC_OK) return st;
  if (!param || !grad) return dlrec_error(DLREC_ERR_INVALID, "optim_step: NULL buffer");
  if (dlrec_optim_state_floats(c, n) && !state) return dlrec_error(DLREC_ERR_INVALID, "optim_step: NULL state");
  switch (c->kind) {
  case DLREC_OPTIM_SGD: sgd(param, grad, n, c->lr, c->weight_decay); break;
  case DLREC_OPTIM_ADAM:
    if (step < 1) return dlrec_error(DLREC_ERR_INVALID, "optim_step: Adam's step counts from 1");
    adam(param, grad, state, state + n, n, c, step);
    break;
  case DLREC_OPTIM_ADAGRAD: adagrad(param, grad, state, n, c->lr, c->weight_decay, c->eps); break;
  }
  return DLREC_OK;
}
