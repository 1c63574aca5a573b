/*
 * flx/node_service.h - the gRPC control service of the decode node: fluxion.decode.v1.DecodeNode
 * and grpc.health.v1.Health on a flx/rpc.h server, in front of a flx/node.h node.
 *
 * OVERVIEW
 * flx_node_service_create binds the handlers to a node and gives the method table to hand to
 * flx_rpc_server_create. Every handler reads its request through the parse function of its type
 * below (protobuf-c unpack, then every field checked against the node's limits), answers refusals
 * with the status the node's error maps to (flx_rpc_status_code) and a message naming the field,
 * and calls the node. WaitReady and Generate keep their call until the node answers (on its decode
 * thread); a client that cancels sets the call's flag and wakes the node, which ends the call at
 * its next step.
 *
 * REQUEST CHECKS (what the parse functions refuse, all FLX_ERR_INVALID unless said)
 *   any          bytes that are not the message (FLX_ERR_FORMAT); session_id 0
 *   OpenSession  model_id other than the node's; shape missing or not the model's; prompt_len or
 *                max_new_tokens 0 or above the node's limit; kv_dtype not BF16; attention missing,
 *                its mode unspecified, FIXED with blk not in {16, 32, 64, 128} or budget outside
 *                [0, 1], FLUXION with tau outside [0, 1) or on a node without predictor; timeouts
 *                above an hour; local_prefill present on a ucx node, missing on a local one, of
 *                another length than prompt_len or with ids outside the vocabulary
 *   WaitReady    timeout_ms above an hour
 *   Generate     temperature negative, non-finite or above 1e6; top_p outside [0, 1]; more stop
 *                ids than the node allows or ids outside the vocabulary; max_new_tokens above
 *                the node's limit
 *   Health       service name longer than 256 bytes
 * A parsed message is freed with the protobuf-c free_unpacked function of its type.
 *
 * THREAD MODE
 * The handlers run on the server's polling threads and the node's decode thread; create/destroy
 * from one thread, destroy after the rpc server is destroyed.
 */
#ifndef FLX_NODE_SERVICE_H
#define FLX_NODE_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "flx/node.h"
#include "flx/rpc.h"
#include "flx/status.h"
#include "fluxion/decode/v1/decode.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_SVC_PREFIX "/fluxion.decode.v1.DecodeNode/"
#define FLX_SVC_HEALTH_PREFIX "/grpc.health.v1.Health/"

typedef struct flx_node_service *flx_node_service_h;

flx_status_t flx_node_service_create(flx_node_h node, flx_node_service_h *svc_p);
/* The method table (DecodeNode's six methods, Health's Check and Watch), valid until destroy. */
const flx_rpc_method_t *flx_node_service_methods(flx_node_service_h svc, uint32_t *n_p);
/* Health turns NOT_SERVING: Check answers it, Watch streams send it. Call with flx_node_drain. */
void flx_node_service_drain(flx_node_service_h svc);
/* Ends the Health Watch streams still open (call before flx_rpc_server_destroy). */
void flx_node_service_shutdown(flx_node_service_h svc);
void flx_node_service_destroy(flx_node_service_h svc);

/* ---- request parsing: unpack + checks (what the handlers and the fuzz target call) ---- */

flx_status_t flx_svc_parse_open_session(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                        Fluxion__Decode__V1__OpenSessionRequest **req_p);
flx_status_t flx_svc_parse_wait_ready(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                      Fluxion__Decode__V1__WaitReadyRequest **req_p);
flx_status_t flx_svc_parse_get_session(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                       Fluxion__Decode__V1__GetSessionRequest **req_p);
flx_status_t flx_svc_parse_generate(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                    Fluxion__Decode__V1__GenerateRequest **req_p);
flx_status_t flx_svc_parse_close_session(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                         Fluxion__Decode__V1__CloseSessionRequest **req_p);
flx_status_t flx_svc_parse_node_status(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                       Fluxion__Decode__V1__NodeStatusRequest **req_p);
flx_status_t flx_svc_parse_health(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                  Grpc__Health__V1__HealthCheckRequest **req_p);

#ifdef __cplusplus
}
#endif
#endif
