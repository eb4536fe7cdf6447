/* Validation-driven control as a pure state machine: the best metric so
 * far, early stopping with patience, and the learning-rate factor on a
 * plateau. The trainer feeds it one metric per validation; everything it
 * decides follows from the list of metrics alone, which is what makes it
 * testable on a scripted curve and exact across a resume (the state is
 * plain data that the checkpoint manifest stores). */
#include <math.h>

#include "train/train_config.h"

void dlrec_valid_state_init(dlrec_valid_state *s) {
  *s = (dlrec_valid_state){0};
  s->best = s->stop_best = s->plateau_best = NAN;
  s->plateau_scale = 1.0;
}

/* Whether `metric` beats `ref` by more than delta in the monitored
 * direction (AUC higher, logloss lower). No reference yet: any finite value
 * beats it. A NaN metric never does, so an undefined AUC counts as a
 * validation without improvement rather than resetting anything. */
static int beats(int kind, double metric, double ref, double delta) {
  if (isnan(metric)) return 0;
  if (isnan(ref)) return 1;
  return kind == DLREC_VALID_LOGLOSS ? metric < ref - delta : metric > ref + delta;
}

void dlrec_valid_observe(const dlrec_train_config *c, dlrec_valid_state *s, double metric, uint64_t step,
                         dlrec_valid_outcome *o) {
  *o = (dlrec_valid_outcome){0};
  s->validations++;
  if (beats(c->eval_metric, metric, s->best, 0)) {
    s->best = metric;
    s->best_step = step;
    o->improved = 1;
  }
  /* Keras EarlyStopping: `patience` validations in a row that do not beat
   * the reference by more than min_delta end the run. */
  if (c->early_stop_patience) {
    if (beats(c->eval_metric, metric, s->stop_best, c->early_stop_min_delta)) {
      s->stop_best = metric;
      s->stop_bad = 0;
    } else if (++s->stop_bad >= c->early_stop_patience) {
      o->stop = 1;
    }
  }
  /* PyTorch ReduceLROnPlateau (threshold_mode "abs"): more than `patience`
   * bad validations in a row cut the factor, then `cooldown` validations
   * are not counted. A cut that the floor makes smaller than 1e-8 is none,
   * as PyTorch's eps. */
  if (c->plateau_factor < 1.0) {
    if (beats(c->eval_metric, metric, s->plateau_best, c->plateau_min_delta)) {
      s->plateau_best = metric;
      s->plateau_bad = 0;
    } else {
      s->plateau_bad++;
    }
    if (s->plateau_cooldown > 0) {
      s->plateau_cooldown--;
      s->plateau_bad = 0;
    }
    if (s->plateau_bad > c->plateau_patience) {
      double next = s->plateau_scale * c->plateau_factor;
      if (next < c->plateau_min_scale) next = c->plateau_min_scale;
      if (s->plateau_scale - next > 1e-8) {
        s->plateau_scale = next;
        o->reduced = 1;
      }
      s->plateau_cooldown = c->plateau_cooldown;
      s->plateau_bad = 0;
    }
  }
}
