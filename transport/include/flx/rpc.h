/*
 * flx/rpc.h - gRPC on gRPC core's completion queues, for protobuf-c services: a server that
 * dispatches calls by method path to handlers, and a small blocking client.
 *
 * OVERVIEW (server)
 * A server listens on one address and owns one completion queue polled by n_threads threads.
 * Every incoming call is requested with grpc_server_request_call and looked up by its method path
 * ("/package.Service/Method") in the method table; an unknown path ends UNIMPLEMENTED. The server
 * reads the call's single request message (one larger than max_recv_bytes is refused by gRPC core
 * with RESOURCE_EXHAUSTED before any handler sees it) and calls the method's handler on a polling
 * thread with the request bytes. From then on the handler's side OWNS the call and must end it
 * exactly once, from any thread, at any later time:
 *
 *   flx_rpc_reply(call, msg, len)           unary success: the response and status OK
 *   flx_rpc_send(call, msg, len)            server streaming: one more message (copied, queued,
 *                                           sent in order, one in flight at a time)
 *   flx_rpc_finish(call, st, fmt, ...)      the end: status OK when st == FLX_OK, else the code
 *                                           flx_rpc_status_code(st) maps it to, with the message
 *                                           "<flx_status_name(st)>: <formatted text>"
 *
 * The call must not be touched after its reply or finish. Handlers must not block (they run on a
 * polling thread): a call that waits (for a session to become READY, for tokens) is kept by its
 * owner and ended later.
 *
 * CANCELLATION AND DEADLINES
 * When the client cancels, disconnects or its deadline passes, gRPC core closes the call;
 * flx_rpc_call_cancelled() turns 1 and the call's on_cancel (flx_rpc_call_on_cancel) runs once on
 * a polling thread. The owner still ends the call (flx_rpc_finish; nothing reaches the client any
 * more). on_cancel must only signal the owner (set a flag, wake a thread): it must not call into
 * this API nor take a lock that the owner holds while calling flx_rpc_finish; flx_rpc_finish waits
 * for an on_cancel that is running to return, so after finish on_cancel never runs.
 * flx_rpc_call_deadline_ns() is the call's deadline on flx_now_ns()'s clock (UINT64_MAX: none).
 *
 * STATUS
 * flx_rpc_status_code() is the one translation of flx_status_t into gRPC status codes.
 *
 * SHUTDOWN
 * flx_rpc_server_shutdown() stops accepting calls (new ones are refused by gRPC core, the health
 * of the node is the caller's business); calls in flight continue. flx_rpc_server_destroy() waits
 * until every call was ended by its owner (cancelling all calls at gRPC level after grace_ms, so
 * clients see them end), then tears the server down. Owners must end their calls: destroy waits
 * for them.
 *
 * THREAD MODE
 * Server: create / shutdown / destroy from one thread; the call functions are thread-safe (one
 * owner per call). Client: one client may be used by several threads at once; a stream by one
 * thread at a time.
 */
#ifndef FLX_RPC_H
#define FLX_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gRPC status codes (the values of grpc_status_code, which this header does not include). */
enum {
    FLX_RPC_OK = 0,
    FLX_RPC_CANCELLED = 1,
    FLX_RPC_UNKNOWN = 2,
    FLX_RPC_INVALID_ARGUMENT = 3,
    FLX_RPC_DEADLINE_EXCEEDED = 4,
    FLX_RPC_NOT_FOUND = 5,
    FLX_RPC_ALREADY_EXISTS = 6,
    FLX_RPC_PERMISSION_DENIED = 7,
    FLX_RPC_RESOURCE_EXHAUSTED = 8,
    FLX_RPC_FAILED_PRECONDITION = 9,
    FLX_RPC_ABORTED = 10,
    FLX_RPC_OUT_OF_RANGE = 11,
    FLX_RPC_UNIMPLEMENTED = 12,
    FLX_RPC_INTERNAL = 13,
    FLX_RPC_UNAVAILABLE = 14,
    FLX_RPC_DATA_LOSS = 15,
    FLX_RPC_UNAUTHENTICATED = 16,
};

/* flx_status_t -> gRPC status code (the one place this mapping lives):
 *   OK -> OK; INVALID, FORMAT -> INVALID_ARGUMENT; NOT_FOUND -> NOT_FOUND;
 *   CAPACITY, NOMEM -> RESOURCE_EXHAUSTED; STATE, NO_DEVICE -> FAILED_PRECONDITION;
 *   DUPLICATE -> ALREADY_EXISTS; TIMEOUT -> DEADLINE_EXCEEDED; CANCELED -> CANCELLED;
 *   UNAVAILABLE -> UNAVAILABLE; UNSUPPORTED -> UNIMPLEMENTED; IO, DEVICE, INTERNAL and anything
 *   else -> INTERNAL. */
int flx_rpc_status_code(flx_status_t st);
/* "OK", "INVALID_ARGUMENT", ...; never NULL. */
const char *flx_rpc_code_name(int code);

/* ---- server ---- */

typedef struct flx_rpc_server *flx_rpc_server_h;
typedef struct flx_rpc_call *flx_rpc_call_h;

/* Called on a polling thread with the request bytes (valid during the call only). */
typedef void (*flx_rpc_handler_fn)(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len);

