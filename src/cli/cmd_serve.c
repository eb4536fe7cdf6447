/* dlrec serve: a trained model behind the KServe v2 / Triton HTTP protocol. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "train/checkpoint.h"
#include "serve/serve.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec serve --model RUN [--host 127.0.0.1] [--port 8000] [--threads N] [--device D]\n"
          "                   [--max-batch 1024] [--max-delay-us 500] [--max-queue-rows R]\n"
          "                   [--max-body-bytes N] [--max-inflight-bytes 1073741824]\n"
          "                   [--max-connections 256] [--timeout-s 30]\n"
          "                   [--request-timeout-s 30] [--drain-timeout-s 10]\n"
          "                   [--model-control none|explicit] [--model-control-token-file FILE]\n"
          "                   [--watch] [--watch-interval-ms 1000] [--port-file FILE]\n"
          "                   [--checkpoint latest|best] [--redis HOST:PORT [--redis-prefix P]\n"
          "                   [--redis-timeout-ms 20] [--redis-max-age-ms 1000] [--redis-cache-rows N]]\n\n"
          "Serves RUN's latest checkpoint over HTTP with the KServe v2 / Triton protocol\n"
          "(JSON and binary tensors) until SIGINT or SIGTERM, which drain: new connections\n"
          "are refused and requests in flight finish first. See docs/serving.md.\n\n"
          "  --model RUN           a training run directory (its latest checkpoint) or a checkpoint\n"
          "  --checkpoint WHICH    latest (default) or best: RUN/best, the checkpoint of the best\n"
          "                        validation of a run trained with checkpoint.keep_best (not\n"
          "                        with --watch, which follows RUN/latest)\n"
          "  --host ADDR           IPv4 address to bind (default 127.0.0.1: this machine only)\n"
          "  --port N              TCP port (default 8000; 0: any free port, see --port-file)\n"
          "  --port-file FILE      write the bound port into FILE once listening\n"
          "  --threads N           scoring workers (default: the machine's cores)\n"
          "  --device D            cpu (default), cuda or cuda:N: where the models score\n"
          "  --max-batch N         rows per merged batch and per request (default 1024)\n"
          "  --max-delay-us N      how long a batch waits for requests being received (default 500)\n"
          "  --max-queue-rows N    rows queued before requests get 503 (default 16 x max-batch)\n"
          "  --max-body-bytes N    larger request bodies get 413 (default 64 KiB + 64 x max-batch x\n"
          "                        the model's values per row: 4.3 MB for Criteo at 1024 rows)\n"
          "  --max-inflight-bytes N the requests in flight together: their bodies and JSON parses\n"
          "                        (each about its JSON twice and 80 bytes a value); a request\n"
          "                        past it gets 503 (default 1 GiB; 0: no limit)\n"
          "  --max-connections N   concurrent connections (default 256); past it a new connection\n"
          "                        closes the oldest one still sending its request, or idle\n"
          "  --timeout-s N         idle connections are closed after N seconds (default 30)\n"
          "  --request-timeout-s N a request's headers and body must arrive within N seconds of\n"
          "                        its start, else 408 and the connection is closed (default 30;\n"
          "                        0: no limit)\n"
          "  --drain-timeout-s N   on SIGINT/SIGTERM, requests in flight get N seconds to finish\n"
          "                        (default 10; a second signal stops at once)\n"
          "  --model-control MODE  none (default): the repository load/unload endpoints answer\n"
          "                        403; explicit: they load and unload the model\n"
          "  --model-control-token-file FILE\n"
          "                        load/unload also need \"Authorization: Bearer TOKEN\" with the\n"
          "                        token in FILE (one line, at least 16 printable characters)\n"
          "  --watch               load new checkpoints of RUN as they appear (hot reload)\n"
          "  --watch-interval-ms N how often RUN/latest is checked (default 1000)\n"
          "  --redis HOST:PORT     the Redis tier: embedding rows a trainer publishes\n"
          "                        (publish.redis), read in front of the checkpoint's table;\n"
          "                        Redis down or slow, rows come from the table (docs/serving.md)\n"
          "  --redis-prefix P      the rows' key prefix (default dlrec:NAME, the model's name)\n"
          "  --redis-timeout-ms N  a read slower than this counts as Redis down (default 20)\n"
          "  --redis-max-age-ms N  a row read from Redis is served at most this long, so a\n"
          "                        published row is seen within it (default 1000)\n"
          "  --redis-cache-rows N  rows each scoring worker keeps (default 1048576; 0: none)\n");
}

static int parse_u64(const char *opt, const char *v, uint64_t max, uint64_t *out) {
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  if (!*v || *end || v[0] == '-' || x > max) {
    cli_usage_error("serve", "%s: expected an integer in [0, %llu], got '%s'", opt, (unsigned long long)max, v);
    return 0;
  }
  *out = x;
  return 1;
}

int cmd_serve(int argc, char **argv) {
  dlrec_serve_opts o;
  dlrec_serve_opts_default(&o);
  enum { O_HOST = 256, O_PORT, O_PORT_FILE, O_THREADS, O_MAX_BATCH, O_DELAY, O_QUEUE, O_BODY, O_CONN, O_TIMEOUT,
         O_WATCH, O_WATCH_MS, O_REQ_TIMEOUT, O_DRAIN, O_CONTROL, O_TOKEN, O_CHECKPOINT, O_REDIS, O_REDIS_PREFIX,
         O_REDIS_TIMEOUT, O_REDIS_AGE, O_REDIS_CACHE, O_DEVICE, O_INFLIGHT };
  static const struct option opts[] = {
      {"model", required_argument, 0, 'm'},         {"host", required_argument, 0, O_HOST},
      {"port", required_argument, 0, O_PORT},       {"port-file", required_argument, 0, O_PORT_FILE},
      {"threads", required_argument, 0, O_THREADS}, {"max-batch", required_argument, 0, O_MAX_BATCH},
      {"device", required_argument, 0, O_DEVICE},
      {"max-delay-us", required_argument, 0, O_DELAY}, {"max-queue-rows", required_argument, 0, O_QUEUE},
      {"max-body-bytes", required_argument, 0, O_BODY},
      {"max-inflight-bytes", required_argument, 0, O_INFLIGHT}, {"max-connections", required_argument, 0, O_CONN},
      {"timeout-s", required_argument, 0, O_TIMEOUT}, {"watch", no_argument, 0, O_WATCH},
      {"watch-interval-ms", required_argument, 0, O_WATCH_MS}, {"help", no_argument, 0, 'h'},
      {"request-timeout-s", required_argument, 0, O_REQ_TIMEOUT}, {"drain-timeout-s", required_argument, 0, O_DRAIN},
      {"model-control", required_argument, 0, O_CONTROL}, {"model-control-token-file", required_argument, 0, O_TOKEN},
      {"quiet", no_argument, 0, 'q'},               {"verbose", no_argument, 0, 'v'},
      {"checkpoint", required_argument, 0, O_CHECKPOINT},
      {"redis", required_argument, 0, O_REDIS},    {"redis-prefix", required_argument, 0, O_REDIS_PREFIX},
      {"redis-timeout-ms", required_argument, 0, O_REDIS_TIMEOUT},
      {"redis-max-age-ms", required_argument, 0, O_REDIS_AGE},
      {"redis-cache-rows", required_argument, 0, O_REDIS_CACHE},
      {0, 0, 0, 0}};
  int c;
  uint64_t v;
  const char *which = NULL;
  static char best_dir[4096];
  optind = 1;
  while ((c = getopt_long(argc, argv, "m:hqv", opts, NULL)) != -1) {
    switch (c) {
    case 'm': o.run_dir = optarg; break;
    case O_HOST: o.host = optarg; break;
    case O_PORT: if (!parse_u64("--port", optarg, 65535, &v)) return 2; o.port = (uint16_t)v; break;
    case O_PORT_FILE: o.port_file = optarg; break;
    case O_THREADS: if (!parse_u64("--threads", optarg, 1024, &v)) return 2; o.threads = (uint32_t)v; break;
    case O_DEVICE:
      if (cli_parse_device(optarg, &o.device) != DLREC_OK) return cli_usage_error("serve", "%s", dlrec_last_error());
      break;
    case O_MAX_BATCH: if (!parse_u64("--max-batch", optarg, 1u << 20, &v) || !v) return 2; o.max_batch = (uint32_t)v; break;
    case O_DELAY: if (!parse_u64("--max-delay-us", optarg, 10000000, &v)) return 2; o.max_delay_us = (uint32_t)v; break;
    case O_QUEUE: if (!parse_u64("--max-queue-rows", optarg, UINT32_MAX, &v)) return 2; o.max_queue_rows = (uint32_t)v; break;
    case O_INFLIGHT: if (!parse_u64("--max-inflight-bytes", optarg, 1ull << 40, &v)) return 2; o.max_inflight_bytes = v; break;
    case O_BODY: if (!parse_u64("--max-body-bytes", optarg, 1ull << 34, &v) || !v) return 2; o.max_body_bytes = v; break;
    case O_CONN: if (!parse_u64("--max-connections", optarg, 65536, &v) || !v) return 2; o.max_connections = (uint32_t)v; break;
    case O_TIMEOUT: if (!parse_u64("--timeout-s", optarg, 86400, &v)) return 2; o.timeout_s = (uint32_t)v; break;
    case O_WATCH: o.watch = 1; break;
    case O_REQ_TIMEOUT: if (!parse_u64("--request-timeout-s", optarg, 86400, &v)) return 2; o.request_timeout_s = (uint32_t)v; break;
    case O_DRAIN: if (!parse_u64("--drain-timeout-s", optarg, 3600, &v)) return 2; o.drain_timeout_s = (uint32_t)v; break;
    case O_CONTROL:
      if (!strcmp(optarg, "none")) o.model_control = 0;
      else if (!strcmp(optarg, "explicit")) o.model_control = 1;
      else return cli_usage_error("serve", "--model-control: expected none or explicit, got '%s'", optarg);
      break;
    case O_TOKEN: o.model_control_token_file = optarg; break;
    case O_CHECKPOINT: which = optarg; break;
    case O_REDIS: o.redis = optarg; break;
    case O_REDIS_PREFIX: o.redis_prefix = optarg; break;
    case O_REDIS_TIMEOUT: if (!parse_u64("--redis-timeout-ms", optarg, 60000, &v) || !v) return 2; o.redis_timeout_ms = (uint32_t)v; break;
    case O_REDIS_AGE: if (!parse_u64("--redis-max-age-ms", optarg, 86400000, &v)) return 2; o.redis_max_age_ms = (uint32_t)v; break;
    case O_REDIS_CACHE: if (!parse_u64("--redis-cache-rows", optarg, UINT32_MAX - 1, &v)) return 2; o.redis_cache_rows = v; break;
    case O_WATCH_MS: if (!parse_u64("--watch-interval-ms", optarg, 3600000, &v) || !v) return 2; o.watch_interval_ms = (uint32_t)v; break;
    case 'h': usage(stdout); return 0;
    case 'q': cli_common_option("-q"); break;
    case 'v': cli_common_option("-v"); break;
    default: return cli_usage_error("serve", "unknown option");
    }
  }
  if (optind < argc) return cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
  if (!o.run_dir) return cli_usage_error("serve", "--model is required");
  if (!o.redis && (o.redis_prefix || o.redis_timeout_ms != 20 || o.redis_max_age_ms != 1000 ||
                   o.redis_cache_rows != (1u << 20)))
    return cli_usage_error("serve", "the --redis-* options need --redis HOST:PORT");
  if (which && strcmp(which, "latest") && strcmp(which, "best"))
    return cli_usage_error("serve", "--checkpoint: expected latest or best, got '%s'", which);
  if (which && !strcmp(which, "best")) {
    /* The best checkpoint is served as a checkpoint directory; --watch would
     * follow RUN/latest instead, so the two do not go together. */
    if (o.watch) return cli_usage_error("serve", "--checkpoint best cannot go with --watch (it follows RUN/latest)");
    if (dlrec_checkpoint_select(o.run_dir, "best", best_dir, sizeof best_dir) != DLREC_OK) return cli_fail("serve");
    o.run_dir = best_dir;
  }
  if (dlrec_serve_run(&o) != DLREC_OK) return cli_fail("serve");
  return 0;
}
