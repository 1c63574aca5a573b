/*
 * gen_node_corpus - writes the seed corpora of fuzz_grpc_requests, fuzz_prefill_replies and
 * fuzz_node_config with the project's own writers: protobuf-c packing of well-formed requests of
 * every type (the first byte selects the type and the node's limits, as the target reads it) and of
 * the node's NodeStatus and OpenSession answers, and config files printed by
 * flx_node_config_format plus a hand-written one with comments.
 *   gen_node_corpus CORPUS_DIR     (writes CORPUS_DIR/grpc_requests/, prefill_replies/ and
 *                                   node_config/; --help: flx/cli.h's convention)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flx/cli.h"
#include "flx/node_config.h"
#include "fluxion/decode/v1/decode.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"

static const char *g_dir;

static void put(const char *sub, const char *name, uint8_t sel, const ProtobufCMessage *m)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(n + 1);
    b[0] = sel;
    protobuf_c_message_pack(m, b + 1);
    fwrite(b, 1, n + 1, f);
    fclose(f);
    free(b);
}

static void put_text(const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/node_config/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

int main(int argc, char **argv)
{
    flx_cli_pos_t pos[] = {FLX_CLI_ARG("CORPUS_DIR", &g_dir, "an existing folder: receives grpc_requests/ and "
                                       "node_config/")};
    flx_cli_t cli = {.prog = "gen_node_corpus", .summary = "Writes the seed corpora of fuzz_grpc_requests and "
                     "fuzz_node_config (tests/fuzz/make_corpus.sh).", .pos = pos, .n_pos = 1};
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    const char *subs[] = {"grpc_requests", "node_config", "prefill_replies"};
    for (int i = 0; i < 3; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", g_dir, subs[i]);
        if (mkdir(p, 0755) && errno != EEXIST) return flx_cli_fail(&cli, "cannot create %s: %s", p, strerror(errno));
    }

    Fluxion__Decode__V1__ModelShape shape = FLUXION__DECODE__V1__MODEL_SHAPE__INIT;
    shape.n_layers = 30;
    shape.n_kv_heads = 3;
    shape.n_q_heads = 9;
    shape.head_dim = 64;
    Fluxion__Decode__V1__AttentionConfig attn = FLUXION__DECODE__V1__ATTENTION_CONFIG__INIT;
    attn.mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED;
    attn.blk = 16;
    attn.budget = 0.05f;
    Fluxion__Decode__V1__OpenSessionRequest open = FLUXION__DECODE__V1__OPEN_SESSION_REQUEST__INIT;
    open.model_id = (char *)"smollm2";
    open.shape = &shape;
    open.prompt_len = 8;
    open.max_new_tokens = 64;
    open.kv_dtype = FLUXION__DECODE__V1__KV_DTYPE__KV_DTYPE_BF16;
    open.attention = &attn;
    open.transfer_timeout_ms = 5000;
    open.lease_ms = 10000;
    put("grpc_requests", "open_fixed_ucx", 0x00, &open.base);
    attn.mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FLUXION;
    attn.tau = 0.1f;
    put("grpc_requests", "open_fluxion_ucx", 0x00, &open.base);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    Fluxion__Decode__V1__LocalPrefill lp = FLUXION__DECODE__V1__LOCAL_PREFILL__INIT;
    lp.token_ids = ids;
    lp.n_token_ids = 8;
    open.local_prefill = &lp;
    attn.mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FULL;
    put("grpc_requests", "open_full_local", 0x40, &open.base);

    Fluxion__Decode__V1__WaitReadyRequest wait = FLUXION__DECODE__V1__WAIT_READY_REQUEST__INIT;
    wait.session_id = 0x1234567890abcdefull;
    wait.timeout_ms = 1000;
    put("grpc_requests", "wait_ready", 0x01, &wait.base);
    Fluxion__Decode__V1__GetSessionRequest get = FLUXION__DECODE__V1__GET_SESSION_REQUEST__INIT;
    get.session_id = 42;
    put("grpc_requests", "get_session", 0x02, &get.base);
    Fluxion__Decode__V1__SamplingParams samp = FLUXION__DECODE__V1__SAMPLING_PARAMS__INIT;
    samp.temperature = 0.7f;
    samp.top_k = 40;
    samp.top_p = 0.9f;
    samp.seed = 7;
    int32_t stops[2] = {2, 49151};
    Fluxion__Decode__V1__StopConditions stop = FLUXION__DECODE__V1__STOP_CONDITIONS__INIT;
    stop.max_new_tokens = 32;
    stop.stop_token_ids = stops;
    stop.n_stop_token_ids = 2;
    Fluxion__Decode__V1__GenerateRequest gen = FLUXION__DECODE__V1__GENERATE_REQUEST__INIT;
    gen.session_id = 42;
    gen.sampling = &samp;
    gen.stop = &stop;
    put("grpc_requests", "generate", 0x03, &gen.base);
    Fluxion__Decode__V1__CloseSessionRequest close = FLUXION__DECODE__V1__CLOSE_SESSION_REQUEST__INIT;
    close.session_id = 42;
    put("grpc_requests", "close_session", 0x04, &close.base);
    Fluxion__Decode__V1__NodeStatusRequest status = FLUXION__DECODE__V1__NODE_STATUS_REQUEST__INIT;
    put("grpc_requests", "node_status", 0x05, &status.base);
    /* the answers a prefill node reads (fuzz_prefill_replies: byte 0 bit 0 picks OpenSession) */
    Fluxion__Decode__V1__NodeStatusResponse nsr = FLUXION__DECODE__V1__NODE_STATUS_RESPONSE__INIT;
    nsr.model_id = (char *)"smollm2-135m-instruct";
    nsr.version = (char *)"0.1.0";
    nsr.shape = &shape;
    nsr.max_prompt_len = 8192;
    nsr.max_new_tokens = 4096;
    put("prefill_replies", "node_status", 0x00, &nsr.base);
    uint8_t token[16];
    for (int i = 0; i < 16; i++) token[i] = (uint8_t)(17 * i + 3);
    Fluxion__Decode__V1__UcxEndpoint ep = FLUXION__DECODE__V1__UCX_ENDPOINT__INIT;
    ep.listener_host = (char *)"127.0.0.1";
    ep.listener_port = 40123;
    Fluxion__Decode__V1__OpenSessionResponse osr = FLUXION__DECODE__V1__OPEN_SESSION_RESPONSE__INIT;
    osr.session_id = 0x100000001ull;
    osr.transfer_token.data = token;
    osr.transfer_token.len = 16;
    osr.ucx = &ep;
    osr.transfer_deadline_unix_ms = 1795581319000;
    osr.reserved_bytes = 1u << 26;
    put("prefill_replies", "open_session_ucx", 0x01, &osr.base);
    osr.ucx = NULL;   /* a node running --prefill local: refused, named */
    put("prefill_replies", "open_session_local", 0x01, &osr.base);
    Grpc__Health__V1__HealthCheckRequest health = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    health.service = (char *)"fluxion.decode.v1.DecodeNode";
    put("grpc_requests", "health", 0x06, &health.base);

    flx_node_config_t c;
    flx_node_config_default(&c);
    flx_node_config_set(&c, "model", "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    size_t need = flx_node_config_format(&c, NULL, 0);
    char *text = malloc(need + 1);
    flx_node_config_format(&c, text, need + 1);
    put_text("printed", text);
    free(text);
    put_text("commented", "# decode node on a cluster host\n"
                          "model = /models/smollm2.gguf\r\n"
                          "weights = bf16\n"
                          "model-id = smollm2\n"
                          "\tgrpc-listen = 0.0.0.0:50051\n"
                          "metrics-listen = off\n"
                          "kv-capacity = 64G\n"
                          "numa-node = -1\n"
                          "max-message-bytes = 4M\n"
                          "prefill = ucx\n");
    return 0;
}