typedef struct flx_rpc_method {
    const char *path;            /* "/fluxion.decode.v1.DecodeNode/OpenSession" (borrowed) */
    flx_rpc_handler_fn handler;
    void *ctx;
} flx_rpc_method_t;

enum {
    FLX_RPC_SERVER_FIELD_LISTEN = 1u << 0,
    FLX_RPC_SERVER_FIELD_METHODS = 1u << 1,
    FLX_RPC_SERVER_FIELD_MAX_RECV = 1u << 2,
    FLX_RPC_SERVER_FIELD_MAX_SEND = 1u << 3,
    FLX_RPC_SERVER_FIELD_THREADS = 1u << 4,
};

typedef struct flx_rpc_server_params {
    uint64_t field_mask;            /* FLX_RPC_SERVER_FIELD_* */
    const char *listen;             /* "host:port", port 0 = any free port (required) */
    const flx_rpc_method_t *methods; /* (n_methods), copied at create (required) */
    uint32_t n_methods;
    size_t max_recv_bytes;          /* largest request message; default 4 MiB */
    size_t max_send_bytes;          /* largest response message; default 4 MiB */
    uint32_t n_threads;             /* completion-queue threads, 1..64; default 2 */
} flx_rpc_server_params_t;

/* Binds, starts the server and its threads. FLX_ERR_INVALID for bad params (naming the field),
 * FLX_ERR_IO when the address cannot be bound (naming it). */
flx_status_t flx_rpc_server_create(const flx_rpc_server_params_t *params, flx_rpc_server_h *server_p);
/* The bound TCP port. */
int flx_rpc_server_port(flx_rpc_server_h server);
/* Calls accepted and not yet ended by their owner (for drains and tests). */
uint32_t flx_rpc_server_n_calls(flx_rpc_server_h server);
/* Stops accepting calls; calls in flight go on. Idempotent. */
void flx_rpc_server_shutdown(flx_rpc_server_h server);
/* Shuts down (if not yet), waits up to grace_ms for the calls to end, then cancels the rest at
 * gRPC level and waits for their owners to end them, then frees everything. Accepts NULL. */
void flx_rpc_server_destroy(flx_rpc_server_h server, uint32_t grace_ms);

flx_status_t flx_rpc_reply(flx_rpc_call_h call, const void *msg, size_t len);
flx_status_t flx_rpc_send(flx_rpc_call_h call, const void *msg, size_t len);
/* The message is formatted as "<flx_status_name(st)>: <text>" for errors (truncated to 512 bytes);
 * for st == FLX_OK it is ignored. Returns FLX_OK (the call is ended in every case). */
flx_status_t flx_rpc_finish(flx_rpc_call_h call, flx_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

int flx_rpc_call_cancelled(flx_rpc_call_h call);
uint64_t flx_rpc_call_deadline_ns(flx_rpc_call_h call);
/* The method path of the call (valid while the call is owned). */
const char *flx_rpc_call_method(flx_rpc_call_h call);
/* The client's address ("ipv4:127.0.0.1:41234"), copied into buf. */
void flx_rpc_call_peer(flx_rpc_call_h call, char *buf, size_t cap);
/* Registers fn(ctx), run once when the call is cancelled (see CANCELLATION). Returns 1 when the
 * call is already cancelled (fn is then not registered and will not run), else 0. */
int flx_rpc_call_on_cancel(flx_rpc_call_h call, void (*fn)(void *ctx), void *ctx);

/* ---- client ---- */

typedef struct flx_rpc_client *flx_rpc_client_h;
typedef struct flx_rpc_stream *flx_rpc_stream_h;

/* How a call ended: the gRPC status code and its message. */
typedef struct flx_rpc_result {
    int code;                 /* FLX_RPC_* */
    char msg[512];
} flx_rpc_result_t;

/* target: "host:port" (insecure channel). max_recv_bytes 0 = gRPC's default (4 MiB). */
flx_status_t flx_rpc_client_create(const char *target, size_t max_recv_bytes, flx_rpc_client_h *client_p);
void flx_rpc_client_destroy(flx_rpc_client_h client);

/* A unary call with a timeout (0 = none). Returns FLX_OK when the call completed, whatever its
 * status (in res); on res->code == OK, *resp_p (malloc'd, free() it) and *resp_len_p hold the
 * response. Local failures (NULL args, out of memory) return an error and write nothing. */
flx_status_t flx_rpc_unary(flx_rpc_client_h client, const char *method, const void *req, size_t len,
                           uint32_t timeout_ms, void **resp_p, size_t *resp_len_p, flx_rpc_result_t *res);

/* A server-streaming call: starts it and sends the request. */
flx_status_t flx_rpc_stream_open(flx_rpc_client_h client, const char *method, const void *req, size_t len,
                                 uint32_t timeout_ms, flx_rpc_stream_h *stream_p);
/* Next message: 1 with *msg_p (malloc'd) and *len_p; 0 at the end of the stream (then res holds
 * the status). Errors for local failures. */
flx_status_t flx_rpc_stream_next(flx_rpc_stream_h stream, void **msg_p, size_t *len_p, flx_rpc_result_t *res);
/* Cancels the call (the server sees it cancelled); next then ends with CANCELLED. */
void flx_rpc_stream_cancel(flx_rpc_stream_h stream);
/* Cancels if still running, waits for the status, frees. Accepts NULL. */
void flx_rpc_stream_close(flx_rpc_stream_h stream);

#ifdef __cplusplus
}
#endif
#endif
