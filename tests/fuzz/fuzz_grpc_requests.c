/*
 * fuzz_grpc_requests - bytes as every request of the decode node's control service, through the
 * functions the gRPC handlers call (flx_svc_parse_*: protobuf-c unpack, then the field checks
 * against the node's limits). The first byte picks the request type and the node's limits (ucx or
 * local prefill, with or without a predictor); the rest is the message. A request that parses must
 * pack again to its packed size (protobuf-c reads every field it kept), every repeated field the
 * checks let through is walked to its end, and every refusal leaves a message. (Re-unpacking is not
 * a property: protobuf-c keeps unknown fields verbatim, field number 0 included, and refuses those
 * on a second unpack; the node never re-packs a request.)
 */
#include "fuzz_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/log.h"
#include "flx/node_service.h"

static void repack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(n ? n : 1);
    FUZZ_CHECK(b);
    FUZZ_CHECK(protobuf_c_message_pack(m, b) == n);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    flx_log_set_level(FLX_LOG_ERROR);
    if (size < 1)
        return 0;
    const uint8_t sel = data[0];
    data++;
    size--;
    flx_node_limits_t l;
    memset(&l, 0, sizeof l);
    snprintf(l.model_id, sizeof l.model_id, "smollm2");
    l.n_layers = 30;
    l.n_kv_heads = 3;
    l.n_q_heads = 9;
    l.head_dim = 64;
    l.vocab = 49152;
    l.max_prompt_len = 8192;
    l.max_new_tokens = 4096;
    l.max_stop_ids = 14;
    l.max_timeout_ms = 3600000;
    l.prefill = sel & 0x40 ? FLX_NODE_PREFILL_LOCAL : FLX_NODE_PREFILL_UCX;
    l.has_predictor = !(sel & 0x80);
    ProtobufCMessage *m = NULL;
    flx_status_t st;
    switch (sel & 7) {
    case 0: {
        Fluxion__Decode__V1__OpenSessionRequest *r;
        if ((st = flx_svc_parse_open_session(data, size, &l, &r)) == FLX_OK) {
            FUZZ_CHECK(r->shape && r->attention && r->prompt_len >= 1 && r->prompt_len <= l.max_prompt_len);
            if (r->local_prefill) {
                FUZZ_CHECK(r->local_prefill->n_token_ids == r->prompt_len);
                for (size_t i = 0; i < r->local_prefill->n_token_ids; i++)
                    FUZZ_CHECK((uint32_t)r->local_prefill->token_ids[i] < l.vocab);
            }
            m = &r->base;
        }
        break;
    }
    case 1: {
        Fluxion__Decode__V1__WaitReadyRequest *r;
        if ((st = flx_svc_parse_wait_ready(data, size, &l, &r)) == FLX_OK) m = &r->base;
        break;
    }
    case 2: {
        Fluxion__Decode__V1__GetSessionRequest *r;
        if ((st = flx_svc_parse_get_session(data, size, &l, &r)) == FLX_OK) m = &r->base;
        break;
    }
    case 3: {
        Fluxion__Decode__V1__GenerateRequest *r;
        if ((st = flx_svc_parse_generate(data, size, &l, &r)) == FLX_OK) {
            FUZZ_CHECK(r->session_id != 0);
            if (r->stop)
                for (size_t i = 0; i < r->stop->n_stop_token_ids; i++)
                    FUZZ_CHECK((uint32_t)r->stop->stop_token_ids[i] < l.vocab);
            m = &r->base;
        }
        break;
    }
    case 4: {
        Fluxion__Decode__V1__CloseSessionRequest *r;
        if ((st = flx_svc_parse_close_session(data, size, &l, &r)) == FLX_OK) m = &r->base;
        break;
    }
    case 5: {
        Fluxion__Decode__V1__NodeStatusRequest *r;
        if ((st = flx_svc_parse_node_status(data, size, &l, &r)) == FLX_OK) m = &r->base;
        break;
    }
    default: {
        Grpc__Health__V1__HealthCheckRequest *r;
        if ((st = flx_svc_parse_health(data, size, &l, &r)) == FLX_OK) m = &r->base;
        break;
    }
    }
    if (m) {
        repack(m);
        protobuf_c_message_free_unpacked(m, NULL);
    } else {
        FUZZ_CHECK(st < 0 && flx_error_msg()[0] != '\0');   /* every refusal says why */
    }
    return 0;
}
