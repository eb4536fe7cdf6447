/* The training report: one self-contained HTML file about a run (no network,
 * no script; the plots are inline SVG), built from what the run wrote:
 *   RUN/metrics.jsonl  the loss, AUC and throughput curves (train and
 *                      validation), and the last validation's reliability
 *                      (calibration) curve
 *   RUN/summary.json   the last training process's totals and where its
 *                      steps spent their time (written by dlrec_train)
 *   RUN/latest's checkpoint: its config.json (the whole config) and its ETL
 *                      state (rows, columns, vocabulary sizes, missing rates)
 * A part that is missing (no validation yet, no checkpoint yet, a run still
 * going) is said so in its place, not an error; only a directory without
 * metrics.jsonl is refused. Torn or foreign lines of metrics.jsonl are
 * skipped and counted in the report.
 */
#ifndef DLREC_REPORT_H
#define DLREC_REPORT_H

#include "core/status.h"

/* Writes the report of run_dir to out_path (NULL: RUN/report.html),
 * atomically. */
dlrec_status dlrec_report_write(const char *run_dir, const char *out_path);

#endif
